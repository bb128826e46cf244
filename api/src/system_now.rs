//! What every live rank uses of its node now: the newest `system` report of each (the agents sample their
//! ranks' CPU and resident memory, `ringtrain_agent`'s `system_metrics`), with the node it runs on. Read
//! from the store (one newest-first read per running job), so every server replica answers the same, and
//! kept for [`FRESH`]: the Cluster view polls every 2 s per viewer and Prometheus scrapes on its own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ringtrain_core::{AssignmentState, JobId, NodeId};
use ringtrain_store::{MetricsQuery, Store, StoreResult};

use crate::routes::agent::reports::SYSTEM_KIND;

/// How long a read answers for (agents sample every 10 s).
pub const FRESH: Duration = Duration::from_secs(5);

/// The newest samples read per rank to find its placement's own: a rank restarted by a new placement
/// reports under a new attempt, and the previous one's samples are not its.
const SAMPLES_PER_RANK: i64 = 4;

/// One live rank's newest sample.
#[derive(Debug, Clone, PartialEq)]
pub struct RankUse {
    pub job: JobId,
    pub rank: i32,
    pub node: NodeId,
    pub cpu_cores: f64,
    pub resident_bytes: f64,
}

/// The last read and when it was made.
#[derive(Debug, Default)]
pub struct SystemNow {
    read: Mutex<Option<(Instant, Vec<RankUse>)>>,
}

impl SystemNow {
    /// The newest sample of every rank that runs now, of its running placement (none for a rank that has
    /// not been sampled yet), at most [`FRESH`] old.
    pub async fn live_rank_use(&self, store: &dyn Store) -> StoreResult<Vec<RankUse>> {
        if let Some((at, uses)) = self.lock().as_ref() {
            if at.elapsed() < FRESH {
                return Ok(uses.clone());
            }
        }
        let uses = read(store).await?;
        *self.lock() = Some((Instant::now(), uses.clone()));
        Ok(uses)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Vec<RankUse>)>> {
        self.read.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

async fn read(store: &dyn Store) -> StoreResult<Vec<RankUse>> {
    // each running job's placement: its attempt, and the node of each rank
    let running: Vec<_> =
        store.live_assignments().await?.into_iter().filter(|a| a.state == AssignmentState::Running).collect();
    let mut newest: HashMap<JobId, i32> = HashMap::new();
    for a in &running {
        let attempt = newest.entry(a.job_id).or_insert(a.attempt);
        *attempt = (*attempt).max(a.attempt);
    }
    let mut placements: HashMap<JobId, (i32, HashMap<i32, NodeId>)> = HashMap::new();
    for a in running.iter().filter(|a| newest.get(&a.job_id) == Some(&a.attempt)) {
        placements.entry(a.job_id).or_insert_with(|| (a.attempt, HashMap::new())).1.insert(a.rank, a.node_id);
    }
    let mut uses = Vec::new();
    for (job, (attempt, nodes)) in placements {
        let query = MetricsQuery {
            kind: Some(SYSTEM_KIND.into()),
            stride: 1,
            limit: nodes.len() as i64 * SAMPLES_PER_RANK,
            newest_first: true,
            ..Default::default()
        };
        let mut seen = std::collections::HashSet::new();
        for point in store.query_metrics(job, &query).await? {
            let Some(&node) = nodes.get(&point.rank) else { continue };
            if point.attempt != attempt || !seen.insert(point.rank) {
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
