//! ringtrain's durable state behind one [`Store`] trait, with a Postgres and an embedded SQLite
//! implementation.
//!
//! The interface is split by aggregate, one module each, and [`Store`] is all of them together. Each module
//! holds its trait and the records of the tables it owns (every one of them is re-exported here at the crate
//! root); the private `records` module keeps the few definitions all of them share.
//!
//! | module | trait | what | records |
//! |---|---|---|---|
//! | [`teams`] | [`TeamStore`] | teams and their tokens | [`Team`], [`NewTeam`], [`TeamChange`], [`Budget`], [`StorageUse`], [`Role`], [`TokenInfo`], [`NewToken`] |
//! | [`jobs`] | [`JobStore`] | submitting, reading and listing jobs; the queue; events | [`Job`], [`NewJob`], [`Submitted`], [`JobFilter`], [`JobEvent`], [`Unplaceable`], [`StudyPoint`] |
//! | [`lifecycle`] | [`LifecycleStore`] | every job state change: start, succeed, fail, preempt, cancel | [`Transition`], [`LeaseChange`], [`Cancellation`] |
//! | [`metrics`] | [`MetricStore`] | what ranks report per iteration and epoch | [`MetricPoint`], [`MetricsQuery`], [`RankProgress`] |
//! | [`logs`] | [`LogStore`] | what ranks print, per placement and rank | [`RankLogLine`], [`LogQuery`] |
//! | [`nodes`] | [`NodeStore`] | the worker pool: nodes, devices, heartbeats | [`Node`], [`Device`], [`NodeRegistration`], [`NewDevice`] |
//! | [`assignments`] | [`AssignmentStore`] | ranks placed on devices, moved along by agents | [`Assignment`], [`NewAssignment`] |
//! | [`artifacts`] | [`ArtifactStore`] | checkpoints, uploaded datasets and models | [`Checkpoint`], [`Dataset`], [`Model`] and their `New*` |
//! | [`usage`] | [`UsageStore`] | device time per placement and rank: accounting, budgets | [`DeviceSpan`], [`DeviceTotal`], [`SpanFilter`] |
//! | [`studies`] | [`StudyStore`] | studies: one base spec, one job per point | [`Study`], [`NewStudy`] |
//! | [`uploads`] | [`UploadStore`] | data set uploads in parts, until whole | [`Upload`] |
//!
//! Both databases run the same SQL text wherever the dialects agree (timestamps are bound from Rust, so no
//! `now()`; placeholders are `$N`, which SQLite understands too): each aggregate's SQL is written once, as a
//! small macro instantiated for each backend. What differs — migrations, connection set-up, the leader lock,
//! change notifications and byte-order collation — is the private [`backend::SqlBackend`] contract that
//! [`postgres`] and [`sqlite`] implement.
//!
//! Every job state change is one guarded `UPDATE ... WHERE id = $1 AND state = $2 [AND attempt = ...]` plus
//! its event row in the same transaction, so two writers can never both win.

mod backend;
mod error;
mod records;
mod rows;
mod token;
mod write_gate;

pub mod test_support;

pub mod artifacts;
pub mod assignments;
pub mod jobs;
pub mod lifecycle;
pub mod logs;
pub mod metrics;
pub mod nodes;
pub mod postgres;
pub mod sqlite;
pub mod studies;
pub mod teams;
pub mod uploads;
pub mod usage;

use std::sync::Arc;

use async_trait::async_trait;

pub use artifacts::{ArtifactStore, Checkpoint, Dataset, DatasetInput, Model, NewCheckpoint, NewDataset, NewModel};
pub use assignments::{Assignment, AssignmentStore, NewAssignment};
pub use error::{StoreError, StoreResult};
pub use jobs::{
    Annotations, IdempotencyKey, Job, JobEvent, JobFilter, JobStore, NewJob, StudyPoint, Submitted, Unplaceable,
};
pub use lifecycle::{Cancellation, LeaseChange, LifecycleStore, Transition};
pub use logs::{LogQuery, LogStore, RankLogLine};
pub use metrics::{MetricPoint, MetricStore, MetricsQuery, RankProgress};
pub use nodes::{Device, NewDevice, Node, NodeRegistration, NodeStore};
pub use postgres::PgStore;
pub use records::{now, Backend};
pub use sqlite::SqliteStore;
pub use studies::{NewStudy, Study, StudyStore};
pub use teams::{Budget, BudgetPeriod, NewTeam, NewToken, Role, StorageUse, Team, TeamChange, TeamStore, TokenInfo};
pub use token::{generate_token, hash_token};
pub use uploads::{Upload, UploadStore};
pub use usage::{period_use, DeviceSpan, DeviceTotal, SpanFilter, UsageStore};

/// Everything the API, the scheduler loop and the agents' endpoints need from the database: every
/// aggregate's operations, plus readiness and the coordination of server replicas.
#[async_trait]
pub trait Store:
    TeamStore
    + JobStore
    + LifecycleStore
    + MetricStore
    + NodeStore
    + AssignmentStore
    + ArtifactStore
    + UsageStore
    + LogStore
    + StudyStore
    + UploadStore
    + std::fmt::Debug
{
    fn backend(&self) -> Backend;

    /// Readiness: the database answers and every migration of this build is applied.
    async fn ready(&self) -> StoreResult<()>;

    /// Whether this process is the scheduler leader: on Postgres, holds (or now took) a session advisory lock
    /// on a connection kept for that purpose; the single SQLite server always is.
    async fn try_lead(&self) -> StoreResult<bool>;

    /// Tells `on_notice` what the servers sharing the database announce (Postgres LISTEN): [`Notice::Listening`]
    /// once listening, then each change and token revocation, and [`Notice::Lost`] when the connection drops
    /// (it reconnects and says `Listening` again) or before returning an error. Returns at once on SQLite,
    /// whose one server is told in-process, without a word: nothing is ever heard there.
    async fn listen(&self, on_notice: Box<dyn Fn(Notice) + Send + Sync>) -> StoreResult<()>;
}

/// What a server hears from the others on the same database ([`Store::listen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// Listening: every announcement committed from now on will be heard.
    Listening,
    /// Jobs or assignments changed.
    Changed,
    /// A token was revoked (by any server, or by `ringtrain admin reset-token`).
    TokenRevoked,
    /// Not listening any more: announcements are missed until the next `Listening`.
    Lost,
}

/// Instantiates every aggregate's SQL, and the [`Store`] trait, for one backend.
macro_rules! impl_all_for {
    ($store:ty) => {
        crate::backend::impl_store_core!($store);
        crate::teams::impl_team_store!($store);
        crate::jobs::impl_job_store!($store);
        crate::lifecycle::impl_lifecycle_store!($store);
        crate::metrics::impl_metric_store!($store);
        crate::nodes::impl_node_store!($store);
        crate::assignments::impl_assignment_store!($store);
        crate::artifacts::impl_artifact_store!($store);
        crate::usage::impl_usage_store!($store);
        crate::logs::impl_log_store!($store);
        crate::studies::impl_study_store!($store);
        crate::uploads::impl_upload_store!($store);
    };
}

impl_all_for!(PgStore);
impl_all_for!(SqliteStore);

/// Opens the database a URL names (`postgres://...` or `sqlite:...`) and applies its migrations.
pub async fn connect(url: &str) -> StoreResult<Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PgStore::connect(url).await?))
    } else if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url).await?))
    } else {
        Err(StoreError::Config(format!("unsupported database URL {url:?}: expected postgres://... or sqlite:...")))
    }
}
