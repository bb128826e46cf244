//! What every handler shares: the store, the configuration, the server's metrics and the change counter.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ringtrain_protocol::timing;
use ringtrain_scheduler::{ChangeNotifier, LoopConfig, Scheduler, ViewConfig};
use ringtrain_store::{Notice, Store};

use crate::admission::log_budget::LogBudgets;
use crate::admission::metric_budget::MetricBudgets;
use crate::admission::requests::{Admission, AdmissionConfig};
use crate::blobs::{Blobs, ServerBucket};
use crate::changes::{Announcements, Changes};
use crate::largest_memory::LargestMemory;
use crate::model_check::{CheckSlots, ModelChecker};
use crate::prometheus::ServerMetrics;
use crate::queue::QueueCache;
use crate::queue_room::QueueRoom;
use crate::token_cache::TokenCache;

/// Limits and locations of the API.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The server's own folder: its uploads and checkpoints unless `store_bucket` is set, and scratch space.
    pub data_dir: PathBuf,
    /// The bucket the server keeps uploads and checkpoints in (`serve --store`; None: `data_dir`).
    pub store_bucket: Option<ServerBucket>,
    /// The largest JSON body any route accepts.
    pub max_body_bytes: usize,
    /// The largest dataset upload.
    pub max_dataset_bytes: u64,
    /// The largest model upload (a TorchScript file).
    pub max_model_bytes: u64,
    /// The `ringtrain` binary whose `models check` looks at uploaded models (in a process of its own, as
    /// libtorch is not linked into the server, confined), or why there is none: model uploads are then
    /// refused (503) with that reason.
    pub model_checker: Result<ModelChecker, String>,
    /// How long one model check may take before it is killed (and the upload refused).
    pub model_check_timeout: Duration,
    /// The largest checkpoint archive an agent may upload.
    pub max_checkpoint_bytes: u64,
    /// Requests (except streams after their headers) that take longer are answered 503.
    pub request_timeout: Duration,
    /// The longest an SSE stream waits for a change notification before it reads the store anyway (a
    /// safety net: streams are woken by the change notifier).
    pub event_poll: Duration,
    /// How long a job's placement lives without a heartbeat from any agent holding one of its ranks.
    pub lease: Duration,
    /// The longest an agent's poll waits for something to change (under `request_timeout`).
    pub max_poll_wait: Duration,
    /// Folders under which `idx:` datasets may lie (none: `idx:` is refused).
    pub idx_roots: Vec<PathBuf>,
    /// Whether (and how) the server reads a bucket data set's index when a job names it.
    pub buckets: BucketReads,
    /// Requests at once, per-token rate, event streams per token and their lifetime.
    pub admission: AdmissionConfig,
    /// Iteration reports one job may store per second, over all its ranks; beyond it the server keeps an
    /// evenly spaced subset (epoch reports are always kept).
    pub metric_rows_per_second: f64,
    /// Queued jobs one team may have; a submission beyond is 429.
    pub max_queued_per_team: i64,
    /// Bytes of datasets and checkpoints a team may keep unless its own quota says otherwise.
    pub team_storage_bytes: u64,
    /// Free bytes uploads leave on the data directory's disk.
    pub min_free_bytes: u64,
    /// Checkpoints kept per job besides its final weights (the newest).
    pub keep_checkpoints: i64,
    /// Lines of rank output one job may store per second (0: no limit), and in all.
    pub log_lines_per_second: f64,
    pub max_log_lines_per_job: i64,
    /// Rank output of jobs that ended longer ago than this is deleted.
    pub log_retention: Duration,
    /// Data set uploads in parts started longer ago than this and not completed are deleted with their parts.
    pub upload_retention: Duration,
    /// How the scheduler reads the cluster (queue window, minimum run time before preemption): the loop's
    /// settings, which the API's pending reasons and dry runs use too.
    pub scheduling: ViewConfig,
}

