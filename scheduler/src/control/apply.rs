//! Apply: the plan's decisions as guarded store operations. A preemption requeues its victim (whose agents
//! checkpoint and stop the ranks); a start claims the job and places its ranks in one transaction. A start
//! that lost a race (the job was cancelled, or a device was taken meanwhile) is left to the next pass.

use ringtrain_store::{NewAssignment, Store, StoreError, StoreResult};

use super::view::Snapshot;
use super::{LoopConfig, PassReport};
use crate::Plan;

pub(super) async fn apply(
    store: &dyn Store,
    config: &LoopConfig,
    snapshot: &Snapshot,
    plan: &Plan,
    report: &mut PassReport,
) -> StoreResult<()> {
    for preempt in &plan.preemptions {
        let Some(job) = snapshot.active.get(&preempt.job) else { continue };
        tracing::info!(job = %job.id, reason = ?preempt.reason, "preempting");
        // one failed preemption (a busy database) must not cost the pass its starts: the next pass retries it
        match store.preempt_job(job.id, job.attempt, &preempt.reason.to_string()).await {
            Ok(Some(_)) => report.preempted += 1,
            Ok(None) => {}
            Err(err) => tracing::warn!(job = %job.id, error = %err, "preemption failed; next pass"),
        }
    }
    for start in &plan.starts {
        let ranks: Option<Vec<NewAssignment>> = start
            .devices
            .iter()
            .enumerate()
            .map(|(rank, slot)| {
                let device_id = snapshot.devices.device_id(*slot)?;
                Some(NewAssignment { node_id: slot.node, device_id, rank: rank as i32 })
            })
            .collect();
        let Some(ranks) = ranks else { continue };
        match store.start_job(start.job, &config.owner, config.lease, &ranks).await {
            Ok(Some(_)) => report.started += 1,
            Ok(None) => {} // cancelled meanwhile
            Err(StoreError::Conflict(why)) => tracing::info!(job = %start.job, %why, "placement raced; next pass"),
            Err(err) => return Err(err),
        }
    }
    Ok(())
}
