//! The scheduler loop: one leader per database (a Postgres advisory lock; the one SQLite server) reads the
//! cluster into a [`ClusterView`], asks the pure policy ([`ringtrain_scheduler::plan`]) what to do, and applies
//! the decisions with guarded statements. It runs on every change (an in-process bump, or a Postgres NOTIFY
//! from another server) and at least every `interval`.
//!
//! Besides placing, each pass rescues what died: nodes whose heartbeats stopped are marked lost and their
//! placements failed; placements whose lease ran out (no agent holding one of their ranks heartbeated) are
//! failed; a failed placement is requeued (and resumes from its last checkpoint) while the job's restart
//! budget lasts.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{JobId, JobState};
use ringtrain_scheduler::{
    ClusterView, DeviceSlot, Node as PoolNode, NodeDevice, NodeId, PerKind, QueuedJob, RunningJob, Team as PoolTeam,
    TeamId,
};
use ringtrain_store::{Assignment, Job, NewAssignment, Node, StoreError, StoreResult, Transition};
use uuid::Uuid;

use crate::state::AppState;

/// The loop's timing.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// The longest time between passes.
    pub interval: Duration,
    /// A node whose last heartbeat is older is lost, and its ranks with it.
    pub node_timeout: Duration,
    /// How many queued jobs one pass looks at.
    pub queue_window: i64,
    /// Names this server as the owner of the placements it makes.
    pub owner: String,
    /// No node is declared lost before this: a server that just (re)started has not heard any heartbeat
    /// yet, and must not write off every node that kept running while it was down.
    pub no_lost_nodes_before: Option<std::time::Instant>,
}

impl LoopConfig {
    /// The configuration of a server starting now: lost nodes only once a full node timeout has passed.
    pub fn starting_now() -> Self {
        let config = LoopConfig::default();
        LoopConfig { no_lost_nodes_before: Some(std::time::Instant::now() + config.node_timeout), ..config }
    }
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            interval: Duration::from_secs(2),
            node_timeout: Duration::from_secs(15),
            queue_window: 10_000,
            owner: format!("scheduler-{}", std::process::id()),
            no_lost_nodes_before: None,
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
}

impl PassReport {
    fn changed_anything(&self) -> bool {
        self.lost_nodes + self.failed_placements + self.started + self.preempted > 0
    }
}

/// Runs passes forever: after each one, waits for a change or the interval.
pub async fn run(state: AppState, config: LoopConfig) {
    let mut was_leader = None;
    loop {
        let seen = state.changes.version();
        let started = Instant::now();
        match pass(&state, &config).await {
            Ok(report) => {
                if was_leader != Some(report.leader) {
                    tracing::info!(leader = report.leader, "scheduler leadership");
                    was_leader = Some(report.leader);
                }
                if report.changed_anything() {
                    tracing::info!(?report, ms = started.elapsed().as_secs_f64() * 1e3, "scheduler pass");
                    state.changed().await;
                }
            }
            Err(err) => tracing::warn!(%err, "scheduler pass failed; retrying"),
        }
        state.changes.wait_past(seen, config.interval).await;
    }
}