/// How the server reads the index of a `shards:s3://` data set a submission names: through the store at
/// `endpoint` (None: AWS's), when the server has credentials of its own (`read`). Without them only the
/// agents read buckets, and a wrong prefix shows when the job starts rather than at submission.
#[derive(Debug, Clone, Default)]
pub struct BucketReads {
    pub read: bool,
    pub endpoint: Option<String>,
}

impl BucketReads {
    /// Reads when this process's environment holds store credentials (`AWS_ACCESS_KEY_ID`).
    pub fn from_environment(endpoint: Option<String>) -> BucketReads {
        let read = std::env::var_os("AWS_ACCESS_KEY_ID").is_some_and(|key| !key.is_empty());
        BucketReads { read, endpoint: endpoint.filter(|e| !e.is_empty()) }
    }
}

impl ApiConfig {
    /// Where the server keeps the bytes teams store (see [`crate::blobs`]).
    pub fn blobs(&self) -> Blobs<'_> {
        Blobs::new(&self.data_dir, self.store_bucket.as_ref())
    }

    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ApiConfig {
            data_dir: data_dir.into(),
            store_bucket: None,
            max_body_bytes: 1 << 20,
            max_dataset_bytes: 512 << 20,
            max_model_bytes: 256 << 20,
            model_checker: Err("this server cannot check models (it runs without a ringtrain binary to do so)".into()),
            model_check_timeout: Duration::from_secs(120),
            max_checkpoint_bytes: 8 << 30,
            request_timeout: Duration::from_secs(30),
            event_poll: Duration::from_secs(15),
            lease: timing::LEASE,
            max_poll_wait: timing::MAX_POLL_WAIT,
            idx_roots: Vec::new(),
            buckets: BucketReads::default(),
            admission: AdmissionConfig::default(),
            metric_rows_per_second: 500.0,
            max_queued_per_team: 1_000,
            team_storage_bytes: 100 << 30,
            min_free_bytes: 1 << 30,
            keep_checkpoints: 3,
            scheduling: ViewConfig::default(),
            log_lines_per_second: 100.0,
            max_log_lines_per_job: 100_000,
            log_retention: Duration::from_secs(30 * 24 * 3600),
            upload_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub config: Arc<ApiConfig>,
    pub metrics: Arc<ServerMetrics>,
    pub changes: Arc<Changes>,
    announcements: Arc<Announcements>,
    pub admission: Arc<Admission>,
    pub metric_budgets: Arc<MetricBudgets>,
    pub log_budgets: Arc<LogBudgets>,
    /// The latest plan of the queue, for pending reasons.
    pub queue: Arc<QueueCache>,
    /// Teams' queued jobs as last counted, for the queue limit.
    pub queue_room: Arc<QueueRoom>,
    /// The most memory a device of each kind offers, for the memory check.
    pub largest_memory: Arc<LargestMemory>,
    /// Loss spikes and throughput collapses in the reports this server receives.
    pub training_watch: Arc<crate::training_watch::TrainingWatch>,
    /// What every live rank uses now, read at most every few seconds.
    pub system_now: Arc<crate::system_now::SystemNow>,
    /// Model checks in progress (one per team, two in all).
    pub model_checks: Arc<CheckSlots>,
    /// Tokens found, while [`AppState::listen_to_other_servers`] hears their revocations.
    pub tokens: Arc<TokenCache>,
    /// Devices Slurm owns, asked for per job (`serve --slurm-partition`; see [`crate::slurm_pool`]).
    pub slurm_pool: Option<Arc<crate::slurm_pool::SlurmPool>>,
}

impl AppState {
    pub fn new(store: Arc<dyn Store>, config: ApiConfig) -> Self {
        AppState {
            store,
            admission: Arc::new(Admission::new(config.admission)),
            metric_budgets: Arc::new(MetricBudgets::new(config.metric_rows_per_second)),
            log_budgets: Arc::new(LogBudgets::new(config.log_lines_per_second)),
            config: Arc::new(config),
            metrics: Arc::new(ServerMetrics::default()),
            changes: Arc::new(Changes::default()),
            announcements: Arc::new(Announcements::default()),
            queue: Arc::new(QueueCache::default()),
            queue_room: Arc::new(QueueRoom::default()),
            largest_memory: Arc::new(LargestMemory::default()),
            system_now: Default::default(),
            training_watch: Default::default(),
            model_checks: Arc::new(CheckSlots::new()),
            tokens: Arc::new(TokenCache::default()),
            slurm_pool: None,
        }
    }

