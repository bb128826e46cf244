//! Registering a node with its devices, and its heartbeats (which also renew the leases of the placements
//! whose ranks it holds).

use axum::extract::State;
use axum::Json;
use ringtrain_core::memory::human_bytes;
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{FieldError, NodeId};
use ringtrain_protocol::{HeartbeatAck, RegisterNode, SelfTestReport};
use ringtrain_store::{Device, NewDevice, Node, NodeRegistration};

use crate::auth::Agent;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, JsonBody};
use crate::state::AppState;

const MAX_DEVICES: usize = 1024;

/// More memory than any one device has (16 TiB): a bigger claim is a lie that would disable the server's
/// memory check for everyone, since it compares a job with the largest device of its kind.
const MAX_MEMORY_BYTES: u64 = 16 << 40;

/// Device names and addresses are shown to every tenant on `/v1/nodes`: short, one line.
const MAX_TEXT_CHARS: usize = 200;

/// Whether `text` is at most `MAX_TEXT_CHARS` characters, without control characters.
fn is_short_line(text: &str) -> bool {
    text.chars().count() <= MAX_TEXT_CHARS && !text.chars().any(char::is_control)
}

fn short_line_reason() -> String {
    format!("must be at most {MAX_TEXT_CHARS} characters, without control characters")
}

