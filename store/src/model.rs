//! The records the store reads and writes, and the [`Store`] interface itself.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ringtrain_core::{JobId, JobState};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::StoreResult;

/// Which database a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Timestamps are kept to the microsecond: Postgres stores no more, so a value reads back equal on both.
pub fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Team {
    pub id: Uuid,
    pub name: String,
    /// GPUs the team's running jobs may hold at once.
    pub gpu_quota: i32,
    /// CPU devices the team's running jobs may hold at once.
    pub cpu_quota: i32,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct NewTeam {
    pub name: String,
    pub gpu_quota: i32,
    pub cpu_quota: i32,
}

/// What a token may do. `Agent` tokens belong to node agents, not to a team.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Manages teams and tokens; also everything a member may do in its own team.
    Admin,
    /// Submits and cancels its team's jobs, uploads datasets.
    Member,
    /// Reads its team's jobs, metrics and datasets.
    Viewer,
    /// A node agent: only the /v1/agent routes.
    Agent,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
            Role::Viewer => "viewer",
            Role::Agent => "agent",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        [Role::Admin, Role::Member, Role::Viewer, Role::Agent].into_iter().find(|r| r.as_str() == text)
    }

    /// Whether this role may change its team's jobs and datasets.
    pub fn can_write(self) -> bool {
        matches!(self, Role::Admin | Role::Member)
    }
}

/// A token as the store knows it: never the token itself.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TokenInfo {
    pub id: Uuid,
    pub role: Role,
    /// None for agent tokens.
    pub team_id: Option<Uuid>,
    pub label: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct NewToken {
    pub token_hash: String,
    pub role: Role,
    pub team_id: Option<Uuid>,
    pub label: Option<String>,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: JobId,
    /// Insertion order: the run history's sort key and cursor.
    pub seq: i64,
    pub team_id: Uuid,
    pub created_by: Option<Uuid>,
    pub name: Option<String>,
    pub spec: Value,
    /// `ringtrain_core::Effective` as JSON; None while the dataset's size is unknown (`idx:` datasets).
    pub effective: Option<Value>,
    pub dataset_size: Option<i64>,
    pub state: JobState,
    pub priority: i32,
    /// `cpu` or `gpu`.
    pub device: String,
    pub workers: i32,
    /// Placements so far: every start (a claim) makes it one more, and it guards every agent report.
    pub attempt: i32,
    /// Placements that ended in a preemption: not failures, so they use none of the restart budget.
    pub preemptions: i32,
    pub max_restarts: i32,
    pub lease_owner: Option<String>,
    pub lease_expires: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub result: Option<Value>,
    pub error: Option<String>,
}

impl Job {
    /// The attempt as users count it: 1 for the first run, one more per failure-restart. A preempted run that
    /// resumes elsewhere continues the same attempt.
    pub fn user_attempt(&self) -> i32 {
        self.attempt - self.preemptions
    }

    /// Whether a failed placement may be retried: restarts used so far (failures, not preemptions) are below
    /// `max_restarts`.
    pub fn may_restart(&self) -> bool {
        self.user_attempt() <= self.max_restarts
    }
}

#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: JobId,
    pub team_id: Uuid,
    pub created_by: Option<Uuid>,
    pub name: Option<String>,
    pub spec: Value,
    pub effective: Option<Value>,
    pub dataset_size: Option<i64>,
    pub priority: i32,
    pub device: String,
    pub workers: i32,
    pub max_restarts: i32,
}

/// An `Idempotency-Key` and the hash of the request body it came with.
#[derive(Debug, Clone)]
pub struct IdempotencyKey {
    pub key: String,
    pub request_hash: String,
}

/// The outcome of a submission.
#[derive(Debug, Clone)]
pub enum Submitted {
    /// A new job was stored.
    Created(Job),
    /// The key was used before with the same body: the job it made then.
    Replayed(Job),
    /// The key was used before with another body.
    KeyReused,
}

/// Run-history filters; newest first.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub name_prefix: Option<String>,
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
    /// Only jobs older than this `seq` (the cursor of the previous page).
    pub before_seq: Option<i64>,
    pub limit: i64,
}

/// What a transition does to the lease.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseChange {
    Keep,
    Clear,
    Set { owner: String, expires: DateTime<Utc> },
}

