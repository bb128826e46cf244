//! Why a queued job did not start, in numbers and in words: recorded by the pass at the moment it decides
//! (not guessed afterwards), so the reason is the policy's own.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Serialize, Serializer};

use crate::policy::types::{DeviceKind, JobId, NodeId, TeamId};

/// A job the pass did not start, where it stands, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiting {
    pub job: JobId,
    /// 1-based place among the jobs of its device kind that did not start, in the order the pass considered
    /// them: jobs reclaiming their team's guarantee first, then fair-share order. None for jobs the pool
    /// cannot place at all.
    pub position: Option<u32>,
    pub reason: WaitReason,
}

/// One structured reason per waiting job. `free_now` is what was free when the pass reached the job, after
/// the jobs ahead of it took theirs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum WaitReason {
    /// Not enough free devices, and none held for another job would make the difference.
    WaitingForDevices { kind: DeviceKind, needed: u32, free_now: u64, free_within_team_guarantee: u32 },
    /// First in line for its kind: `held` free devices are kept idle for it, and it starts when the jobs
    /// holding the rest end.
    HeadOfLine { kind: DeviceKind, needed: u32, held: u32, awaiting_jobs: Vec<JobId> },
    /// It would fit on the free devices, but they are held for the first job in line.
    HeadOfLineReserved { kind: DeviceKind, needed: u32, free_now: u64, for_job: JobId },
    /// It would fit on the free devices, but they are held for a job reclaiming its team's guarantee.
    BehindReservation { kind: DeviceKind, needed: u32, free_now: u64, job: JobId, nodes: NodeList },
    /// Its team holds its whole guarantee (or more): it may only borrow idle devices, and too few are idle.
    TeamAtGuaranteePoolFull { kind: DeviceKind, needed: u32, used: u32, guarantee: u32, free_now: u64 },
    /// Its team is below its guarantee: these jobs of other teams are being preempted (they checkpoint
    /// first) to give the devices back, and it starts once they have stopped.
    Reclaiming { kind: DeviceKind, needed: u32, victims: Vec<Victim>, stopping_devices: u32 },
    /// Its team is below its guarantee and would reclaim from these jobs, but they have not yet run the
    /// platform's minimum time before a preemption.
    ReclaimAfterMinRunTime { kind: DeviceKind, needed: u32, protected_jobs: Vec<JobId> },
    /// More devices than the pool has of its kind.
    TooLarge { kind: DeviceKind, needed: u32, pool_size: u64 },
    /// Each of its workers needs `per_worker` devices on one node (its pipeline stages), and the pool's nodes,
    /// free or not, hold fewer such workers than it has.
    WorkerLargerThanNodes { kind: DeviceKind, needed: u32, per_worker: u32, largest_node: u32, workers_fit: u64 },
    /// Enough devices are free, but each of its workers needs `per_worker` of them on one node, and the free
    /// devices make only `workers_fit` such workers.
    WaitingForNodeRoom { kind: DeviceKind, needed: u32, per_worker: u32, free_now: u64, workers_fit: u64 },
    /// No node that is up has a device of its kind.
    NoDevicesOfKind { kind: DeviceKind, needed: u32 },
    /// Set by the loop, not the policy: its previous placement is still stopping (writing the checkpoint it
    /// resumes from); it is placed once that has ended.
    PreviousPlacementStopping,
    /// Set by the loop: its team has more queued jobs of its kind ahead of it than one pass looks at.
    BeyondQueueWindow { window: i64 },
    /// Devices are free for it: the next pass starts it.
    StartingNextPass,
    /// Set by the loop: its team used its budget of device-hours for the current period; its jobs wait
    /// until the next period begins.
    BudgetExhausted {
        used_device_seconds: u64,
        budget_device_seconds: u64,
        period: String,
        resets_at: chrono::DateTime<chrono::Utc>,
    },
}

/// Nodes a reason names, sorted, shared: a pass names the same reserved nodes in the reason of every job
/// behind the reservation (82k of 100k queued jobs in `ringtrain-bench scheduler`'s large cluster), and a copy each was
/// the largest cost of that pass after the walks themselves. Serialized as a plain array.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeList(Arc<[NodeId]>);