/// One pass: rescue, then place.
pub async fn pass(state: &AppState, config: &LoopConfig) -> StoreResult<PassReport> {
    let store = state.store.as_ref();
    let mut report = PassReport { leader: store.try_lead().await?, ..Default::default() };
    if !report.leader {
        return Ok(report);
    }
    rescue(state, config, &mut report).await?;

    let nodes: Vec<Node> = store.list_nodes().await?.into_iter().filter(|n| n.state == "up").collect();
    let jobs: HashMap<JobId, Job> = store.active_jobs().await?.into_iter().map(|j| (j.id, j)).collect();
    let live = store.live_assignments().await?;
    let queued = store.list_queued(config.queue_window).await?;
    let teams = store.list_teams().await?;

    let devices = DeviceIndex::new(&nodes);
    let mut view = ClusterView {
        teams: teams
            .iter()
            .map(|t| PoolTeam {
                id: TeamId(t.id),
                guarantee: PerKind { gpu: t.gpu_quota.max(0) as u32, cpu: t.cpu_quota.max(0) as u32 },
                weight: 1,
            })
            .collect(),
        nodes: devices.pool_nodes(&nodes),
        queued: queued
            .iter()
            .map(|j| QueuedJob {
                id: j.id,
                team: TeamId(j.team_id),
                priority: j.priority,
                kind: kind_of(&j.device),
                devices: j.workers.max(0) as u32,
                submit_seq: j.seq.max(0) as u64,
            })
            .collect(),
        running: Vec::new(),
    };

    // Live assignments grouped by placement: the current placement of an active job holds its devices; any
    // other (a cancelled, finished, failed or preempted placement whose ranks are still stopping) holds them
    // too, until its agents report the ranks gone. Those are "preempting": busy, but never chosen again.
    let mut placements: BTreeMap<(Uuid, i32), Vec<&Assignment>> = BTreeMap::new();
    for assignment in &live {
        placements.entry((assignment.job_id, assignment.attempt)).or_default().push(assignment);
    }
    sweep(state, &nodes, &jobs, &placements, &mut report).await?;
    let mut orphans = Vec::new();
    for ((job_id, attempt), ranks) in &placements {
        let slots: Vec<DeviceSlot> = ranks.iter().filter_map(|a| devices.slot(a.device_id)).collect();
        match jobs.get(&JobId(*job_id)) {
            Some(job) if job.attempt == *attempt => view.running.push(RunningJob {
                id: job.id,
                team: TeamId(job.team_id),
                priority: job.priority,
                kind: kind_of(&job.device),
                devices: slots,
                started: job.started_at.unwrap_or(job.updated_at).timestamp_micros().max(0) as u64,
                preemptible: true,
                preempting: false,
            }),
            _ => orphans.push((JobId(ranks[0].id), *job_id, slots)),
        }
    }
    // A job whose previous placement is still stopping waits for it: a preempted placement is writing the
    // checkpoint the next one resumes from.
    let stopping: std::collections::HashSet<Uuid> = orphans.iter().map(|(_, job, _)| *job).collect();
    view.queued.retain(|q| !stopping.contains(&q.id.0));
    for (stand_in, job_id, slots) in orphans {
        // The stand-in id (an assignment id) keeps it apart from the same job queued again.
        let Some(job) = store.get_job(JobId(job_id)).await? else { continue };
        view.running.push(RunningJob {
            id: stand_in,
            team: TeamId(job.team_id),
            priority: job.priority,
            kind: kind_of(&job.device),
            devices: slots,
            started: 0,
            preemptible: false,
            preempting: true,
        });
    }
    // An active placement with no live rank left ended without a result (every rank reported failed, or was
    // cancelled, but nobody reported the outcome): fail it rather than hold it forever.
    for job in jobs.values().filter(|j| !placements.contains_key(&(j.id.0, j.attempt))) {
        // The agent reports the outcome before ending rank 0's assignment; the grace covers a report in
        // flight while the last rank ends.
        let ended = store.job_assignments(job.id, job.attempt).await?.iter().map(|a| a.updated_at).max();
        if ended.is_none_or(|at| ringtrain_store::now() - at > chrono::Duration::seconds(10)) {
            let why = "all its ranks ended without reporting a result";
            report.failed_placements += usize::from(fail_placement(state, job, why).await?);
        }
    }

    let plan = ringtrain_scheduler::plan(&view);
    for preempt in &plan.preemptions {
        let Some(job) = jobs.get(&preempt.job) else { continue };
        if store.preempt_job(job.id, job.attempt, &preempt.reason.to_string()).await?.is_some() {
            report.preempted += 1;
        }
    }
    for start in &plan.starts {
        let ranks: Option<Vec<NewAssignment>> = start
            .devices
            .iter()
            .enumerate()
            .map(|(rank, slot)| {
                devices.device_id(*slot).map(|device_id| NewAssignment {
                    node_id: slot.node.0,
                    device_id,
                    rank: rank as i32,
                })
            })
            .collect();
        let Some(ranks) = ranks else { continue };
        match store.start_job(start.job, &config.owner, state.config.lease, &ranks).await {
            Ok(Some(_)) => report.started += 1,
            Ok(None) => {} // cancelled meanwhile
            Err(StoreError::Conflict(why)) => tracing::info!(job = %start.job, %why, "placement raced; next pass"),
            Err(err) => return Err(err),
        }
    }
    Ok(report)
}

/// Lost nodes and expired leases: their placements fail (and requeue while restarts remain).
async fn rescue(state: &AppState, config: &LoopConfig, report: &mut PassReport) -> StoreResult<()> {
    let store = state.store.as_ref();
    let timeout = chrono::Duration::from_std(config.node_timeout).unwrap_or(chrono::Duration::seconds(15));
    let heard_long_enough = config.no_lost_nodes_before.is_none_or(|at| Instant::now() >= at);
    let lost = if heard_long_enough { store.mark_lost_nodes(ringtrain_store::now() - timeout).await? } else { vec![] };
    for node in lost {
        report.lost_nodes += 1;
        let name = store.get_node(node).await?.map_or_else(|| node.to_string(), |n| n.name);
        tracing::warn!(node = %name, "node lost: no heartbeat for {:?}", config.node_timeout);
        for assignment in store.node_assignments(node, &["pending", "delivered", "running"]).await? {
            if let Some(job) = store.get_job(JobId(assignment.job_id)).await? {
                if job.attempt == assignment.attempt {
                    let why = format!("node {name} was lost (no heartbeat for {} s)", config.node_timeout.as_secs());
                    report.failed_placements += usize::from(fail_placement(state, &job, &why).await?);
                }
            }
        }
        store.end_node_assignments(node, "failed").await?;
    }
    for job in store.expired_leases(ringtrain_store::now(), 100).await? {
        let why = format!(
            "its lease expired: no agent holding one of its ranks heartbeated for {} s",
            state.config.lease.as_secs()
        );
        report.failed_placements += usize::from(fail_placement(state, &job, &why).await?);
    }
    Ok(())
}