/// One compare-and-set on a job's state.
#[derive(Debug, Clone)]
pub struct Transition {
    pub job: JobId,
    pub from: JobState,
    pub to: JobState,
    /// Guard: the lease owner must be this one.
    pub owner: Option<String>,
    /// Guard: the attempt must be this one (a stale agent reports an old attempt).
    pub attempt: Option<i32>,
    pub reason: String,
    pub lease: LeaseChange,
    pub result: Option<Value>,
    pub error: Option<String>,
}

impl Transition {
    pub fn new(job: JobId, from: JobState, to: JobState, reason: impl Into<String>) -> Self {
        let lease = if to == JobState::Queued || to.is_terminal() { LeaseChange::Clear } else { LeaseChange::Keep };
        Transition {
            job,
            from,
            to,
            owner: None,
            attempt: None,
            reason: reason.into(),
            lease,
            result: None,
            error: None,
        }
    }

    pub fn owned_by(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    pub fn at_attempt(mut self, attempt: i32) -> Self {
        self.attempt = Some(attempt);
        self
    }
}

/// A row of a job's history: a state change, a restart, a note.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct JobEvent {
    pub seq: i64,
    pub job_id: Uuid,
    pub at: DateTime<Utc>,
    /// `state` for transitions.
    pub kind: String,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    pub attempt: i32,
    pub reason: Option<String>,
}

/// One report of a rank: an `iteration` or `epoch` line. `fields` holds the numbers (`loss`, `lr`,
/// `test_error`, ...). (kind, iteration, rank) is unique per job: reporting it again replaces it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MetricPoint {
    pub kind: String,
    pub rank: i32,
    pub epoch: i64,
    pub iteration: i64,
    pub attempt: i32,
    #[schema(value_type = Object)]
    pub fields: serde_json::Map<String, Value>,
}

