//! When a waiting job will start: the policy played forward in time.
//!
//! Running jobs end when their progress says (iterations left at their current rate); nothing else is
//! known, so the estimate assumes nothing else happens: no new submissions, no failures, and a job that
//! starts during the simulation holds its devices for good (its run time is unknown until it reports a
//! rate). Each step plans the simulated cluster with the real [`plan`], applies its starts and preemptions,
//! and jumps to the next event (a job ending, a preempted job stopping, a job reaching the minimum run time
//! that makes it preemptible). The job's estimate is the time of the step that starts it; when the start
//! depends on jobs whose end is unknown, the estimate is unknown and names them.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::policy::plan::plan;
use crate::policy::types::{ClusterView, JobId, QueuedJob, RunningJob};
use crate::policy::verdict::Verdict;
use crate::policy::waiting::WaitReason;

/// What the simulation knows of the running jobs, in seconds from now.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// When each running job ends, where its rate is known.
    pub ends_in: BTreeMap<JobId, f64>,
    /// When each running job that may not be preempted yet becomes preemptible.
    pub preemptible_in: BTreeMap<JobId, f64>,
    /// How long a preempted job takes to checkpoint and stop.
    pub stop_seconds: f64,
    /// At most this many steps (each one pass of the policy).
    pub max_steps: usize,
}

/// The estimated start of one job.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Estimate {
    /// The next pass starts it.
    Now,
    /// In about `seconds`, once `after` have ended (or stopped, or become preemptible).
    At { seconds: f64, after: Vec<JobId> },
    /// It depends on jobs without a known end (`depends_on`), or the pool can never place it (empty).
    Unknown { depends_on: Vec<JobId> },
}

/// Plays the policy forward until `job` starts.
pub fn estimate_start(view: &ClusterView, job: JobId, timeline: &Timeline) -> Estimate {
    let mut view = view.clone();
    let mut ends: BTreeMap<JobId, f64> = BTreeMap::new();
    let mut unknown_end: Vec<JobId> = Vec::new();
    for running in &view.running {
        match timeline.ends_in.get(&running.id) {
            Some(&end) => {
                ends.insert(running.id, end.max(0.0));
            }
            None if running.preempting => {
                ends.insert(running.id, timeline.stop_seconds);
            }
            None => unknown_end.push(running.id),
        }
    }
    let mut protected: BTreeMap<JobId, f64> = timeline.preemptible_in.clone();
    // work left of jobs preempted during the simulation, for when they start again
    let mut left: BTreeMap<JobId, f64> = BTreeMap::new();
    // stand-in id -> the preempted job it stands for
    let mut stand_ins: BTreeMap<JobId, JobId> = BTreeMap::new();
    let mut now = 0.0;
    let mut after: Vec<JobId> = Vec::new();
    for _ in 0..timeline.max_steps.max(1) {
        let plan = plan(&view);
        match plan.verdict(job) {
            None => return Estimate::Unknown { depends_on: Vec::new() },
            Some(Verdict::Start { .. }) if now == 0.0 => return Estimate::Now,
            Some(Verdict::Start { .. }) => return Estimate::At { seconds: now, after },
            Some(Verdict::Wait {
                reason:
                    WaitReason::TooLarge { .. }
                    | WaitReason::NoDevicesOfKind { .. }
                    | WaitReason::WorkerLargerThanNodes { .. },
                ..
            }) => return Estimate::Unknown { depends_on: Vec::new() },
            Some(_) => {}
        }
        for start in &plan.starts {
            let Some(position) = view.queued.iter().position(|q| q.id == start.job) else { continue };
            let queued = view.queued.swap_remove(position);
            match left.get(&queued.id) {
                Some(&work) => {
                    ends.insert(queued.id, now + work);
                }
                None => unknown_end.push(queued.id),
            }
            view.running.push(RunningJob {
                id: queued.id,
                team: queued.team,
                priority: queued.priority,
                kind: queued.kind,
                devices: start.devices.clone(),
                started: now as u64,
                preemptible: true,
                preempting: false,
                grow_to: Vec::new(),
            });
        }
        for preempt in &plan.preemptions {
            let Some(running) = view.running.iter_mut().find(|r| r.id == preempt.job) else { continue };
            running.preempting = true;
            running.preemptible = false;
            // it goes back to the queue, at the front of its priority class, with its work left
            let work = ends.insert(running.id, now + timeline.stop_seconds).map(|end| end - now);
            if let Some(work) = work {
                left.insert(running.id, work);
            }
            let requeued = QueuedJob {
                id: running.id,
                team: running.team,
                priority: running.priority,
                kind: running.kind,
                devices: running.devices.len() as u32,
                submit_seq: 0,
                larger: Vec::new(),
                // (a running job's own grouping is not known here: the estimate places it anywhere)
                node_group: 1,
            };
            // the stand-in keeps the devices until it has stopped, under another id
            running.id = JobId(uuid::Uuid::from_u128(running.id.0.as_u128() ^ u128::MAX));
            let stand_in = running.id;
            stand_ins.insert(stand_in, requeued.id);
            if let Some(end) = ends.remove(&requeued.id) {
                ends.insert(stand_in, end);
            }
            unknown_end.retain(|j| *j != requeued.id);
            view.queued.push(requeued);
        }
        // the next event: a job ending (or stopping), or one becoming preemptible
        let next_end = ends.values().copied().fold(f64::INFINITY, f64::min);
        let next_protection = protected.values().copied().fold(f64::INFINITY, f64::min);
        let next = next_end.min(next_protection);
        if !next.is_finite() {
            unknown_end.sort_unstable();
            unknown_end.dedup();
            return Estimate::Unknown { depends_on: unknown_end };
        }
        now = next.max(now);
        let ended: Vec<JobId> = ends.iter().filter(|(_, &end)| end <= now).map(|(&id, _)| id).collect();
        let unprotected: Vec<JobId> = protected.iter().filter(|(_, &at)| at <= now).map(|(&id, _)| id).collect();
        ends.retain(|_, end| *end > now);
        protected.retain(|_, at| *at > now);
        view.running.retain(|r| !ended.contains(&r.id));
        for running in view.running.iter_mut().filter(|r| unprotected.contains(&r.id)) {
            running.preemptible = true;
        }
        after = ended.iter().chain(&unprotected).map(|id| *stand_ins.get(id).unwrap_or(id)).collect();
    }
    Estimate::Unknown { depends_on: Vec::new() }
}