/// Checks a registration and turns it into the store's, naming every field that is wrong.
fn registration(body: RegisterNode) -> Result<NodeRegistration, Vec<FieldError>> {
    let mut errors = Vec::new();
    if body.name.trim().is_empty() || body.name.len() > 255 || body.name.chars().any(char::is_control) {
        errors.push(FieldError::new("name", "must be 1 to 255 characters without control characters"));
    }
    if body.address.as_deref().is_some_and(|address| !is_short_line(address)) {
        errors.push(FieldError::new("address", short_line_reason()));
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
        if !is_short_line(&device.name) {
            errors.push(FieldError::new(format!("devices[{i}].name"), short_line_reason()));
        }
        let memory_bytes = device.memory_bytes.filter(|&m| m <= MAX_MEMORY_BYTES).map(i64::try_from).transpose();
        if device.memory_bytes.is_some_and(|m| m > MAX_MEMORY_BYTES) || memory_bytes.is_err() {
            errors.push(FieldError::new(
                format!("devices[{i}].memory_bytes"),
                format!("must be at most 16 TiB ({MAX_MEMORY_BYTES} bytes)"),
            ));
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

/// How a re-registration's device goes beyond what the node was registered with; None when it does not.
fn beyond_registered(registered: &[Device], offered: &NewDevice) -> Option<String> {
    let index = offered.index;
    let Some(was) = registered.iter().find(|d| d.index == index) else {
        return Some(format!("device {index} was not registered"));
    };
    if was.kind != offered.kind {
        return Some(format!("device {index} was registered as {}, not {}", was.kind.as_str(), offered.kind.as_str()));
    }
    // CPU slots share one machine's memory: their total is checked instead (`cpu_memory_beyond`)
    if offered.kind == DeviceKind::Cpu {
        return None;
    }
    match (was.memory_bytes, offered.memory_bytes) {
        (Some(was), Some(now)) if now > was => Some(format!(
            "device {index} claims {} of memory, more than the {} it was registered with",
            bytes(now),
            bytes(was)
        )),
        (None, Some(now)) => {
            Some(format!("device {index} claims {} of memory; it was registered without any", bytes(now)))
        }
        _ => None,
    }
}

/// Exact too: a rounded size can read the same on both sides.
fn bytes(b: i64) -> String {
    format!("{} ({b} bytes)", human_bytes(b.max(0) as u64))
}

/// How a re-registration's CPU slots claim more memory in all than the node's CPU slots have now; None
/// when they do not. Each slot's figure is its share of the machine, so an agent restarted with fewer
/// `--cpus` gives each slot more: that is the same machine, not a raise.
fn cpu_memory_beyond(current: &[Device], offered: &[NewDevice]) -> Option<String> {
    let claims: Vec<i64> =
        offered.iter().filter(|d| d.kind == DeviceKind::Cpu).filter_map(|d| d.memory_bytes).collect();
    if claims.is_empty() {
        return None;
    }
    let claimed: i64 = claims.iter().sum();
    // None when a slot of the node says no memory: then any claim is a raise
    let now: Option<i64> = current.iter().filter(|d| d.kind == DeviceKind::Cpu).map(|d| d.memory_bytes).sum();
    match now {
        Some(now) if claimed <= now => None,
        Some(now) => Some(format!(
            "the CPU slots claim {} of memory in all, more than the {} the node's slots have now",
            bytes(claimed),
            bytes(now)
        )),
        None => Some(format!("the CPU slots claim {} of memory; the node's slots have none said", bytes(claimed))),
    }
}

/// A re-registration may keep or reduce the node's devices (same index and kind, no more memory; CPU slots
/// no more memory in all), never add or change them: otherwise a stolen agent token could make its node
/// attract every tenant's work (security review 3, N-M6). A device retired by an earlier re-registration
/// may come back.
fn within_registered(registered: &[Device], current: &[Device], offered: &[NewDevice]) -> ApiResult<()> {
    const SHOWN: usize = 3;
    let beyond: Vec<String> = offered
        .iter()
        .filter_map(|d| beyond_registered(registered, d))
        .chain(cpu_memory_beyond(current, offered))
        .collect();
    if beyond.is_empty() {
        return Ok(());
    }
    let mut named = beyond.iter().take(SHOWN).cloned().collect::<Vec<_>>().join("; ");
    if beyond.len() > SHOWN {
        named.push_str(&format!("; and {} more", beyond.len() - SHOWN));
    }
    Err(ApiError::field(
        ProblemType::Conflict,
        "devices",
        format!(
            "{named}: a re-registration may keep or reduce the node's devices, not add or change them; for that a \
             platform admin must remove the node first (revoke this agent token; the node then registers under a \
             new name with a new token)"
        ),
    ))
}

/// Register (or re-register) this agent's node and its devices. An agent token belongs to one node: the
/// first name it registers is the only one it may use (a stolen token cannot add nodes to the pool), and
/// a re-registration may keep or reduce the devices it first registered, not add to them or change them.
#[utoipa::path(post, path = "/v1/agent/nodes", tag = "agent", request_body = RegisterNode,
    responses((status = 200, body = Node), (status = 403),
        (status = 409, description = "The name belongs to another agent, this token to another node, or the devices go beyond those the node was registered with"),
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
    if let Some(node) = nodes.iter().find(|n| n.agent_token_id == agent.token.id) {
        within_registered(&state.store.registered_devices(node.id).await?, &node.devices, &registration.devices)?;
    }
    let node = state.store.register_node(agent.token.id, registration).await?;
    state.largest_memory.forget();
    Ok(Json(node))
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

/// The longest reason a quarantine keeps (a self-test's details, or an admin's words).
const MAX_REASON_CHARS: usize = 1000;

/// A reason cut to [`MAX_REASON_CHARS`], one line.
pub fn quarantine_reason(text: &str) -> String {
    let line: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    line.chars().take(MAX_REASON_CHARS).collect()
}

/// The node's self-test (`ringtrain self-test`, run by its agent at start and while idle). A failed check
/// sets the node aside: no new placements until a platform admin lifts it (`DELETE
/// /v1/nodes/{id}/quarantine`); a passed one lifts nothing.
#[utoipa::path(post, path = "/v1/agent/nodes/{id}/self-test", tag = "agent", params(("id" = Uuid, Path)),
    request_body = SelfTestReport,
    responses((status = 200, body = Node, description = "The node, with its quarantine if the test failed"),
        (status = 404), (status = 422)),
    security(("bearer" = [])))]
pub async fn self_test(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<NodeId>,
    JsonBody(report): JsonBody<SelfTestReport>,
) -> ApiResult<Json<Node>> {
    let node = state.store.get_node(id).await?.filter(|n| n.agent_token_id == agent.token.id);
    let Some(node) = node else { return Err(ApiError::not_found(format!("no node {id} of this agent"))) };
    if report.checks.is_empty() || report.checks.len() > 16 {
        return Err(ApiError::validation(vec![FieldError::new("checks", "must hold 1 to 16 checks")]));
    }
    let Some(failure) = report.failure() else { return Ok(Json(node)) };
    let reason = quarantine_reason(&format!("its self-test failed: {failure}"));
    if state.store.set_quarantine(id, Some(&reason)).await? {
        tracing::warn!(node = %node.name, %reason, "node quarantined");
        state.changed().await;
    }
    let node = state.store.get_node(id).await?.ok_or_else(|| ApiError::not_found(format!("no node {id}")))?;
    Ok(Json(node))
}
