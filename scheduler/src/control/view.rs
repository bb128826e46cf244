//! The rows one pass reads, and the policy's input built from them. Device ids map to (node, index) slots;
//! live assignments are grouped by placement: the current placement of an active job holds its devices as a
//! running job, and any other (cancelled, finished, failed or preempted, its ranks still stopping) holds them
//! as a "preempting" stand-in — busy, but never chosen again.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{DeviceId, JobId, NodeState, TeamId};
use ringtrain_store::{Assignment, Job, Node, Store, StoreResult, Team};

use super::ViewConfig;
use crate::{ClusterView, DeviceSlot, Node as PoolNode, NodeDevice, PerKind, QueuedJob, RunningJob, WaitReason};

/// One placement: (job, attempt).
pub(super) type PlacementKey = (JobId, i32);

/// The policy's input as a pass would build it now, and what the policy does not see: the API reads this
/// to say why a job waits and to answer dry runs with the loop's own view.
#[derive(Debug, Clone)]
pub struct QueueView {
    pub view: ClusterView,
    /// Queued jobs left out because their previous placement is still stopping.
    pub stopping: HashSet<JobId>,
    /// Teams whose budget of device-hours for the current period is used up: their queued jobs are left
    /// out, each waiting with this reason.
    pub over_budget: HashMap<TeamId, WaitReason>,
    /// When each running job's current placement started.
    pub placed_at: HashMap<JobId, DateTime<Utc>>,
    /// The settings it was read with.
    pub config: ViewConfig,
}

/// Reads the cluster as the next pass would (without the pass's repairs).
pub async fn read_queue_view(store: &dyn Store, config: &ViewConfig) -> StoreResult<QueueView> {
    Snapshot::read(store, config).await?.cluster_view(store).await
}

/// What a pass reads from the store, once.
#[derive(Debug)]
pub(super) struct Snapshot {
    /// Nodes that are up.
    pub up: Vec<Node>,
    /// Jobs holding devices (scheduled or running), by id.
    pub active: HashMap<JobId, Job>,
    /// Live assignments by placement.
    pub placements: BTreeMap<PlacementKey, Vec<Assignment>>,
    pub queued: Vec<Job>,
    pub teams: Vec<Team>,
    pub devices: DeviceIndex,
    pub config: ViewConfig,
    pub over_budget: HashMap<TeamId, WaitReason>,
}

impl Snapshot {
    pub async fn read(store: &dyn Store, config: &ViewConfig) -> StoreResult<Snapshot> {
        let up: Vec<Node> = store.list_nodes().await?.into_iter().filter(|n| n.state == NodeState::Up).collect();
        let active = store.active_jobs().await?.into_iter().map(|j| (j.id, j)).collect();
        let mut placements: BTreeMap<PlacementKey, Vec<Assignment>> = BTreeMap::new();
        for assignment in store.live_assignments().await? {
            placements.entry((assignment.job_id, assignment.attempt)).or_default().push(assignment);
        }
        let queued = store.list_queued(config.queue_window).await?;
        let teams = store.list_teams().await?;
        let devices = DeviceIndex::new(&up);
        let over_budget = over_budget(store, &teams).await?;
        Ok(Snapshot { up, active, placements, queued, teams, devices, config: *config, over_budget })
    }

    /// The policy's input. Jobs whose previous placement is still stopping wait for it (a preempted
    /// placement is writing the checkpoint the next one resumes from).
    pub async fn cluster_view(&self, store: &dyn Store) -> StoreResult<QueueView> {
        let now = ringtrain_store::now();
        let min_run =
            chrono::Duration::from_std(self.config.min_run_before_preemption).unwrap_or(chrono::Duration::MAX);
        let grow_after = chrono::Duration::from_std(self.config.grow_interval).unwrap_or(chrono::Duration::MAX);
        let mut placed_at = HashMap::new();
        let mut view = ClusterView {
            teams: self.teams.iter().map(pool_team).collect(),
            nodes: self.devices.pool_nodes(&self.up),
            queued: self.queued.iter().map(queued_job).collect(),
            running: Vec::new(),
        };
        let mut stopping = HashSet::new();
        // a placement with a rank on a node in quarantine does not grow: growing restarts it, and its
        // devices there are out of the pool it would restart in
        let quarantined: HashSet<_> = self.up.iter().filter(|n| n.quarantine.is_some()).map(|n| n.id).collect();
        for (&(job_id, attempt), ranks) in &self.placements {
            let slots: Vec<DeviceSlot> = ranks.iter().filter_map(|a| self.devices.slot(a.device_id)).collect();
            if let Some(job) = self.active.get(&job_id).filter(|j| j.attempt == attempt) {
                // the placement's own start: a job resumed after a preemption has only just started again
                let placed = ranks.iter().map(|a| a.created_at).min().unwrap_or(job.updated_at);
                placed_at.insert(job.id, placed);
                let held = slots.len() as u32;
                // a placement grows only while all its ranks train: not while starting, nor once some ended
                let whole = ranks.len() as i32 == ranks[0].world_size
                    && ranks.iter().all(|a| a.state == ringtrain_core::AssignmentState::Running)
                    && !ranks.iter().any(|a| quarantined.contains(&a.node_id));
                view.running.push(RunningJob {
                    id: job.id,
                    team: job.team_id,
                    priority: job.priority,
                    kind: job.device,
                    devices: slots,
                    started: placed.timestamp_micros().max(0) as u64,
                    preemptible: now - placed >= min_run,
                    preempting: false,
                    grow_to: grow_to(job, held, whole && now - placed >= min_run.max(grow_after)),
                });
                continue;
            }
            stopping.insert(job_id);
            let Some(job) = store.get_job(job_id).await? else { continue };
            view.running.push(RunningJob {
                // An assignment id as a stand-in job id keeps it apart from the same job queued again.
                id: JobId(ranks[0].id.0),
                team: job.team_id,
                priority: job.priority,
                kind: job.device,
                devices: slots,
                started: 0,
                preemptible: false,
                preempting: true,
                grow_to: Vec::new(),
            });
        }
        view.queued.retain(|q| !stopping.contains(&q.id) && !self.over_budget.contains_key(&q.team));
        let over_budget = self.over_budget.clone();
        Ok(QueueView { view, stopping, over_budget, placed_at, config: self.config })
    }
}

