//! The scheduler loop: one leader per database (a Postgres advisory lock; the one SQLite server) reads the
//! cluster into a [`ClusterView`](crate::ClusterView), asks the pure policy ([`plan`](crate::plan)) what to
//! do, and applies the decisions with the store's guarded operations. It runs on every change (announced
//! through a [`ChangeNotifier`]) and at least every [`LoopConfig::interval`].
//!
//! One pass, in order, each step in its own module:
//! 1. [`rescue`]: nodes whose heartbeats stopped are marked lost; their placements, and placements whose
//!    lease ran out, fail (and requeue while the job's restart budget lasts);
//! 2. [`view`]: the rows become the policy's input; placements still stopping hold their devices;
//! 3. [`sweep`]: repairs what a crash between two statements left, and fails placements whose ranks all
//!    ended without a result;
//! 4. [`apply`]: the plan's preemptions and starts, each one guarded statement;
//! 5. [`unplaceable`]: jobs the pool cannot place are marked with the reason, and fail after a grace period.

mod apply;
mod rescue;
mod sweep;
mod unplaceable;
mod view;

pub use view::{read_queue_view, QueueView};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ringtrain_protocol::timing;
use ringtrain_store::{Store, StoreResult};

/// How the loop learns of, and announces, changes to jobs and assignments.
#[async_trait]
pub trait ChangeNotifier: Send + Sync {
    /// The current version: changes made before this call are included in anything read after it.
    fn version(&self) -> u64;
    /// Waits until the version moves past `seen`, or `timeout` passes; returns the version then.
    async fn wait_past(&self, seen: u64, timeout: Duration) -> u64;
    /// Tells every waiter (this server's long polls, the other servers' loops) that something changed.
    async fn announce(&self);
}

/// The default [`LoopConfig::min_pass_gap`]: at most 4 passes a second while changes stream in (an idle
/// loop still starts a pass as soon as a change comes). A job placed a quarter of a second later is not
/// noticed in a run of minutes. At 16 submitters on the 2-core machine a pass under load took tens of
/// milliseconds (the queue read, its specs decoded, every waiting job's reason) and the passes ran back to
/// back; 250 ms apart they gave 2,104-2,364 submissions/s against 1,814-1,947 (`ringtrain-bench api`,
/// 2026-12-04); 100 ms apart changed nothing (the passes were already about that far apart).
pub const MIN_PASS_GAP: Duration = Duration::from_millis(250);

/// The loop's timing and identity.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// The longest time between passes.
    pub interval: Duration,
    /// The shortest time from one pass's start to the next one's, however fast changes come.
    pub min_pass_gap: Duration,
    /// A node whose last heartbeat is older is lost, and its ranks with it.
    pub node_timeout: Duration,
    /// How long a placement lives without a heartbeat from any agent holding one of its ranks.
    pub lease: Duration,
    /// What shapes the policy's input (shared with the API's pending reasons and dry runs).
    pub view: ViewConfig,
    /// Names this server as the owner of the placements it makes.
    pub owner: String,
    /// No node is declared lost before this: a server that just (re)started has not heard any heartbeat
    /// yet, and must not write off every node that kept running while it was down.
    pub no_lost_nodes_before: Option<Instant>,
    /// A queued job the pool as it exists cannot place fails after this long.
    pub unplaceable_grace: Duration,
    /// While set, passes do nothing: a server that is stopping (`ringtrain up` checkpointing its node's
    /// jobs) must not place them again on the devices they are leaving.
    pub paused: Arc<AtomicBool>,
}

impl LoopConfig {
    /// The configuration of a server starting now: lost nodes only once a full node timeout has passed.
    pub fn starting_now(lease: Duration) -> Self {
        let config = LoopConfig { lease, ..LoopConfig::default() };
        LoopConfig { no_lost_nodes_before: Some(Instant::now() + config.node_timeout), ..config }
    }
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            interval: Duration::from_secs(2),
            min_pass_gap: MIN_PASS_GAP,
            node_timeout: timing::NODE_TIMEOUT,
            lease: timing::LEASE,
            view: ViewConfig::default(),
            owner: format!("scheduler-{}", std::process::id()),
            no_lost_nodes_before: None,
            unplaceable_grace: Duration::from_secs(3600),
            paused: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// What shapes the policy's input. The loop and the API's answers (why a job waits, dry runs) read the
/// cluster with the same settings, so they see the same view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewConfig {
    /// How many queued jobs of each team and device kind one pass looks at (the first by priority): a
    /// bound on a pass's work that no team's queue can use to hide another's.
    pub queue_window: i64,
    /// A placement is not preempted before it has run this long (thrash protection): a reclaim waits
    /// instead of stopping a job that has barely started, so no two teams can start and stop each other's
    /// jobs in a loop.
    pub min_run_before_preemption: Duration,
    /// An elastic job grows onto idle devices at most this often: not before its placement has run this
    /// long (each growth is a stop at a checkpoint and a restart).
    pub grow_interval: Duration,
}

