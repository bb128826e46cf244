//! `GET /v1/nodes`: the worker pool, each device with who holds it. What a team may see of others: which
//! *team* holds a device, never which job (the route's module says why).

use chrono::{DateTime, Utc};
use ringtrain_core::{DeviceId, JobId, NodeId, TeamId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub id: NodeId,
    pub name: String,
    pub address: Option<String>,
    /// `up`, or `lost` when its heartbeats stopped.
    pub state: String,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat: DateTime<Utc>,
    pub devices: Vec<DeviceView>,
    /// What the ranks running here use now, from their newest samples (taken every 10 s by the agent);
    /// absent while none has reported one.
    pub ranks_use: Option<NodeUse>,
    /// Why the node gets no new placements, until a platform admin lifts it; absent when it may be placed on.
    pub quarantine: Option<NodeQuarantine>,
}

/// A node set aside: its self-test failed, or a platform admin set it aside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeQuarantine {
    pub reason: String,
    pub since: Option<DateTime<Utc>>,
}

/// The sum over a node's live ranks of their newest samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeUse {
    /// CPU cores kept busy.
    pub cpu_cores: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeviceView {
    pub id: DeviceId,
    /// The device's index on its node (CUDA ordinal; 0.. for CPU slots).
    pub index: i32,
    /// `cpu` or `gpu`.
    pub kind: String,
    pub name: String,
    pub memory_bytes: Option<i64>,
    /// The placement on it now (scheduled or running); absent when the device is free.
    pub held_by: Option<DeviceHolder>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeviceHolder {
    pub team_id: TeamId,
    pub team_name: String,
    /// The job and its name: only for the caller's own team (and platform admins).
    pub job_id: Option<JobId>,
    pub job_name: Option<String>,
    /// The rank this device runs; only with `job_id`.
    pub rank: Option<u32>,
}