/// Teams with a budget whose usage in the current period reached it, each with its reason. Only teams with
/// a budget cost a read (their spans since the period began).
async fn over_budget(store: &dyn Store, teams: &[Team]) -> StoreResult<HashMap<TeamId, WaitReason>> {
    let now = ringtrain_store::now();
    let mut over = HashMap::new();
    for team in teams {
        let Some(budget) = team.budget else { continue };
        let (_, next, used) = ringtrain_store::period_use(store, team.id, budget.period, now).await?;
        let limit = budget.device_hours * 3600.0;
        if used >= limit {
            over.insert(
                team.id,
                WaitReason::BudgetExhausted {
                    used_device_seconds: used as u64,
                    budget_device_seconds: limit as u64,
                    period: budget.period.as_str().to_string(),
                    resets_at: next,
                },
            );
        }
    }
    Ok(over)
}

fn pool_team(team: &Team) -> crate::Team {
    crate::Team {
        id: team.id,
        guarantee: PerKind { gpu: team.gpu_quota.max(0) as u32, cpu: team.cpu_quota.max(0) as u32 },
        weight: team.weight.max(1) as u32,
    }
}

/// A queued job as the policy sees it: the smallest device count it may run on, and its larger ones.
fn queued_job(job: &Job) -> QueuedJob {
    let mut counts = job.spec.allowed_total_device_counts();
    let devices = if counts.is_empty() { job.devices.max(0) as u32 } else { counts.remove(0) };
    QueuedJob {
        id: job.id,
        team: job.team_id,
        priority: job.priority,
        kind: job.device,
        devices,
        submit_seq: job.seq.max(0) as u64,
        larger: counts,
        node_group: job.spec.stages(),
    }
}

/// The counts a running elastic job may grow to from `held` devices, once its placement has run long enough.
fn grow_to(job: &Job, held: u32, may_grow: bool) -> Vec<u32> {
    match may_grow && job.spec.is_elastic() {
        true => job.spec.allowed_total_device_counts().into_iter().filter(|&count| count > held).collect(),
        false => Vec::new(),
    }
}

/// Device ids ↔ (node, index) slots of the nodes that are up.
#[derive(Debug, Default)]
pub(super) struct DeviceIndex {
    slots: HashMap<DeviceId, DeviceSlot>,
    ids: HashMap<DeviceSlot, DeviceId>,
}

impl DeviceIndex {
    fn new(nodes: &[Node]) -> Self {
        let mut index = DeviceIndex::default();
        for node in nodes {
            for device in &node.devices {
                let slot = DeviceSlot { node: node.id, index: device.index.max(0) as u32 };
                index.slots.insert(device.id, slot);
                index.ids.insert(slot, device.id);
            }
        }
        index
    }

    pub fn slot(&self, device: DeviceId) -> Option<DeviceSlot> {
        self.slots.get(&device).copied()
    }

    pub fn device_id(&self, slot: DeviceSlot) -> Option<DeviceId> {
        self.ids.get(&slot).copied()
    }

    /// The nodes the policy may place on: a node in quarantine is left out (its running placements go on:
    /// their devices stay in this index, so their ranks are not taken for lost).
    fn pool_nodes(&self, nodes: &[Node]) -> Vec<PoolNode> {
        let device = |kind: DeviceKind, index: i32| NodeDevice { index: index.max(0) as u32, kind };
        nodes
            .iter()
            .filter(|node| node.quarantine.is_none())
            .map(|node| PoolNode {
                id: node.id,
                devices: node.devices.iter().map(|d| device(d.kind, d.index)).collect(),
            })
            .collect()
    }
}
