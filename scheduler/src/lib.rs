//! ringtrain's scheduler: the placement policy and the loop that applies it.
//!
//! - [`policy`]: a pure function from a snapshot of the cluster (queued jobs, running jobs, nodes and their
//!   devices, team guarantees and weights) to a [`Plan`] (start these jobs on these devices, preempt those,
//!   hold these devices). No database, no clock, no randomness.
//! - [`control`]: the loop. One leader per database reads the store into a [`ClusterView`], calls [`plan`],
//!   and writes the decisions with the store's guarded operations; it also rescues what died (lost nodes,
//!   expired leases) and sweeps what a crash left behind. `ringtrain serve` only starts it.

pub mod control;
pub mod policy;

pub use control::{read_queue_view, ChangeNotifier, LoopConfig, PassReport, QueueView, Scheduler, ViewConfig};
pub use policy::{
    dry_run, estimate_start, plan, ClusterView, DeviceKind, DeviceSlot, DryRun, Estimate, Node, NodeDevice, NodeId,
    NodeList, PerKind, Plan, Preempt, PreemptReason, QueuedJob, Reservation, ReservationKind, RunningJob, Start, Team,
    TeamId, Timeline, Verdict, Victim, WaitReason, Waiting,
};