/// Repairs what a crash between two statements can leave behind (each is idempotent): live assignments on a
/// node that is not up (it was declared lost, but its assignments were not ended), and pending assignments
/// of a placement that is over (the job was requeued or ended, but they were not cancelled). Either would
/// hold a device, and the job, forever.
async fn sweep(
    state: &AppState,
    up: &[Node],
    active: &HashMap<JobId, Job>,
    placements: &BTreeMap<(Uuid, i32), Vec<&Assignment>>,
    report: &mut PassReport,
) -> StoreResult<()> {
    let store = state.store.as_ref();
    let up: std::collections::HashSet<Uuid> = up.iter().map(|n| n.id).collect();
    let mut gone: Vec<Uuid> = placements.values().flatten().map(|a| a.node_id).filter(|n| !up.contains(n)).collect();
    gone.sort_unstable();
    gone.dedup();
    for node in gone {
        for job in active.values() {
            if placements.get(&(job.id.0, job.attempt)).is_some_and(|r| r.iter().any(|a| a.node_id == node)) {
                report.failed_placements += usize::from(fail_placement(state, job, "its node is lost").await?);
            }
        }
        store.end_node_assignments(node, "failed").await?;
    }
    for ((job_id, attempt), ranks) in placements {
        let over = active.get(&JobId(*job_id)).is_none_or(|job| job.attempt != *attempt);
        // Only when the job has no current placement: cancelling pending ranks is per job.
        if over && !active.contains_key(&JobId(*job_id)) && ranks.iter().any(|a| a.state == "pending") {
            store.cancel_pending_assignments(JobId(*job_id)).await?;
        }
    }
    Ok(())
}

/// Fails the job's current placement: back to the queue while restarts remain (it resumes from its last
/// checkpoint), otherwise failed. Returns whether it changed anything.
pub async fn fail_placement(state: &AppState, job: &Job, why: &str) -> StoreResult<bool> {
    if !matches!(job.state, JobState::Scheduled | JobState::Running) {
        return Ok(false);
    }
    let changed = state.store.transition(&failure_transition(job, why, true)).await?.is_some();
    if changed {
        state.store.cancel_pending_assignments(job.id).await?;
    }
    Ok(changed)
}

/// The guarded change that ends `job`'s current placement as a failure: requeued when `retryable` and
/// restarts remain, else failed with `why` as the job's error.
pub fn failure_transition(job: &Job, why: &str, retryable: bool) -> Transition {
    let (to, reason) = if retryable && job.may_restart() {
        (JobState::Queued, format!("attempt {} failed, retrying: {why}", job.user_attempt()))
    } else {
        (JobState::Failed, format!("attempt {} failed: {why}", job.user_attempt()))
    };
    let mut transition = Transition::new(job.id, job.state, to, reason).at_attempt(job.attempt);
    if to == JobState::Failed {
        transition.error = Some(why.to_string());
    }
    transition
}

fn kind_of(device: &str) -> DeviceKind {
    if device == "gpu" {
        DeviceKind::Gpu
    } else {
        DeviceKind::Cpu
    }
}

/// Device ids ↔ (node, index) slots of the nodes that are up.
#[derive(Debug, Default)]
struct DeviceIndex {
    slots: HashMap<Uuid, DeviceSlot>,
    ids: HashMap<DeviceSlot, Uuid>,
}

impl DeviceIndex {
    fn new(nodes: &[Node]) -> Self {
        let mut index = DeviceIndex::default();
        for node in nodes {
            for device in &node.devices {
                let slot = DeviceSlot { node: NodeId(node.id), index: device.index.max(0) as u32 };
                index.slots.insert(device.id, slot);
                index.ids.insert(slot, device.id);
            }
        }
        index
    }

    fn slot(&self, device: Uuid) -> Option<DeviceSlot> {
        self.slots.get(&device).copied()
    }

    fn device_id(&self, slot: DeviceSlot) -> Option<Uuid> {
        self.ids.get(&slot).copied()
    }

    fn pool_nodes(&self, nodes: &[Node]) -> Vec<PoolNode> {
        nodes
            .iter()
            .map(|node| PoolNode {
                id: NodeId(node.id),
                devices: node
                    .devices
                    .iter()
                    .map(|d| NodeDevice { index: d.index.max(0) as u32, kind: kind_of(&d.kind) })
                    .collect(),
            })
            .collect()
    }
}
