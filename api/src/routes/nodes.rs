//! GET /v1/nodes: the worker pool, each device with who holds it (the answer's types are
//! `ringtrain_views::nodes`, which the client reads).
//!
//! What a team may see of others: which *team* holds a device, never which job. Sharing a pool is only fair
//! when everyone can see where its devices went (the same as Slurm's `squeue` showing every account), but a
//! job's name and id can say what a team works on, so they are shown to its own team (and platform admins).

use std::collections::HashMap;

use axum::extract::State;
use axum::Json;
use ringtrain_core::{FieldError, NodeId, TeamId};
use ringtrain_scheduler::DeviceSlot;
use ringtrain_store::{Device, Node};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, JsonBody};
use crate::state::AppState;

pub use ringtrain_views::nodes::{DeviceHolder, DeviceView, NodeList, NodeQuarantine, NodeUse, NodeView};

/// The worker pool: nodes, their devices, and which team (and, for your own team, which job and rank) holds
/// each device now (any user token).
#[utoipa::path(get, path = "/v1/nodes", tag = "teams",
    responses((status = 200, body = NodeList),
        (status = 401)),
    security(("bearer" = [])))]
pub async fn list_nodes(State(state): State<AppState>, user: User) -> ApiResult<Json<NodeList>> {
    let nodes = state.store.list_nodes().await?;
    let holders = holders(&state, &user).await?;
    let uses = crate::system_now::per_node(&state.system_now.live_rank_use(state.store.as_ref()).await?);
    let view = |node: Node| NodeView {
        ranks_use: uses.get(&node.id).map(|&(cpu_cores, resident_bytes)| NodeUse { cpu_cores, resident_bytes }),
        quarantine: node.quarantine.clone().map(|reason| NodeQuarantine { reason, since: node.quarantined_at }),
        id: node.id,
        name: node.name,
        address: node.address,
        state: node.state.to_string(),
        registered_at: node.registered_at,
        last_heartbeat: node.last_heartbeat,
        devices: node
            .devices
            .into_iter()
            .map(|device: Device| {
                let slot = DeviceSlot { node: node.id, index: u32::try_from(device.index).unwrap_or(u32::MAX) };
                DeviceView {
                    id: device.id,
                    index: device.index,
                    kind: device.kind.to_string(),
                    name: device.name,
                    memory_bytes: device.memory_bytes,
                    held_by: holders.get(&slot).cloned(),
                }
            })
            .collect(),
    };
    Ok(Json(NodeList { nodes: nodes.into_iter().map(view).collect() }))
}

/// Who holds each busy device, from the same view of the cluster the scheduler's next pass reads.
async fn holders(state: &AppState, user: &User) -> ApiResult<HashMap<DeviceSlot, DeviceHolder>> {
    let insight = state.queue_insight().await?;
    let team_names: HashMap<TeamId, String> =
        state.store.list_teams().await?.into_iter().map(|t| (t.id, t.name)).collect();
    let mut holders = HashMap::new();
    for running in &insight.read.view.running {
        let visible = user.owns(running.team) || user.is_platform_admin();
        let job_name = match visible {
            true => state.store.get_job(running.id).await?.and_then(|job| job.name),
            false => None,
        };
        for (rank, slot) in running.devices.iter().enumerate() {
            let holder = DeviceHolder {
                team_id: running.team,
                team_name: team_names.get(&running.team).cloned().unwrap_or_default(),
                job_id: visible.then_some(running.id),
                job_name: job_name.clone(),
                rank: visible.then_some(rank as u32),
            };
            holders.insert(*slot, holder);
        }
    }
    Ok(holders)
}

/// Why a platform admin sets a node aside.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuarantineBody {
    /// Shown with the node (1 to 1,000 characters).
    pub reason: String,
}

fn platform_admin(user: &User) -> ApiResult<()> {
    match user.is_platform_admin() {
        true => Ok(()),
        false => Err(ApiError::forbidden("only a platform admin sets a node aside or lifts its quarantine")),
    }
}

/// Sets a node aside: no new placements on it (its running ones go on) until it is lifted. 409 when it is
/// already (the first reason stays).
#[utoipa::path(post, path = "/v1/nodes/{id}/quarantine", tag = "teams", params(("id" = Uuid, Path)),
    request_body = QuarantineBody,
    responses((status = 200, body = NodeView), (status = 403), (status = 404), (status = 409), (status = 422)),
    security(("bearer" = [])))]
pub async fn quarantine_node(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<NodeId>,
    JsonBody(body): JsonBody<QuarantineBody>,
) -> ApiResult<Json<NodeView>> {
    platform_admin(&user)?;
    let reason = body.reason.trim();
    if reason.is_empty() || reason.chars().count() > 1000 {
        return Err(ApiError::validation(vec![FieldError::new("reason", "must be 1 to 1000 characters")]));
    }
    let node = state.store.get_node(id).await?.ok_or_else(|| ApiError::not_found(format!("no node {id}")))?;
    let reason = crate::routes::agent::nodes::quarantine_reason(&format!("set aside by a platform admin: {reason}"));
    if !state.store.set_quarantine(id, Some(&reason)).await? {
        return Err(ApiError::conflict(format!(
            "node {} is already in quarantine: {}",
            node.name,
            node.quarantine.unwrap_or_default()
        )));
    }
    state.changed().await;
    one_node(&state, &user, id).await
}

/// Lifts a node's quarantine: it is placed on again. 409 when it is not in quarantine.
#[utoipa::path(delete, path = "/v1/nodes/{id}/quarantine", tag = "teams", params(("id" = Uuid, Path)),
    responses((status = 200, body = NodeView), (status = 403), (status = 404), (status = 409)),
    security(("bearer" = [])))]
pub async fn lift_quarantine(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<NodeId>,
) -> ApiResult<Json<NodeView>> {
    platform_admin(&user)?;
    let node = state.store.get_node(id).await?.ok_or_else(|| ApiError::not_found(format!("no node {id}")))?;
    if !state.store.set_quarantine(id, None).await? {
        return Err(ApiError::conflict(format!("node {} is not in quarantine", node.name)));
    }
    tracing::info!(node = %node.name, "quarantine lifted");
    state.changed().await;
    one_node(&state, &user, id).await
}

/// The node as `GET /v1/nodes` shows it.
async fn one_node(state: &AppState, user: &User, id: NodeId) -> ApiResult<Json<NodeView>> {
    let Json(list) = list_nodes(State(state.clone()), user.clone()).await?;
    let node =
        list.nodes.into_iter().find(|n| n.id == id).ok_or_else(|| ApiError::not_found(format!("no node {id}")))?;
    Ok(Json(node))
}