impl From<Vec<NodeId>> for NodeList {
    fn from(nodes: Vec<NodeId>) -> Self {
        NodeList(nodes.into())
    }
}

impl Deref for NodeList {
    type Target = [NodeId];

    fn deref(&self) -> &[NodeId] {
        &self.0
    }
}

impl Serialize for NodeList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter())
    }
}

/// A job preempted for a reclaim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Victim {
    pub job: JobId,
    pub team: TeamId,
}

impl WaitReason {
    /// The reason's code, as serialized.
    pub fn code(&self) -> &'static str {
        match self {
            WaitReason::WaitingForDevices { .. } => "waiting_for_devices",
            WaitReason::HeadOfLine { .. } => "head_of_line",
            WaitReason::HeadOfLineReserved { .. } => "head_of_line_reserved",
            WaitReason::BehindReservation { .. } => "behind_reservation",
            WaitReason::TeamAtGuaranteePoolFull { .. } => "team_at_guarantee_pool_full",
            WaitReason::Reclaiming { .. } => "reclaiming",
            WaitReason::ReclaimAfterMinRunTime { .. } => "reclaim_after_min_run_time",
            WaitReason::TooLarge { .. } => "too_large",
            WaitReason::WorkerLargerThanNodes { .. } => "worker_larger_than_nodes",
            WaitReason::WaitingForNodeRoom { .. } => "waiting_for_node_room",
            WaitReason::NoDevicesOfKind { .. } => "no_devices_of_kind",
            WaitReason::PreviousPlacementStopping => "previous_placement_stopping",
            WaitReason::BeyondQueueWindow { .. } => "beyond_queue_window",
            WaitReason::StartingNextPass => "starting_next_pass",
            WaitReason::BudgetExhausted { .. } => "budget_exhausted",
        }
    }

    /// Every code, for documentation and tests.
    pub const CODES: [&'static str; 15] = [
        "waiting_for_devices",
        "head_of_line",
        "head_of_line_reserved",
        "behind_reservation",
        "team_at_guarantee_pool_full",
        "reclaiming",
        "reclaim_after_min_run_time",
        "too_large",
        "worker_larger_than_nodes",
        "waiting_for_node_room",
        "no_devices_of_kind",
        "previous_placement_stopping",
        "beyond_queue_window",
        "starting_next_pass",
        "budget_exhausted",
    ];
}

/// "1 cpu device" / "3 gpu devices".
fn devices(n: impl Into<u64>, kind: DeviceKind) -> String {
    let n = n.into();
    format!("{n} {} device{}", kind.as_str(), if n == 1 { "" } else { "s" })
}

/// "1 worker" / "3 workers".
fn workers(n: u64) -> String {
    format!("{n} worker{}", if n == 1 { "" } else { "s" })
}

/// "no such worker" / "1 such worker" / "2 such workers".
fn such_workers(n: u64) -> String {
    match n {
        0 => "no such worker".to_string(),
        1 => "1 such worker".to_string(),
        n => format!("{n} such workers"),
    }
}

