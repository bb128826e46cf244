//! Sweep: repairs what a crash between two statements can leave behind (each step is idempotent), and
//! ends placements that nobody will report on.
//! - Live assignments on a node that is not up (it was declared lost, but its assignments were not ended).
//! - Pending assignments of a placement that is over (the job was requeued or ended, but they were not
//!   cancelled).
//! - An active placement with no live rank left (every rank reported failed or cancelled, but nobody
//!   reported the outcome) fails rather than holding the job forever.
//!
//! Either of the first two would hold a device, and the job, forever.

use std::collections::HashSet;

use ringtrain_core::{AssignmentState, NodeId};
use ringtrain_store::{Store, StoreResult};

use super::view::Snapshot;
use super::PassReport;

/// How long an active placement with no live rank left waits before it fails: the agent reports the outcome
/// before ending rank 0's assignment, and this covers a report in flight while the last rank ends.
const RESULT_GRACE: chrono::Duration = chrono::Duration::seconds(10);

pub(super) async fn sweep(store: &dyn Store, snapshot: &Snapshot, report: &mut PassReport) -> StoreResult<()> {
    let up: HashSet<NodeId> = snapshot.up.iter().map(|n| n.id).collect();
    let mut gone: Vec<NodeId> =
        snapshot.placements.values().flatten().map(|a| a.node_id).filter(|n| !up.contains(n)).collect();
    gone.sort_unstable();
    gone.dedup();
    for node in gone {
        for job in snapshot.active.values() {
            let ranks = snapshot.placements.get(&(job.id, job.attempt));
            if ranks.is_some_and(|r| r.iter().any(|a| a.node_id == node)) {
                let failed = store.fail_placement(job.id, job.attempt, "its node is lost", true).await?;
                report.failed_placements += usize::from(failed.is_some());
            }
        }
        store.end_node_assignments(node, AssignmentState::Failed).await?;
    }
    for (&(job_id, _attempt), ranks) in &snapshot.placements {
        // Only when the job has no active placement at all: cancelling pending ranks is per job.
        let over = !snapshot.active.contains_key(&job_id);
        if over && ranks.iter().any(|a| a.state == AssignmentState::Pending) {
            store.cancel_pending_assignments(job_id).await?;
        }
    }
    let unplaced = snapshot.active.values().filter(|j| !snapshot.placements.contains_key(&(j.id, j.attempt)));
    for job in unplaced {
        let ended = store.job_assignments(job.id, job.attempt).await?.iter().map(|a| a.updated_at).max();
        if ended.is_none_or(|at| ringtrain_store::now() - at > RESULT_GRACE) {
            let why = "all its ranks ended without reporting a result";
            report.failed_placements +=
                usize::from(store.fail_placement(job.id, job.attempt, why, true).await?.is_some());
        }
    }
    Ok(())
}
