//! Raw rows as both databases return them, and their conversion into the record types. The row structs hold
//! only types that decode the same way on Postgres and SQLite (states are TEXT, JSON is `Json<Value>`).
//!
//! One file for every aggregate's rows (not one beside each aggregate): they share the decode rules above
//! and `parse`, and each is a plain struct with its column list and conversion, read top to bottom.
//!
//! Over 450 lines for that reason.

use chrono::{DateTime, Utc};
use ringtrain_core::{
    AssignmentId, CheckpointId, DatasetId, DeviceId, Effective, JobId, JobSpec, ModelId, NodeId, StudyId, TeamId,
    TokenId,
};
use serde::Deserialize;
use serde_json::Value;
use sqlx::types::Json;
use uuid::Uuid;

use crate::error::StoreError;
use crate::{
    Assignment, Budget, BudgetPeriod, Checkpoint, Dataset, DatasetInput, Device, Job, JobEvent, MetricPoint, Model,
    Node, Role, Study, StudyPoint, Team, TokenInfo, Unplaceable,
};

/// The columns every job query returns, in [`JobRow`]'s order.
pub(crate) const JOB_COLUMNS: &str = "seq, id, team_id, created_by, name, spec, effective, dataset_size, state, \
     priority, device, devices, attempt, preemptions, max_restarts, lease_owner, lease_expires, created_at, updated_at, \
     started_at, finished_at, result, error, unplaceable_since, unplaceable_reason, study_id, study_point, tags, note";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct JobRow {
    seq: i64,
    id: Uuid,
    team_id: Uuid,
    created_by: Option<Uuid>,
    name: Option<String>,
    spec: Json<Value>,
    effective: Option<Json<Value>>,
    dataset_size: Option<i64>,
    state: String,
    priority: i32,
    device: String,
    devices: i32,
    attempt: i32,
    preemptions: i32,
    max_restarts: i32,
    lease_owner: Option<String>,
    lease_expires: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    result: Option<Json<Value>>,
    error: Option<String>,
    unplaceable_since: Option<DateTime<Utc>>,
    unplaceable_reason: Option<String>,
    study_id: Option<Uuid>,
    study_point: Option<i32>,
    tags: String,
    note: String,
}

/// A stored state or kind name: one this build does not know is a corrupt row.
pub(crate) fn parse<T: std::str::FromStr<Err = String>>(text: &str) -> Result<T, StoreError> {
    text.parse().map_err(StoreError::Corrupt)
}

impl TryFrom<JobRow> for Job {
    type Error = StoreError;

    fn try_from(row: JobRow) -> Result<Self, Self::Error> {
        let id = row.id;
        let corrupt = move |what: &str, e: serde_json::Error| StoreError::Corrupt(format!("job {id}: {what}: {e}"));
        let spec = JobSpec::deserialize(&row.spec.0).map_err(|e| corrupt("its stored spec does not parse", e))?;
        let effective = match &row.effective {
            Some(json) => Some(
                Effective::deserialize(&json.0)
                    .map_err(|e| corrupt("its stored effective hyperparameters do not parse", e))?,
            ),
            None => None,
        };
        let tags: Vec<String> =
            serde_json::from_str(&row.tags).map_err(|e| corrupt("its stored tags do not parse", e))?;
        Ok(Job {
            id: JobId(row.id),
            seq: row.seq,
            team_id: TeamId(row.team_id),
            created_by: row.created_by.map(TokenId),
            name: row.name,
            spec,
            spec_json: row.spec.0,
            effective,
            dataset_size: row.dataset_size,
            state: parse(&row.state)?,
            priority: row.priority,
            device: parse(&row.device)?,
            devices: row.devices,
            attempt: row.attempt,
            preemptions: row.preemptions,
            max_restarts: row.max_restarts,
            lease_owner: row.lease_owner,
            lease_expires: row.lease_expires,
            created_at: row.created_at,
            updated_at: row.updated_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
            result: row.result.map(|j| j.0),
            error: row.error,
            unplaceable: match (row.unplaceable_since, row.unplaceable_reason) {
                (Some(since), Some(reason)) => Some(Unplaceable { since, reason }),
                _ => None,
            },
            study: match (row.study_id, row.study_point) {
                (Some(id), Some(point)) => Some(StudyPoint { study_id: StudyId(id), point }),
                _ => None,
            },
            tags,
            note: row.note,
        })
    }
}

pub(crate) const STUDY_COLUMNS: &str =
    "seq, id, team_id, created_by, name, definition, reference_point, created_at, search_state, search_version";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StudyRow {
    seq: i64,
    id: Uuid,
    team_id: Uuid,
    created_by: Option<Uuid>,
    name: Option<String>,
    definition: Json<Value>,
    reference_point: i32,
    created_at: DateTime<Utc>,
    search_state: Option<Json<Value>>,
    search_version: i64,
}

