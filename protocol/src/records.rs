//! The records the server sends to agents (and users): the store reads and writes them as they are.

use chrono::{DateTime, Utc};
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{AssignmentId, AssignmentState, CheckpointId, DeviceId, JobId, NodeId, NodeState, TokenId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Node {
    pub id: NodeId,
    pub name: String,
    /// The agent token that registered the node: only it may heartbeat or report for it. Never sent.
    #[serde(skip)]
    pub agent_token_id: TokenId,
    pub address: Option<String>,
    /// `up`, or `lost` when its heartbeats stopped.
    #[schema(value_type = String)]
    pub state: NodeState,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat: DateTime<Utc>,
    pub devices: Vec<Device>,
    /// Why the node gets no new placements (its self-test failed, or a platform admin set it aside), until
    /// a platform admin lifts it; None when it may be placed on.
    pub quarantine: Option<String>,
    pub quarantined_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Device {
    pub id: DeviceId,
    /// The device's index on its node (CUDA ordinal; 0.. for CPU slots).
    pub index: i32,
    /// `cpu` or `gpu`.
    #[schema(value_type = String)]
    pub kind: DeviceKind,
    pub name: String,
    pub memory_bytes: Option<i64>,
}

/// One rank of one attempt of a job, placed on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Assignment {
    pub id: AssignmentId,
    pub job_id: JobId,
    pub attempt: i32,
    pub node_id: NodeId,
    pub device_id: DeviceId,
    pub rank: i32,
    pub world_size: i32,
    /// pending | delivered | running | done | failed | cancelled
    #[schema(value_type = String)]
    pub state: AssignmentState,
    /// Rank 0's rendezvous address (HOST:PORT), once its agent reported it.
    pub endpoint: Option<String>,
    /// The scheduler preempted this placement: stop the rank after a checkpoint, not at once.
    pub preempted: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Checkpoint {
    pub id: CheckpointId,
    pub job_id: JobId,
    pub attempt: i32,
    pub epoch: i64,
    pub iteration: i64,
    /// The archive's file name, e.g. `epoch-0003-iter-0000000450-attempt-2.tar`.
    pub name: String,
    /// Where the archive lies on the server: never sent (no server paths leave the server).
    #[serde(skip)]
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    /// The final weights of a finished job.
    pub is_final: bool,
    pub created_at: DateTime<Utc>,
}
