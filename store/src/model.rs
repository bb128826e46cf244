//! The records the store reads and writes: plain data, shared by every aggregate.

use chrono::{DateTime, Utc};
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{DeviceId, Effective, JobId, JobSpec, JobState, NodeId, StudyId, TeamId, TokenId};
pub use ringtrain_protocol::{Assignment, Checkpoint, Device, Node};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

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
    pub id: TeamId,
    pub name: String,
    /// GPUs the team's running jobs may hold at once.
    pub gpu_quota: i32,
    /// CPU devices the team's running jobs may hold at once.
    pub cpu_quota: i32,
    /// Bytes of datasets and checkpoints the team may keep; null: the server's default.
    pub storage_quota_bytes: Option<i64>,
    /// Its weight in the division of idle capacity beyond guarantees (weighted fair share).
    pub weight: i32,
    /// Device-hours its jobs may use per period; null: no budget.
    pub budget: Option<Budget>,
    pub created_at: DateTime<Utc>,
}

/// A budget of device-hours per calendar period (UTC). A team whose usage in the current period reached it
/// has its queued jobs wait until the next period.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Device-hours per period, over all its jobs and kinds (a GPU-hour and a CPU-slot-hour count alike).
    #[schema(minimum = 0.0001, maximum = 1_000_000_000)]
    pub device_hours: f64,
    /// `day`, `week` (from Monday) or `month`, in UTC.
    pub period: BudgetPeriod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    Day,
    Week,
    Month,
}

impl BudgetPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Week => "week",
            BudgetPeriod::Month => "month",
        }
    }

    pub fn parse(text: &str) -> Option<BudgetPeriod> {
        [BudgetPeriod::Day, BudgetPeriod::Week, BudgetPeriod::Month].into_iter().find(|p| p.as_str() == text)
    }

    /// The start of the period holding `at` (weeks start on Monday), and the start of the next one.
    pub fn bounds(self, at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        use chrono::{Datelike, Duration, NaiveDate, TimeZone};
        let day = at.date_naive();
        let (start, next): (NaiveDate, NaiveDate) = match self {
            BudgetPeriod::Day => (day, day + Duration::days(1)),
            BudgetPeriod::Week => {
                let monday = day - Duration::days(i64::from(day.weekday().num_days_from_monday()));
                (monday, monday + Duration::days(7))
            }
            BudgetPeriod::Month => {
                let first = day.with_day(1).unwrap_or(day);
                let next = if first.month() == 12 {
                    NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
                } else {
                    NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
                };
                (first, next.unwrap_or(first + Duration::days(31)))
            }
        };
        let midnight = |d: NaiveDate| Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).unwrap_or_default());
        (midnight(start), midnight(next))
    }
}

/// What a platform admin changes of a team; None leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct TeamChange {
    pub gpu_quota: Option<i32>,
    pub cpu_quota: Option<i32>,
    /// Some(None) goes back to the server's default.
    pub storage_quota_bytes: Option<Option<i64>>,
    pub weight: Option<i32>,
    /// Some(None) removes the budget.
    pub budget: Option<Option<Budget>>,
}

/// The bytes a team keeps on the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct StorageUse {
    /// Uploaded datasets and models.
    pub datasets_bytes: i64,
    pub checkpoints_bytes: i64,
}

impl StorageUse {
    pub fn total(&self) -> i64 {
        self.datasets_bytes.saturating_add(self.checkpoints_bytes)
    }
}

#[derive(Debug, Clone)]
pub struct NewTeam {
    pub name: String,
    pub gpu_quota: i32,
    pub cpu_quota: i32,
    pub storage_quota_bytes: Option<i64>,
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

/// A token as the store knows it: never the token itself (nor its hash).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TokenInfo {
    pub id: TokenId,
    pub role: Role,
    /// None for agent tokens.
    pub team_id: Option<TeamId>,
    /// A platform admin: creates teams, sets quotas, mints agent tokens, manages every team's tokens.
    pub platform: bool,
    pub label: Option<String>,
    pub created_at: DateTime<Utc>,
    /// Refused from then on, like a revoked token.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was last used, to the minute.
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl TokenInfo {
    /// Whether it may be used at `now`: not revoked, not expired.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}

#[derive(Debug, Clone)]
pub struct NewToken {
    pub token_hash: String,
    pub role: Role,
    pub team_id: Option<TeamId>,
    /// Only with role admin.
    pub platform: bool,
    pub label: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: JobId,
    /// Insertion order: the run history's sort key and cursor.
    pub seq: i64,
    pub team_id: TeamId,
    pub created_by: Option<TokenId>,
    pub name: Option<String>,
    pub spec: Value,
    /// `ringtrain_core::Effective` as JSON; None while the dataset's size is unknown (`idx:` datasets).
    pub effective: Option<Value>,
    pub dataset_size: Option<i64>,
    pub state: JobState,
    pub priority: i32,
    pub device: DeviceKind,
    /// The rank processes placed (the spec's `devices`), each on a device of its own.
    pub devices: i32,
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
    /// Set while the job is queued and cannot be placed on the pool as it exists.
    pub unplaceable: Option<Unplaceable>,
    /// The study this job is a point of.
    pub study: Option<StudyPoint>,
}

impl Job {
    /// The spec, typed: the one way the server reads a job's fields (never by JSON key, where a renamed
    /// field would silently become a default). It was validated at submission, so a spec that no longer
    /// parses is a row this version cannot read: corrupt, said with the job's id.
    pub fn parsed_spec(&self) -> crate::StoreResult<JobSpec> {
        serde_json::from_value(self.spec.clone())
            .map_err(|e| crate::StoreError::Corrupt(format!("job {}: its stored spec does not parse: {e}", self.id)))
    }

    /// The effective hyperparameters, typed; None while the dataset's size is unknown (`idx:` datasets).
    pub fn parsed_effective(&self) -> crate::StoreResult<Option<Effective>> {
        let Some(effective) = &self.effective else { return Ok(None) };
        serde_json::from_value(effective.clone()).map(Some).map_err(|e| {
            crate::StoreError::Corrupt(format!(
                "job {}: its stored effective hyperparameters do not parse: {e}",
                self.id
            ))
        })
    }
}

/// A study as stored: what was asked, and which point is the reference. Its points are jobs
/// ([`Job::study`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Study {
    pub id: StudyId,
    /// Insertion order: the list's sort key and cursor.
    pub seq: i64,
    pub team_id: TeamId,
    pub created_by: Option<TokenId>,
    pub name: Option<String>,
    /// The request as given (base spec, axes or points, reference).
    pub definition: Value,
    /// The point the others are compared with (the small-batch baseline).
    pub reference_point: i32,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct NewStudy {
    pub id: StudyId,
    pub team_id: TeamId,
    pub created_by: Option<TokenId>,
    pub name: Option<String>,
    pub definition: Value,
    pub reference_point: i32,
}

/// Which point of which study a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StudyPoint {
    pub study_id: StudyId,
    /// 0-based, in the order the study's points were made.
    pub point: i32,
}

/// Why a queued job cannot be placed on the pool as it exists, and since when.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Unplaceable {
    pub since: DateTime<Utc>,
    /// In words, with the numbers: "needs 8 cpu devices; the pool has 1".
    pub reason: String,
}