impl From<StudyRow> for Study {
    fn from(row: StudyRow) -> Self {
        Study {
            id: StudyId(row.id),
            seq: row.seq,
            team_id: TeamId(row.team_id),
            created_by: row.created_by.map(TokenId),
            name: row.name,
            definition: row.definition.0,
            reference_point: row.reference_point,
            created_at: row.created_at,
            search_state: row.search_state.map(|s| s.0),
            search_version: row.search_version,
        }
    }
}

pub(crate) fn jobs(rows: Vec<JobRow>) -> Result<Vec<Job>, StoreError> {
    rows.into_iter().map(Job::try_from).collect()
}

pub(crate) const TEAM_COLUMNS: &str =
    "id, name, gpu_quota, cpu_quota, storage_quota_bytes, weight, budget_device_hours, budget_period, data_roots, \
     created_at";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TeamRow {
    id: Uuid,
    name: String,
    gpu_quota: i32,
    cpu_quota: i32,
    storage_quota_bytes: Option<i64>,
    weight: i32,
    budget_device_hours: Option<f64>,
    budget_period: Option<String>,
    /// A JSON array of paths.
    data_roots: String,
    created_at: DateTime<Utc>,
}

impl From<TeamRow> for Team {
    fn from(row: TeamRow) -> Self {
        Team {
            id: TeamId(row.id),
            name: row.name,
            gpu_quota: row.gpu_quota,
            cpu_quota: row.cpu_quota,
            storage_quota_bytes: row.storage_quota_bytes,
            weight: row.weight,
            budget: match (row.budget_device_hours, row.budget_period.as_deref().and_then(BudgetPeriod::parse)) {
                (Some(device_hours), Some(period)) => Some(Budget { device_hours, period }),
                _ => None,
            },
            data_roots: serde_json::from_str(&row.data_roots).unwrap_or_default(),
            created_at: row.created_at,
        }
    }
}

pub(crate) const TOKEN_COLUMNS: &str =
    "id, role, team_id, platform, label, created_at, expires_at, last_used_at, revoked_at";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TokenRow {
    id: Uuid,
    role: String,
    team_id: Option<Uuid>,
    platform: bool,
    label: Option<String>,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    last_used_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
}

impl TryFrom<TokenRow> for TokenInfo {
    type Error = StoreError;

    fn try_from(row: TokenRow) -> Result<Self, Self::Error> {
        let role = Role::parse(&row.role).ok_or_else(|| StoreError::Corrupt(format!("unknown role {:?}", row.role)))?;
        Ok(TokenInfo {
            id: TokenId(row.id),
            role,
            team_id: row.team_id.map(TeamId),
            platform: row.platform,
            label: row.label,
            created_at: row.created_at,
            expires_at: row.expires_at,
            last_used_at: row.last_used_at,
            revoked_at: row.revoked_at,
        })
    }
}

pub(crate) const EVENT_COLUMNS: &str = "seq, job_id, at, kind, from_state, to_state, attempt, run_attempt, reason";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EventRow {
    seq: i64,
    job_id: Uuid,
    at: DateTime<Utc>,
    kind: String,
    from_state: Option<String>,
    to_state: Option<String>,
    attempt: i32,
    run_attempt: Option<i32>,
    reason: Option<String>,
}

impl From<EventRow> for JobEvent {
    fn from(row: EventRow) -> Self {
        JobEvent {
            seq: row.seq,
            job_id: JobId(row.job_id),
            at: row.at,
            kind: row.kind,
            from_state: row.from_state,
            to_state: row.to_state,
            placement: row.attempt,
            // events written before the column existed: the placement is the closest number there is
            attempt: row.run_attempt.unwrap_or(row.attempt),
            reason: row.reason,
        }
    }
}

pub(crate) const METRIC_COLUMNS: &str = "kind, rank, epoch, iteration, attempt, fields";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct MetricRow {
    kind: String,
    rank: i32,
    epoch: i64,
    iteration: i64,
    attempt: i32,
    fields: Json<serde_json::Map<String, Value>>,
}

impl From<MetricRow> for MetricPoint {
    fn from(row: MetricRow) -> Self {
        MetricPoint {
            kind: row.kind,
            rank: row.rank,
            epoch: row.epoch,
            iteration: row.iteration,
            attempt: row.attempt,
            fields: row.fields.0,
        }
    }
}

pub(crate) const NODE_COLUMNS: &str =
    "id, name, agent_token_id, address, state, registered_at, last_heartbeat, quarantine, quarantined_at";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct NodeRow {
    pub(crate) id: Uuid,
    name: String,
    agent_token_id: Uuid,
    address: Option<String>,
    state: String,
    registered_at: DateTime<Utc>,
    last_heartbeat: DateTime<Utc>,
    quarantine: Option<String>,
    quarantined_at: Option<DateTime<Utc>>,
}

