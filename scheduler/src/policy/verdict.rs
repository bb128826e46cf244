//! What a plan decides for one job ([`Plan::verdict`]), and the dry run of a submission ([`dry_run`]): the
//! same policy on the same view with the job added, so a dry run answers exactly what the next pass would do
//! with that view.

use serde::Serialize;

use crate::policy::plan::plan;
use crate::policy::types::{ClusterView, DeviceSlot, JobId, NodeId, Plan, QueuedJob, ReservationKind};
use crate::policy::waiting::WaitReason;

/// The policy's decision for one queued job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// It starts now, rank r on `devices[r]`.
    Start {
        devices: Vec<DeviceSlot>,
        nodes: Vec<NodeId>,
        /// Devices within its team's guarantee, and borrowed beyond it (which a team below its guarantee
        /// may reclaim by preemption).
        within_guarantee: u32,
        borrowed: u32,
    },
    /// It reclaims its team's guarantee: the jobs the reason names are preempted (checkpointing first), and
    /// it starts on `held` and `awaiting` once they have stopped.
    Reclaim { held: Vec<DeviceSlot>, awaiting: Vec<DeviceSlot>, position: Option<u32>, reason: WaitReason },
    /// It waits.
    Wait { position: Option<u32>, reason: WaitReason },
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Start { .. } => "start",
            Verdict::Reclaim { .. } => "reclaim",
            Verdict::Wait { .. } => "wait",
        }
    }
}

impl Plan {
    /// The decision for queued job `job`; None when the view did not list it.
    pub fn verdict(&self, job: JobId) -> Option<Verdict> {
        if let Some(start) = self.starts.iter().find(|s| s.job == job) {
            let mut nodes: Vec<NodeId> = start.devices.iter().map(|d| d.node).collect();
            nodes.dedup();
            let total = start.devices.len() as u32;
            return Some(Verdict::Start {
                devices: start.devices.clone(),
                nodes,
                within_guarantee: total - start.borrowed,
                borrowed: start.borrowed,
            });
        }
        let waiting = self.waiting.iter().find(|w| w.job == job)?;
        let (position, reason) = (waiting.position, waiting.reason.clone());
        let reclaim = self.reservations.iter().find(|r| r.job == job && r.kind == ReservationKind::Reclaim);
        Some(match reclaim {
            Some(r) => Verdict::Reclaim { held: r.held.clone(), awaiting: r.awaiting.clone(), position, reason },
            None => Verdict::Wait { position, reason },
        })
    }
}

/// A dry run's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DryRun {
    #[serde(flatten)]
    pub verdict: Verdict,
    /// Other jobs the pass would start without this one and does not with it: what the submission does to
    /// the queue besides any preemption.
    pub delays: Vec<JobId>,
}

/// Plans `view` with `job` added to the queue. None when the job asks for no devices (nothing to plan).
pub fn dry_run(view: &ClusterView, job: QueuedJob) -> Option<DryRun> {
    let id = job.id;
    let without = plan(view);
    let mut with_job = view.clone();
    with_job.queued.push(job);
    let with = plan(&with_job);
    let verdict = with.verdict(id)?;
    let delays = without.starts.iter().map(|s| s.job).filter(|j| !with.starts.iter().any(|s| s.job == *j)).collect();
    Some(DryRun { verdict, delays })
}
