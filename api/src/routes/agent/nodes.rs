//! Registering a node with its devices, and its heartbeats (which also renew the leases of the placements
//! whose ranks it holds).

use axum::extract::State;
use axum::Json;
use ringtrain_core::{FieldError, NodeId};
use ringtrain_protocol::{HeartbeatAck, RegisterNode};
use ringtrain_store::{NewDevice, Node, NodeRegistration};

use crate::auth::Agent;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, JsonBody};
use crate::state::AppState;

const MAX_DEVICES: usize = 1024;

/// Checks a registration and turns it into the store's, naming every field that is wrong.
fn registration(body: RegisterNode) -> Result<NodeRegistration, Vec<FieldError>> {
    let mut errors = Vec::new();
    if body.name.trim().is_empty() || body.name.len() > 255 || body.name.chars().any(char::is_control) {
        errors.push(FieldError::new("name", "must be 1 to 255 characters without control characters"));
    }
    if body.devices.len() > MAX_DEVICES {
        errors.push(FieldError::new("devices", format!("at most {MAX_DEVICES} devices")));
    }
    let mut seen = std::collections::HashSet::new();
    let mut devices = Vec::with_capacity(body.devices.len());
    for (i, device) in body.devices.into_iter().enumerate() {
        if !seen.insert(device.index) {
            errors
                .push(FieldError::new(format!("devices[{i}].index"), format!("index {} appears twice", device.index)));
        }
        let index = i32::try_from(device.index);
        if index.is_err() {
            errors.push(FieldError::new(format!("devices[{i}].index"), "too large"));
        }
        let kind = device.kind.parse();
        if kind.is_err() {
            errors.push(FieldError::new(format!("devices[{i}].kind"), "must be cpu or gpu"));
        }
        let memory_bytes = device.memory_bytes.map(i64::try_from).transpose();
        if memory_bytes.is_err() {
            errors.push(FieldError::new(format!("devices[{i}].memory_bytes"), "too large"));
        }
        if let (Ok(index), Ok(kind), Ok(memory_bytes)) = (index, kind, memory_bytes) {
            devices.push(NewDevice { index, kind, name: device.name, memory_bytes });
        }
    }
    if errors.is_empty() {
        Ok(NodeRegistration { name: body.name, address: body.address, devices })
    } else {
        Err(errors)
    }
}

/// Register (or re-register) this agent's node and its devices. An agent token belongs to one node: the
/// first name it registers is the only one it may use (a stolen token cannot add nodes to the pool).
#[utoipa::path(post, path = "/v1/agent/nodes", tag = "agent", request_body = RegisterNode,
    responses((status = 200, body = Node), (status = 403),
        (status = 409, description = "The name belongs to another agent, or this token to another node"),
        (status = 422)),
    security(("bearer" = [])))]
pub async fn register_node(
    State(state): State<AppState>,
    agent: Agent,
    JsonBody(body): JsonBody<RegisterNode>,
) -> ApiResult<Json<Node>> {
    let registration = registration(body).map_err(ApiError::validation)?;
    let nodes = state.store.list_nodes().await?;
    if let Some(bound) = nodes.iter().find(|n| n.agent_token_id == agent.token.id && n.name != registration.name) {
        return Err(ApiError::conflict(format!(
            "this agent token belongs to node {:?}: every node needs its own agent token",
            bound.name
        )));
    }
    Ok(Json(state.store.register_node(agent.token.id, registration).await?))
}

/// The node is alive.
#[utoipa::path(post, path = "/v1/agent/nodes/{id}/heartbeat", tag = "agent", params(("id" = Uuid, Path)),
    responses((status = 200, body = HeartbeatAck),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn heartbeat(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<NodeId>,
) -> ApiResult<Json<HeartbeatAck>> {
    if !state.store.heartbeat(id, agent.token.id).await? {
        return Err(ApiError::not_found(format!("no node {id} of this agent")));
    }
    // The agent is alive, so the placements of the ranks it holds are too.
    state.store.renew_node_leases(id, state.config.lease).await?;
    Ok(Json(HeartbeatAck { node_id: id, at: ringtrain_store::now() }))
}
