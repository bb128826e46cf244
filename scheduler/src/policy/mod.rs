//! The placement policy: a pure function from a snapshot of the cluster (queued jobs, running jobs, nodes and
//! their devices, team guarantees and weights) to a [`Plan`] (start these jobs on these devices, preempt
//! those, hold these devices). No database, no clock, no randomness.
//!
//! The rules, each in its own module:
//! - gang placement with locality (`placement`): all k devices at once, one kind, fewest nodes, best fit;
//! - quotas and weighted fair share (`fairness`): guarantees first, idle capacity borrowed by weight;
//! - reclaim (`preemption`): a team below its guarantee preempts a minimal set of borrowers;
//! - no starvation (`reservation`): the first job that cannot start holds devices; others backfill around.
//!
//! Every job that does not start gets its place in the queue and a reason (`waiting`), and a plan answers
//! for any one job (`verdict`), which is also the dry run of a submission.

mod estimate;
mod fairness;
mod id_hash;
mod index;
mod placement;
mod plan;
mod preemption;
mod reservation;
pub mod types;
mod verdict;
mod waiting;

pub use estimate::{estimate_start, Estimate, Timeline};
pub use plan::plan;
pub use types::{
    ClusterView, DeviceKind, DeviceSlot, Node, NodeDevice, NodeId, NodeList, PerKind, Plan, Preempt, PreemptReason,
    QueuedJob, Reservation, ReservationKind, RunningJob, Start, Team, TeamId, Victim, WaitReason, Waiting,
};
pub use verdict::{dry_run, DryRun, Verdict};