impl Default for ViewConfig {
    fn default() -> Self {
        ViewConfig {
            queue_window: 1_000,
            min_run_before_preemption: Duration::from_secs(300),
            grow_interval: Duration::from_secs(300),
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    pub leader: bool,
    pub lost_nodes: usize,
    pub failed_placements: usize,
    pub started: usize,
    pub preempted: usize,
    /// Queued jobs failed because the pool could not place them for the whole grace period.
    pub unplaceable_failed: usize,
    /// Queued jobs left waiting, each with its reason in the plan.
    pub waiting: usize,
}

impl PassReport {
    fn changed_anything(&self) -> bool {
        self.lost_nodes + self.failed_placements + self.started + self.preempted + self.unplaceable_failed > 0
    }
}

/// The scheduler loop of one server.
#[derive(Clone)]
pub struct Scheduler {
    store: Arc<dyn Store>,
    changes: Arc<dyn ChangeNotifier>,
    config: LoopConfig,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("store", &self.store).field("config", &self.config).finish_non_exhaustive()
    }
}

impl Scheduler {
    pub fn new(store: Arc<dyn Store>, changes: Arc<dyn ChangeNotifier>, config: LoopConfig) -> Self {
        Scheduler { store, changes, config }
    }

    /// Runs passes forever: after each one, waits for a change or the interval. While passes fail (the
    /// database is unreachable), no heartbeat can arrive either: the grace before nodes are lost and leases
    /// expire moves on with every failed pass.
    pub async fn run(mut self) {
        let mut was_leader = None;
        loop {
            let seen = self.changes.version();
            let started = Instant::now();
            match self.pass().await {
                Ok(report) => {
                    if was_leader != Some(report.leader) {
                        tracing::info!(leader = report.leader, "scheduler leadership");
                        was_leader = Some(report.leader);
                    }
                    if report.changed_anything() {
                        tracing::info!(?report, ms = started.elapsed().as_secs_f64() * 1e3, "scheduler pass");
                        self.changes.announce().await;
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "scheduler pass failed; retrying");
                    self.config.no_lost_nodes_before = Some(Instant::now() + self.config.node_timeout);
                }
            }
            // Under a stream of changes (a burst of submissions) passes would run back to back, each reading
            // the whole queue: rest as long as the pass took, so the loop takes at most half of a core from
            // the requests it serves, and start passes at least `min_pass_gap` apart, so a stream of cheap
            // passes (each a dozen statements) does not take the database from the submissions that cause it.
            let rest_until = (Instant::now() + started.elapsed()).max(started + self.config.min_pass_gap);
            self.changes.wait_past(seen, self.config.interval).await;
            tokio::time::sleep_until(rest_until.into()).await;
        }
    }

    /// One pass: rescue, read the cluster, sweep, plan, apply.
    #[tracing::instrument(level = "debug", skip(self), fields(owner = %self.config.owner))]
    pub async fn pass(&self) -> StoreResult<PassReport> {
        if self.config.paused.load(Ordering::SeqCst) {
            return Ok(PassReport::default());
        }
        let store = self.store.as_ref();
        let mut report = PassReport { leader: store.try_lead().await?, ..Default::default() };
        if !report.leader {
            return Ok(report);
        }
        rescue::rescue(store, &self.config, &mut report).await?;
        let snapshot = view::Snapshot::read(store, &self.config.view).await?;
        sweep::sweep(store, &snapshot, &mut report).await?;
        let view = snapshot.cluster_view(store).await?.view;
        let plan = crate::plan(&view);
        report.waiting = plan.waiting.len();
        apply::apply(store, &self.config, &snapshot, &plan, &mut report).await?;
        unplaceable::mark(store, &self.config, &snapshot, &plan, &mut report).await?;
        Ok(report)
    }
}
