//! The policy's input (a snapshot of the cluster) and output (a plan). Plain data: the scheduler loop maps
//! database rows into these and the plan's decisions back into guarded statements.

use std::fmt;

pub use ringtrain_core::spec::DeviceKind;
pub use ringtrain_core::{JobId, NodeId, TeamId};
use serde::Serialize;

pub use crate::policy::waiting::{NodeList, Victim, WaitReason, Waiting};

/// One device of the pool: a node and the device's index on it (CUDA ordinal, or CPU slot number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DeviceSlot {
    pub node: NodeId,
    pub index: u32,
}

/// A number of devices of each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct PerKind {
    pub gpu: u32,
    pub cpu: u32,
}

impl PerKind {
    pub fn get(&self, kind: DeviceKind) -> u32 {
        match kind {
            DeviceKind::Gpu => self.gpu,
            DeviceKind::Cpu => self.cpu,
        }
    }
}

/// A team's share of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Team {
    pub id: TeamId,
    /// Devices of each kind the team is guaranteed: it may always get back up to this many by reclaiming
    /// devices other teams borrowed (`teams.gpu_quota` / `teams.cpu_quota`).
    pub guarantee: PerKind,
    /// The team's weight in the division of idle capacity beyond guarantees; 0 is treated as 1.
    pub weight: u32,
}

/// A job waiting to be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedJob {
    pub id: JobId,
    pub team: TeamId,
    /// Higher runs first, within its team only (`spec.priority`).
    pub priority: i32,
    /// The kind every one of its devices must be (`spec.device`).
    pub kind: DeviceKind,
    /// The devices it needs, all at once: its spec's device count, or for an elastic job the smallest count
    /// it may run on.
    pub devices: u32,
    /// An elastic job's larger counts, ascending (empty for a fixed job): it starts on the largest that fits.
    pub larger: Vec<u32>,
    /// Devices that must lie on one node together: each worker's pipeline stages (its spec's
    /// `devices_per_worker`), which pass activations to each other every micro-batch. 1: any device
    /// anywhere. `devices` is a multiple of it.
    pub node_group: u32,
    /// Submission order (`jobs.seq`): earlier first among equal priorities. A preempted job keeps its seq,
    /// so it goes back to the front of its priority class.
    pub submit_seq: u64,
}

/// A job that holds devices: scheduled (assignments written) or running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    pub id: JobId,
    pub team: TeamId,
    pub priority: i32,
    pub kind: DeviceKind,
    /// The devices it holds, one per rank.
    pub devices: Vec<DeviceSlot>,
    /// When it started, as any value that increases with time (e.g. microseconds since the epoch): among
    /// otherwise equal victims, the most recent start is preempted first, as it has the least work to lose.
    pub started: u64,
    /// False for jobs that must not be preempted (the loop's choice, e.g. a job that cannot checkpoint).
    pub preemptible: bool,
    /// A preemption was already decided in an earlier pass and the job is checkpointing: its devices will be
    /// free soon and are not counted as its team's borrowing any more, and it is never chosen again.
    pub preempting: bool,
    /// The larger counts an elastic job may grow to now, ascending: empty for a fixed job, one at its most,
    /// or one placed less than the grow interval ago (the loop's choice).
    pub grow_to: Vec<u32>,
}

/// A node and all its devices, busy or not; a device is free when no running job holds it. Lost nodes are
/// left out by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: NodeId,
    pub devices: Vec<NodeDevice>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeDevice {
    pub index: u32,
    pub kind: DeviceKind,
}

/// Everything the policy looks at. The order of every list is irrelevant: the plan depends only on the
/// contents (ids and ordinal fields break every tie).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub teams: Vec<Team>,
    pub nodes: Vec<Node>,
    pub queued: Vec<QueuedJob>,
    pub running: Vec<RunningJob>,
}

/// Start `job` on `devices`; rank r runs on `devices[r]` (sorted by node, then index, so a node's ranks are
/// neighbours in the ring).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Start {
    pub job: JobId,
    pub team: TeamId,
    pub devices: Vec<DeviceSlot>,
    /// How many of its devices lie beyond the team's guarantee: borrowed idle capacity, which a team below
    /// its guarantee may reclaim by preemption.
    pub borrowed: u32,
}

/// Stop `job` (after a checkpoint) and requeue it. A preemption is not a failure: the loop must leave the
/// job's `attempt` and restart budget unchanged, and the job resumes from its checkpoint when placed again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Preempt {
    pub job: JobId,
    pub reason: PreemptReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PreemptReason {
    /// Its team holds devices beyond its guarantee, and `team`, below its guarantee, needs them for `for_job`.
    Reclaim { team: TeamId, for_job: JobId },
    /// An elastic job grows onto idle devices nobody waits for: it stops at a checkpoint and starts again on
    /// `to` devices (its own and idle ones).
    Grow { from: u32, to: u32 },
}

/// The text the preempted job's team reads in its events: it names neither the other team nor its job
/// (the scheduler's log has both).
impl fmt::Display for PreemptReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreemptReason::Reclaim { .. } => write!(f, "reclaimed by another team, below its guarantee"),
            PreemptReason::Grow { from, to } => {
                write!(f, "growing from {from} to {to} devices onto idle ones (a stop at a checkpoint, then a start)")
            }
        }
    }
}

/// Devices set aside for a job that could not start in this pass. Nothing else starts on `held`; the job
/// starts on them (or better) once the `awaiting` devices are freed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reservation {
    pub job: JobId,
    pub kind: ReservationKind,
    /// Free now, kept idle for the job.
    pub held: Vec<DeviceSlot>,
    /// Busy now (running or being preempted); the job waits for these.
    pub awaiting: Vec<DeviceSlot>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservationKind {
    /// The job reclaims its team's guarantee: `awaiting` are devices of preempted jobs.
    Reclaim,
    /// The first job of its device kind, in fair-share order, that could not start: held so that smaller jobs
    /// cannot starve it.
    HeadOfLine,
}

/// The decisions of one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub starts: Vec<Start>,
    pub preemptions: Vec<Preempt>,
    pub reservations: Vec<Reservation>,
    /// Jobs needing more devices of their kind than all listed nodes have together: they wait without a
    /// reservation (holding devices for them would idle the pool for nothing).
    pub too_large: Vec<JobId>,
    /// Every queued job that did not start, with its place in the queue and the reason; per device kind
    /// (GPUs first): the jobs the pool cannot place, then the rest in queue order.
    pub waiting: Vec<Waiting>,
}
