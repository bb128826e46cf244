//! Rescue: what died since the last pass. Nodes whose heartbeats stopped are marked lost, and their ranks
//! with them; placements whose lease ran out (no agent holding one of their ranks heartbeated) fail. A failed
//! placement is requeued, resuming from its last checkpoint, while the job's restart budget lasts. Neither
//! happens until the agents have had a node timeout to heartbeat after the server started, or after its
//! database came back (`LoopConfig::no_lost_nodes_before`): an outage must not write off the whole cluster.

use std::time::Instant;

use ringtrain_core::AssignmentState;
use ringtrain_store::{Store, StoreResult};

use super::{LoopConfig, PassReport};

pub(super) async fn rescue(store: &dyn Store, config: &LoopConfig, report: &mut PassReport) -> StoreResult<()> {
    let timeout = chrono::Duration::from_std(config.node_timeout).unwrap_or(chrono::Duration::seconds(15));
    let heard_long_enough = config.no_lost_nodes_before.is_none_or(|at| Instant::now() >= at);
    let lost = if heard_long_enough { store.mark_lost_nodes(ringtrain_store::now() - timeout).await? } else { vec![] };
    for node in lost {
        report.lost_nodes += 1;
        let name = store.get_node(node).await?.map_or_else(|| node.to_string(), |n| n.name);
        tracing::warn!(node = %name, "node lost: no heartbeat for {:?}", config.node_timeout);
        let why = format!("node {name} was lost (no heartbeat for {} s)", config.node_timeout.as_secs());
        for assignment in store.node_assignments(node, &AssignmentState::LIVE).await? {
            // Only the job's current placement fails; an older one is already over.
            let failed = store.fail_placement(assignment.job_id, assignment.attempt, &why, true).await?;
            report.failed_placements += usize::from(failed.is_some());
        }
        store.end_node_assignments(node, AssignmentState::Failed).await?;
    }
    // After a start or a database outage, leases ran out while no agent could renew them: wait for the
    // heartbeats (which renew them) as for lost nodes.
    if !heard_long_enough {
        return Ok(());
    }
    for job in store.expired_leases(ringtrain_store::now(), 100).await? {
        let why = format!(
            "its lease expired: no agent holding one of its ranks heartbeated for {} s",
            config.lease.as_secs()
        );
        report.failed_placements += usize::from(store.fail_placement(job.id, job.attempt, &why, true).await?.is_some());
    }
    Ok(())
}