/// "job a, job b and 3 more".
fn jobs(ids: &[JobId]) -> String {
    const SHOWN: usize = 3;
    let mut text = ids.iter().take(SHOWN).map(|id| format!("job {id}")).collect::<Vec<_>>().join(", ");
    if ids.len() > SHOWN {
        text.push_str(&format!(" and {} more", ids.len() - SHOWN));
    }
    text
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitReason::WaitingForDevices { kind, needed, free_now, free_within_team_guarantee } => write!(
                f,
                "needs {}; {} free now (the team has {} of its guarantee unused)",
                devices(*needed, *kind),
                free_now,
                free_within_team_guarantee
            ),
            WaitReason::HeadOfLine { kind, needed, held, awaiting_jobs } => {
                write!(f, "first in line for {}: {} kept free for it so far", devices(*needed, *kind), held)?;
                if awaiting_jobs.is_empty() {
                    write!(f, "; it starts when the devices being freed have stopped")
                } else {
                    write!(
                        f,
                        "; it starts when {} end{}",
                        jobs(awaiting_jobs),
                        if awaiting_jobs.len() == 1 { "s" } else { "" }
                    )
                }
            }
            WaitReason::HeadOfLineReserved { kind, needed, free_now, for_job } => write!(
                f,
                "needs {}; {} free, but they are held for job {} (first in line)",
                devices(*needed, *kind),
                free_now,
                for_job
            ),
            WaitReason::BehindReservation { kind, needed, free_now, job, nodes } => write!(
                f,
                "needs {}; {} free, but devices on {} node{} are held for job {}, which reclaims its team's guarantee",
                devices(*needed, *kind),
                free_now,
                nodes.len(),
                if nodes.len() == 1 { "" } else { "s" },
                job
            ),
            WaitReason::TeamAtGuaranteePoolFull { kind, needed, used, guarantee, free_now } => write!(
                f,
                "needs {}; the team holds {}, at or beyond its guarantee of {}, so it may only borrow idle devices, \
                 and {} free",
                devices(*needed, *kind),
                used,
                guarantee,
                if *free_now == 1 { "1 is".to_string() } else { format!("{free_now} are") }
            ),
            WaitReason::Reclaiming { kind, needed, victims, stopping_devices } => {
                write!(f, "reclaiming the team's guarantee for {}", devices(*needed, *kind))?;
                if !victims.is_empty() {
                    let ids: Vec<JobId> = victims.iter().map(|v| v.job).collect();
                    write!(f, ": preempting {} (checkpointing first)", jobs(&ids))?;
                }
                if *stopping_devices > 0 {
                    write!(f, "; {stopping_devices} being freed by earlier preemptions")?;
                }
                Ok(())
            }
            WaitReason::ReclaimAfterMinRunTime { kind, needed, protected_jobs } => write!(
                f,
                "needs {} within the team's guarantee; it reclaims them from {} once they have run the platform's \
                 minimum time before preemption",
                devices(*needed, *kind),
                jobs(protected_jobs)
            ),
            WaitReason::TooLarge { kind, needed, pool_size } => {
                write!(f, "needs {}; the pool has {}", devices(*needed, *kind), pool_size)
            }
            WaitReason::WorkerLargerThanNodes { kind, needed, per_worker, largest_node, workers_fit } => write!(
                f,
                "needs {}, as {} of {per_worker} devices on one node (each worker's pipeline stages); the largest \
                 node has {largest_node}, and the pool's nodes hold {}",
                devices(*needed, *kind),
                workers(u64::from(needed / per_worker.max(&1))),
                such_workers(*workers_fit)
            ),
            WaitReason::WaitingForNodeRoom { kind, needed, per_worker, free_now, workers_fit } => write!(
                f,
                "needs {}, as {} of {per_worker} devices on one node (each worker's pipeline stages); {free_now} \
                 are free, but they make {}",
                devices(*needed, *kind),
                workers(u64::from(needed / per_worker.max(&1))),
                such_workers(*workers_fit)
            ),
            WaitReason::NoDevicesOfKind { kind, needed } => {
                write!(f, "needs {}; no node that is up offers any", devices(*needed, *kind))
            }
            WaitReason::PreviousPlacementStopping => {
                write!(f, "its previous placement is still stopping (writing the checkpoint it resumes from)")
            }
            WaitReason::BeyondQueueWindow { window } => write!(
                f,
                "its team has at least {window} queued jobs of its kind ahead of it; a pass looks at the first \
                 {window}"
            ),
            WaitReason::StartingNextPass => write!(f, "devices are free for it; the next scheduler pass starts it"),
            WaitReason::BudgetExhausted { used_device_seconds, budget_device_seconds, period, resets_at } => write!(
                f,
                "the team used {:.2} of its {:.2} device-hours this {period}; its jobs wait until the budget resets at \
                 {}",
                *used_device_seconds as f64 / 3600.0,
                *budget_device_seconds as f64 / 3600.0,
                resets_at.format("%Y-%m-%d %H:%M UTC")
            ),
        }
    }
}
