//! What every live rank uses of its node now: the newest `system` report of each (the agents sample their
//! ranks' CPU and resident memory, `ringtrain_agent`'s `system_metrics`), with the node it runs on. Read
//! from the store at the moment it is asked (a Prometheus scrape, the node list), so every server replica
//! answers the same; one bounded read per running job.

use std::collections::HashMap;

use ringtrain_core::{AssignmentState, JobId, NodeId};
use ringtrain_store::MetricsQuery;

use crate::error::ApiResult;
use crate::routes::agent::reports::SYSTEM_KIND;
use crate::state::AppState;

/// A sample older than this describes a rank that no longer reports (its agent is gone): left out.
const FRESH_SECONDS: i64 = 120;

/// One live rank's newest sample.
#[derive(Debug, Clone, PartialEq)]
pub struct RankUse {
    pub job: JobId,
    pub rank: i32,
    pub node: NodeId,
    pub cpu_cores: f64,
    pub resident_bytes: f64,
}

/// The newest sample of every rank that runs now and reported one in the last [`FRESH_SECONDS`].
pub async fn live_rank_use(state: &AppState) -> ApiResult<Vec<RankUse>> {
    let live = state.store.live_assignments().await?;
    let mut ranks: HashMap<JobId, HashMap<i32, NodeId>> = HashMap::new();
    for a in live.iter().filter(|a| a.state == AssignmentState::Running) {
        ranks.entry(a.job_id).or_default().insert(a.rank, a.node_id);
    }
    let oldest = chrono::Utc::now().timestamp() - FRESH_SECONDS;
    let mut uses = Vec::new();
    for (job, nodes) in ranks {
        let query = MetricsQuery {
            kind: Some(SYSTEM_KIND.into()),
            from_iteration: Some(oldest),
            stride: 1,
            // every rank's samples of the last two minutes, newest first
            limit: (nodes.len() as i64) * (FRESH_SECONDS + 1),
            newest_first: true,
            ..Default::default()
        };
        let mut seen = std::collections::HashSet::new();
        for point in state.store.query_metrics(job, &query).await? {
            let Some(&node) = nodes.get(&point.rank) else { continue };
            if !seen.insert(point.rank) {
                continue;
            }
            uses.push(RankUse {
                job,
                rank: point.rank,
                node,
                cpu_cores: point.number("cpu_cores").unwrap_or(0.0),
                resident_bytes: point.number("resident_bytes").unwrap_or(0.0),
            });
        }
    }
    uses.sort_by_key(|u| (u.job, u.rank));
    Ok(uses)
}

/// The sum over each node's live ranks: (CPU cores busy, resident bytes).
pub fn per_node(uses: &[RankUse]) -> HashMap<NodeId, (f64, f64)> {
    let mut nodes: HashMap<NodeId, (f64, f64)> = HashMap::new();
    for u in uses {
        let entry = nodes.entry(u.node).or_default();
        entry.0 += u.cpu_cores;
        entry.1 += u.resident_bytes;
    }
    nodes
}