    /// This server asks Slurm for devices as `config` says (see [`crate::slurm_pool`]).
    pub fn with_slurm_pool(mut self, config: crate::slurm_pool::SlurmPoolConfig) -> Self {
        self.slurm_pool = Some(Arc::new(crate::slurm_pool::SlurmPool::new(config)));
        self
    }

    /// Jobs or assignments changed: move the database's change version on (what agents' long polls
    /// compare), wake this server's scheduler loop and long polls, and tell the other servers on the same
    /// database. Best effort: a lost notification only delays the next periodic pass or poll answer.
    /// Concurrent callers share one announcement ([`Announcements`]).
    pub async fn changed(&self) {
        self.announcements
            .announce(|| async {
                // before the wake-up, so that a woken poll reads the new version; the other servers hear it
                // from the same statement
                if let Err(err) = self.store.bump_change_version().await {
                    tracing::warn!(error = %err, "cannot move the change version on or tell the other servers");
                }
                self.changes.bump();
            })
            .await;
    }

    /// Hears what the other servers on the same (Postgres) database announce, forever: their changes wake
    /// this server's scheduler loop and long polls, their token revocations empty its token cache, which is
    /// used only while this listens. Reconnects after a lost connection; returns at once on SQLite.
    pub async fn listen_to_other_servers(self) {
        loop {
            let (changes, tokens) = (self.changes.clone(), self.tokens.clone());
            let heard = self.store.listen(Box::new(move |notice| {
                tokens.heard(notice);
                if notice == Notice::Changed {
                    changes.bump();
                }
            }));
            match heard.await {
                Ok(()) => return, // nothing to listen to (SQLite)
                Err(err) => tracing::warn!(error = %err, "listening to the other servers failed; retrying"),
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }

    /// Deletes the rank output of jobs that ended more than `log_retention` ago, the data set uploads left
    /// unfinished for `upload_retention` and the partial files interrupted uploads left a day ago or more,
    /// once an hour from the server's start, forever (`serve` runs it next to the scheduler loop).
    pub async fn expire_leftovers(self) {
        loop {
            let cutoff = chrono::Duration::from_std(self.config.log_retention).unwrap_or(chrono::Duration::MAX);
            if let Some(before) = ringtrain_store::now().checked_sub_signed(cutoff) {
                match self.store.delete_logs_ended_before(before).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(lines = n, "deleted rank output past its retention"),
                    Err(err) => tracing::warn!(error = %err, "deleting old rank output failed"),
                }
            }
            // a day: longer than any upload takes, so another replica's partial file in a shared folder stays
            let swept = crate::blobs::sweep_partials(&self.config.data_dir, Duration::from_secs(86_400)).await;
            if swept > 0 {
                tracing::info!(files = swept, "removed partial files that uploads interrupted a day ago or more left");
            }
            match crate::routes::dataset_uploads::expire_abandoned(&self).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(uploads = n, "deleted data set uploads left unfinished past their retention"),
                Err(err) => tracing::warn!(error = ?err, "deleting abandoned uploads failed"),
            }
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }

    /// The scheduler loop of this server, sharing its store and its change counter. A server gives it
    /// `config.view` = the API's `scheduling`, so pending reasons and dry runs see what the loop sees.
    pub fn scheduler(&self, config: LoopConfig) -> Scheduler {
        Scheduler::new(self.store.clone(), Arc::new(self.clone()), config)
    }
}

/// The scheduler loop waits on, and announces, the same changes as the agents' long polls.
#[async_trait::async_trait]
impl ChangeNotifier for AppState {
    fn version(&self) -> u64 {
        self.changes.version()
    }

    async fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        self.changes.wait_past(seen, timeout).await
    }

    async fn announce(&self) {
        self.changed().await
    }
}