impl NodeRow {
    pub(crate) fn with_devices(self, devices: Vec<Device>) -> Result<Node, StoreError> {
        Ok(Node {
            id: NodeId(self.id),
            name: self.name,
            agent_token_id: TokenId(self.agent_token_id),
            address: self.address,
            state: parse(&self.state)?,
            registered_at: self.registered_at,
            last_heartbeat: self.last_heartbeat,
            devices,
            quarantine: self.quarantine,
            quarantined_at: self.quarantined_at,
        })
    }
}

pub(crate) const DEVICE_COLUMNS: &str = "id, node_id, idx, kind, name, memory_bytes";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DeviceRow {
    id: Uuid,
    pub(crate) node_id: Uuid,
    idx: i32,
    kind: String,
    name: String,
    memory_bytes: Option<i64>,
}

impl TryFrom<DeviceRow> for Device {
    type Error = StoreError;

    fn try_from(row: DeviceRow) -> Result<Self, Self::Error> {
        let kind = parse(&row.kind)?;
        Ok(Device { id: DeviceId(row.id), index: row.idx, kind, name: row.name, memory_bytes: row.memory_bytes })
    }
}

pub(crate) const ASSIGNMENT_COLUMNS: &str =
    "id, job_id, attempt, node_id, device_id, rank, world_size, state, endpoint, preempted, created_at, updated_at";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct AssignmentRow {
    id: Uuid,
    job_id: Uuid,
    attempt: i32,
    node_id: Uuid,
    device_id: Uuid,
    rank: i32,
    world_size: i32,
    state: String,
    endpoint: Option<String>,
    preempted: bool,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<AssignmentRow> for Assignment {
    type Error = StoreError;

    fn try_from(row: AssignmentRow) -> Result<Self, Self::Error> {
        Ok(Assignment {
            id: AssignmentId(row.id),
            job_id: JobId(row.job_id),
            attempt: row.attempt,
            node_id: NodeId(row.node_id),
            device_id: DeviceId(row.device_id),
            rank: row.rank,
            world_size: row.world_size,
            state: parse(&row.state)?,
            endpoint: row.endpoint,
            preempted: row.preempted,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

pub(crate) const CHECKPOINT_COLUMNS: &str =
    "id, job_id, attempt, epoch, iteration, path, size_bytes, sha256, is_final, created_at";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct CheckpointRow {
    id: Uuid,
    job_id: Uuid,
    attempt: i32,
    epoch: i64,
    iteration: i64,
    path: String,
    size_bytes: i64,
    sha256: String,
    is_final: bool,
    created_at: DateTime<Utc>,
}

impl From<CheckpointRow> for Checkpoint {
    fn from(row: CheckpointRow) -> Self {
        Checkpoint {
            id: CheckpointId(row.id),
            job_id: JobId(row.job_id),
            attempt: row.attempt,
            epoch: row.epoch,
            iteration: row.iteration,
            name: std::path::Path::new(&row.path)
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            path: row.path,
            size_bytes: row.size_bytes,
            sha256: row.sha256,
            is_final: row.is_final,
            created_at: row.created_at,
        }
    }
}

pub(crate) const DATASET_COLUMNS: &str =
    "id, team_id, name, path, size_bytes, sha256, train_samples, sample_shape, num_classes, inputs, labels, created_at, \
     source";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DatasetRow {
    id: Uuid,
    team_id: Uuid,
    name: String,
    path: String,
    size_bytes: i64,
    sha256: String,
    train_samples: i64,
    sample_shape: Json<Vec<i64>>,
    num_classes: i32,
    inputs: Json<Vec<DatasetInput>>,
    labels: String,
    created_at: DateTime<Utc>,
    source: Option<String>,
}

impl From<DatasetRow> for Dataset {
    fn from(row: DatasetRow) -> Self {
        Dataset {
            id: DatasetId(row.id),
            team_id: TeamId(row.team_id),
            name: row.name,
            path: row.path,
            size_bytes: row.size_bytes,
            sha256: row.sha256,
            train_samples: row.train_samples,
            sample_shape: row.sample_shape.0,
            num_classes: row.num_classes,
            inputs: row.inputs.0,
            labels: row.labels,
            created_at: row.created_at,
            source: row.source,
        }
    }
}

pub(crate) const MODEL_COLUMNS: &str = "id, team_id, name, path, size_bytes, sha256, inputs, report, created_at";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ModelRow {
    id: Uuid,
    team_id: Uuid,
    name: String,
    path: String,
    size_bytes: i64,
    sha256: String,
    inputs: Json<Vec<String>>,
    report: Json<serde_json::Value>,
    created_at: DateTime<Utc>,
}

impl From<ModelRow> for Model {
    fn from(row: ModelRow) -> Self {
        Model {
            id: ModelId(row.id),
            team_id: TeamId(row.team_id),
            name: row.name,
            path: row.path,
            size_bytes: row.size_bytes,
            sha256: row.sha256,
            inputs: row.inputs.0,
            report: row.report.0,
            created_at: row.created_at,
        }
    }
}