/// Which metrics to read, in (kind, iteration, rank) order.
#[derive(Debug, Clone, Default)]
pub struct MetricsQuery {
    pub kind: Option<String>,
    pub rank: Option<i32>,
    pub from_iteration: Option<i64>,
    /// Continue after this (kind, iteration, rank): the previous page's last point.
    pub after: Option<(String, i64, i32)>,
    /// Keep every `stride`-th point of each (kind, rank) series (1: all).
    pub stride: i64,
    pub limit: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Node {
    pub id: Uuid,
    pub name: String,
    /// The agent token that registered the node: only it may heartbeat or report for it.
    #[serde(skip)]
    pub agent_token_id: Uuid,
    pub address: Option<String>,
    /// `up`, or `lost` when its heartbeats stopped.
    pub state: String,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat: DateTime<Utc>,
    pub devices: Vec<Device>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Device {
    pub id: Uuid,
    /// The device's index on its node (CUDA ordinal; 0.. for CPU slots).
    pub index: i32,
    /// `cpu` or `gpu`.
    pub kind: String,
    pub name: String,
    pub memory_bytes: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct NodeRegistration {
    pub name: String,
    pub address: Option<String>,
    /// (index, kind, name, memory_bytes)
    pub devices: Vec<NewDevice>,
}

#[derive(Debug, Clone)]
pub struct NewDevice {
    pub index: i32,
    pub kind: String,
    pub name: String,
    pub memory_bytes: Option<i64>,
}

/// One rank of one attempt of a job, placed on one device.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Assignment {
    pub id: Uuid,
    pub job_id: Uuid,
    pub attempt: i32,
    pub node_id: Uuid,
    pub device_id: Uuid,
    pub rank: i32,
    pub world_size: i32,
    /// pending | delivered | running | done | failed | cancelled
    pub state: String,
    /// Rank 0's rendezvous address (HOST:PORT), once its agent reported it.
    pub endpoint: Option<String>,
    /// The scheduler preempted this placement: stop the rank after a checkpoint, not at once.
    pub preempted: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct NewAssignment {
    pub node_id: Uuid,
    pub device_id: Uuid,
    pub rank: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Checkpoint {
    pub id: Uuid,
    pub job_id: Uuid,
    pub attempt: i32,
    pub epoch: i64,
    pub iteration: i64,
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    /// The final weights of a finished job.
    pub is_final: bool,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct NewCheckpoint {
    pub job_id: JobId,
    pub attempt: i32,
    pub epoch: i64,
    pub iteration: i64,
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub is_final: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Dataset {
    pub id: Uuid,
    pub team_id: Uuid,
    pub name: String,
    /// Where the file lies in the server's data directory.
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub train_samples: i64,
    /// The shape of one sample (`x` without its first dimension).
    pub sample_shape: Vec<i64>,
    pub num_classes: i32,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct NewDataset {
    pub id: Uuid,
    pub team_id: Uuid,
    pub name: String,
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub train_samples: i64,
    pub sample_shape: Vec<i64>,
    pub num_classes: i32,
}

/// Everything the API, the scheduler and the agents' endpoints need from the database.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    fn backend(&self) -> Backend;

    /// Readiness: the database answers and every migration of this build is applied.
    async fn ready(&self) -> StoreResult<()>;

    // --- teams and tokens ---
    /// Conflict when the name is taken.
    async fn create_team(&self, team: NewTeam) -> StoreResult<Team>;
    async fn get_team(&self, id: Uuid) -> StoreResult<Option<Team>>;
    async fn get_team_by_name(&self, name: &str) -> StoreResult<Option<Team>>;
    async fn list_teams(&self) -> StoreResult<Vec<Team>>;
    async fn create_token(&self, token: NewToken) -> StoreResult<TokenInfo>;
    /// The live (not revoked) token with this hash.
    async fn find_token(&self, token_hash: &str) -> StoreResult<Option<TokenInfo>>;

    // --- jobs ---
    /// Stores a `queued` job (and its first event); with a key, at most one job per (team, key).
    async fn submit_job(&self, job: NewJob, key: Option<IdempotencyKey>) -> StoreResult<Submitted>;
    async fn get_job(&self, id: JobId) -> StoreResult<Option<Job>>;
    async fn list_jobs(&self, team_id: Uuid, filter: &JobFilter) -> StoreResult<Vec<Job>>;
    /// One guarded state change plus its event. `Ok(None)`: the guard did not match (someone else won, or
    /// the caller's view is stale) and nothing changed.
    async fn transition(&self, transition: &Transition) -> StoreResult<Option<Job>>;
    /// Moves up to `limit` queued jobs (highest priority, then oldest first) to `scheduled`, leased to
    /// `owner` for `lease`, attempt + 1. Concurrent claimers never get the same job.
    async fn claim_queued(&self, owner: &str, limit: i64, lease: Duration) -> StoreResult<Vec<Job>>;
    /// Starts a queued job on the devices the placement policy chose, in one transaction: queued → scheduled,
    /// leased to `owner`, attempt + 1, with its event, and one pending assignment per rank. None when the job
    /// is no longer queued; Conflict (and nothing written) when a device is busy after all.
    async fn start_job(
        &self,
        id: JobId,
        owner: &str,
        lease: Duration,
        ranks: &[NewAssignment],
    ) -> StoreResult<Option<(Job, Vec<Assignment>)>>;
    /// Requeues a scheduled or running placement whose devices are being reclaimed: back to `queued` with
    /// `preemptions` + 1 (not a failure), its pending assignments cancelled and its delivered or running ones
    /// marked `preempted` (their agents checkpoint, then stop them). None when `attempt` is no longer the
    /// job's current, running placement.
    async fn preempt_job(&self, id: JobId, attempt: i32, reason: &str) -> StoreResult<Option<Job>>;
    /// Jobs holding devices: scheduled or running.
    async fn active_jobs(&self) -> StoreResult<Vec<Job>>;
    /// Extends the lease of every active job with a live assignment on this node (its agent is alive).
    async fn renew_node_leases(&self, node_id: Uuid, lease: Duration) -> StoreResult<u64>;
    /// Records rank 0's rendezvous address on its assignment; false when it is no longer live.
    async fn set_assignment_endpoint(&self, id: Uuid, endpoint: &str) -> StoreResult<bool>;
    /// Whether this process is the scheduler leader: on Postgres, holds (or now took) a session advisory lock
    /// on a connection kept for that purpose; the single SQLite server always is.
    async fn try_lead(&self) -> StoreResult<bool>;
    /// Tells every server sharing the database that jobs or assignments changed (Postgres NOTIFY; nothing on
    /// SQLite, whose one server is told in-process).
    async fn notify_changes(&self) -> StoreResult<()>;
    /// Calls `on_change` for each notification of another server, until the connection fails (Postgres
    /// LISTEN). Returns at once on SQLite.
    async fn listen_for_changes(&self, on_change: Box<dyn Fn() + Send + Sync>) -> StoreResult<()>;
    /// The queue, highest priority then oldest first, without claiming anything.
    async fn list_queued(&self, limit: i64) -> StoreResult<Vec<Job>>;
    /// Extends the lease of a job `owner` holds; false when it no longer does.
    async fn renew_lease(&self, id: JobId, owner: &str, lease: Duration) -> StoreResult<bool>;
    /// Non-terminal jobs whose lease expired before `now` (their owner died): the scheduler requeues them.
    async fn expired_leases(&self, now: DateTime<Utc>, limit: i64) -> StoreResult<Vec<Job>>;
    /// Jobs per state, for /metrics.
    async fn count_jobs_by_state(&self) -> StoreResult<Vec<(JobState, i64)>>;

    // --- events ---
    async fn list_events(&self, job: JobId, after_seq: i64, limit: i64) -> StoreResult<Vec<JobEvent>>;

    // --- metrics ---
    /// Upserts on (job, kind, iteration, rank); returns how many points were written.
    async fn record_metrics(&self, job: JobId, points: &[MetricPoint]) -> StoreResult<u64>;
    async fn query_metrics(&self, job: JobId, query: &MetricsQuery) -> StoreResult<Vec<MetricPoint>>;
    /// Points matching the query's kind, rank and from_iteration (for choosing a downsampling stride).
    async fn count_metrics(&self, job: JobId, query: &MetricsQuery) -> StoreResult<i64>;

    // --- nodes, devices, assignments ---
    /// Registers a node under an agent token, or refreshes it (same name, same token): devices are
    /// upserted by index. Conflict when the name belongs to another agent token.
    async fn register_node(&self, agent_token: Uuid, node: NodeRegistration) -> StoreResult<Node>;
    /// Records a heartbeat; false when the node is not this agent's.
    async fn heartbeat(&self, node_id: Uuid, agent_token: Uuid) -> StoreResult<bool>;
    async fn get_node(&self, id: Uuid) -> StoreResult<Option<Node>>;
    async fn list_nodes(&self) -> StoreResult<Vec<Node>>;
    /// Places the ranks of `job`'s attempt (all or nothing); Conflict when a device is busy.
    async fn create_assignments(
        &self,
        job: JobId,
        attempt: i32,
        ranks: &[NewAssignment],
    ) -> StoreResult<Vec<Assignment>>;
    /// A node's assignments in any of `states`.
    async fn node_assignments(&self, node_id: Uuid, states: &[&str]) -> StoreResult<Vec<Assignment>>;
    /// Every pending, delivered or running assignment: the devices in use.
    async fn live_assignments(&self) -> StoreResult<Vec<Assignment>>;
    /// Marks `up` nodes whose last heartbeat is older than `before` as `lost`; returns their ids.
    async fn mark_lost_nodes(&self, before: DateTime<Utc>) -> StoreResult<Vec<Uuid>>;
    async fn get_assignment(&self, id: Uuid) -> StoreResult<Option<Assignment>>;
    async fn job_assignments(&self, job: JobId, attempt: i32) -> StoreResult<Vec<Assignment>>;
    /// Guarded assignment state change; false when it was not in `from`.
    async fn set_assignment_state(&self, id: Uuid, from: &str, to: &str) -> StoreResult<bool>;
    /// Ends every live assignment of a job (pending, delivered or running) as `to`: for the scheduler, when
    /// the ranks are known to be gone (their node was lost).
    async fn end_job_assignments(&self, job: JobId, to: &str) -> StoreResult<u64>;
    /// Cancels the job's assignments no agent has picked up yet. Delivered and running ones stay live (their
    /// devices busy) until their agent, told to stop them by its next poll, reports them ended.
    async fn cancel_pending_assignments(&self, job: JobId) -> StoreResult<u64>;
    /// Ends every live assignment on a node as `to` (the node was lost).
    async fn end_node_assignments(&self, node_id: Uuid, to: &str) -> StoreResult<u64>;

    // --- checkpoints and datasets ---
    /// Registers a checkpoint; (job, iteration, final) is unique, and a later attempt's registration replaces an
    /// earlier one's, never the reverse (Conflict).
    async fn add_checkpoint(&self, checkpoint: NewCheckpoint) -> StoreResult<Checkpoint>;
    async fn list_checkpoints(&self, job: JobId) -> StoreResult<Vec<Checkpoint>>;
    async fn add_dataset(&self, dataset: NewDataset) -> StoreResult<Dataset>;
    async fn get_dataset(&self, id: Uuid) -> StoreResult<Option<Dataset>>;
    async fn list_datasets(&self, team_id: Uuid) -> StoreResult<Vec<Dataset>>;
}
