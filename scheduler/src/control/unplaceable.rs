//! Jobs the pool as it exists cannot place (more devices than it has of their kind, none of their kind,
//! or workers whose pipeline stages no node can hold together): the policy lists them (`Plan::too_large`) and gives them no reservation; here each is marked with
//! the reason in words, so its view says why it waits, and failed once it has been unplaceable for the
//! platform's grace period, so it never waits silently forever. A job the pool can place again (a node
//! came back, a larger one joined) loses its mark.

use std::collections::{BTreeMap, HashSet};

use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{JobId, JobState};
use ringtrain_store::{Job, Store, StoreResult, Transition};

use super::view::Snapshot;
use super::{LoopConfig, PassReport};
use crate::{Plan, WaitReason};

pub(super) async fn mark(
    store: &dyn Store,
    config: &LoopConfig,
    snapshot: &Snapshot,
    plan: &Plan,
    report: &mut PassReport,
) -> StoreResult<()> {
    let too_large: HashSet<JobId> = plan.too_large.iter().copied().collect();
    let now = ringtrain_store::now();
    let grace = chrono::Duration::from_std(config.unplaceable_grace).unwrap_or(chrono::Duration::MAX);
    // jobs to mark, by reason (None: placeable again), each reason's in one statement
    let mut marks: BTreeMap<Option<String>, Vec<JobId>> = BTreeMap::new();
    for job in &snapshot.queued {
        if !too_large.contains(&job.id) {
            if job.unplaceable.is_some() {
                marks.entry(None).or_default().push(job.id);
            }
            continue;
        }
        let reason = match plan.waiting.iter().find(|w| w.job == job.id).map(|w| &w.reason) {
            // a job whose workers no node can hold: the policy's own words (the pool may hold its count)
            Some(why @ WaitReason::WorkerLargerThanNodes { .. }) => why.to_string(),
            _ => reason(job, capacity(snapshot, job.device)),
        };
        match &job.unplaceable {
            Some(mark) if now - mark.since >= grace => {
                let why = format!("cannot be placed: {reason} (for longer than the platform's grace period)");
                let mut failed = Transition::new(job.id, JobState::Queued, JobState::Failed, why.clone());
                failed.error = Some(why);
                if store.transition(&failed).await?.is_some() {
                    report.unplaceable_failed += 1;
                }
            }
            Some(mark) if mark.reason == reason => {}
            _ => marks.entry(Some(reason)).or_default().push(job.id),
        }
    }
    for (reason, jobs) in &marks {
        store.mark_unplaceable(jobs, reason.as_deref()).await?;
    }
    Ok(())
}

/// Devices of `kind` on the nodes that are up and not in quarantine (as the policy sees the pool).
fn capacity(snapshot: &Snapshot, kind: DeviceKind) -> usize {
    let placeable = snapshot.up.iter().filter(|node| node.quarantine.is_none());
    placeable.flat_map(|node| &node.devices).filter(|device| device.kind == kind).count()
}

fn reason(job: &Job, capacity: usize) -> String {
    let (k, kind) = (job.devices, job.device.as_str());
    if capacity == 0 {
        format!("needs {k} {kind} devices; no node that is up offers any")
    } else {
        format!("needs {k} {kind} devices; the pool has {capacity}")
    }
}
