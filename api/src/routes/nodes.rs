//! GET /v1/nodes: the worker pool, each device with who holds it (the answer's types are
//! `ringtrain_views::nodes`, which the client reads).
//!
//! What a team may see of others: which *team* holds a device, never which job. Sharing a pool is only fair
//! when everyone can see where its devices went (the same as Slurm's `squeue` showing every account), but a
//! job's name and id can say what a team works on, so they are shown to its own team (and platform admins).

use std::collections::HashMap;

use axum::extract::State;
use axum::Json;
use ringtrain_core::TeamId;
use ringtrain_scheduler::DeviceSlot;
use ringtrain_store::{Device, Node};

use crate::auth::User;
use crate::error::ApiResult;
use crate::state::AppState;

pub use ringtrain_views::nodes::{DeviceHolder, DeviceView, NodeList, NodeUse, NodeView};

/// The worker pool: nodes, their devices, and which team (and, for your own team, which job and rank) holds
/// each device now (any user token).
#[utoipa::path(get, path = "/v1/nodes", tag = "teams",
    responses((status = 200, body = NodeList),
        (status = 401)),
    security(("bearer" = [])))]
pub async fn list_nodes(State(state): State<AppState>, user: User) -> ApiResult<Json<NodeList>> {
    let nodes = state.store.list_nodes().await?;
    let holders = holders(&state, &user).await?;
    let uses = crate::system_now::per_node(&crate::system_now::live_rank_use(&state).await?);
    let view = |node: Node| NodeView {
        ranks_use: uses.get(&node.id).map(|&(cpu_cores, resident_bytes)| NodeUse { cpu_cores, resident_bytes }),
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