impl Job {
    /// The attempt as users count it: 1 for the first run, one more per failure-restart. A preempted run that
    /// resumes elsewhere continues the same attempt.
    pub fn user_attempt(&self) -> i32 {
        self.attempt - self.preemptions
    }

    /// How events name the current placement: "placement 3 (attempt 2)" (the third time it was placed, the
    /// second run after one failure, one preemption).
    pub fn placement_name(&self) -> String {
        format!("placement {} (attempt {})", self.attempt, self.user_attempt())
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
    pub team_id: TeamId,
    pub created_by: Option<TokenId>,
    pub name: Option<String>,
    pub spec: Value,
    pub effective: Option<Value>,
    pub dataset_size: Option<i64>,
    pub priority: i32,
    pub device: DeviceKind,
    pub devices: i32,
    pub max_restarts: i32,
    pub study: Option<StudyPoint>,
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
    pub job_id: JobId,
    pub at: DateTime<Utc>,
    /// `state` for transitions.
    pub kind: String,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    /// The placement it belongs to: 1 for the first time the job was placed, one more per start (after a
    /// failure or a preemption); 0 before the first.
    pub placement: i32,
    /// The attempt as the job's view counts it: one more per failure-restart, the same across a preemption.
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

impl MetricsQuery {
    /// Every epoch report of rank 0, in epoch order: a job's curve (epoch reports are all-reduced, the same on
    /// every rank).
    pub fn epoch_curve() -> MetricsQuery {
        MetricsQuery { kind: Some("epoch".into()), rank: Some(0), stride: 1, limit: 100_000, ..Default::default() }
    }
}

#[derive(Debug, Clone)]
pub struct NodeRegistration {
    pub name: String,
    pub address: Option<String>,
    pub devices: Vec<NewDevice>,
}

#[derive(Debug, Clone)]
pub struct NewDevice {
    pub index: i32,
    pub kind: DeviceKind,
    pub name: String,
    pub memory_bytes: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct NewAssignment {
    pub node_id: NodeId,
    pub device_id: DeviceId,
    pub rank: i32,
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
    pub team_id: TeamId,
    pub name: String,
    /// Where the file lies in the server's data directory: never sent.
    #[serde(skip)]
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub train_samples: i64,
    /// The shape of one sample (`x` without its first dimension; the first named input's for a data set
    /// of named inputs).
    pub sample_shape: Vec<i64>,
    /// Classes of the labels (0 when they are values).
    pub num_classes: i32,
    /// The named inputs (`x.NAME` tensors, for uploaded models); empty for a data set of one `x`.
    pub inputs: Vec<DatasetInput>,
    /// `classes` (integer labels) or `values` (float labels, for regression).
    pub labels: String,
    pub created_at: DateTime<Utc>,
}

/// A named input of a data set: the tensor `x.NAME` (and `x_test.NAME`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DatasetInput {
    pub name: String,
    /// The safetensors dtype, e.g. F32, I64.
    pub dtype: String,
    /// The shape of one sample (without the first dimension).
    pub shape: Vec<i64>,
}

/// An uploaded TorchScript model.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Model {
    pub id: Uuid,
    pub team_id: TeamId,
    pub name: String,
    /// Where the file lies in the server's data directory: never sent.
    #[serde(skip)]
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    /// forward's inputs in order: the data set's tensors `x.NAME` (`x`: the one input of a plain data set).
    pub inputs: Vec<String>,
    /// What the upload's check found.
    #[schema(value_type = Object)]
    pub report: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct NewModel {
    pub id: Uuid,
    pub team_id: TeamId,
    pub name: String,
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub inputs: Vec<String>,
    pub report: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct NewDataset {
    pub id: Uuid,
    pub team_id: TeamId,
    pub name: String,
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub train_samples: i64,
    pub sample_shape: Vec<i64>,
    pub num_classes: i32,
    pub inputs: Vec<DatasetInput>,
    pub labels: String,
}
