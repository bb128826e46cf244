//! How far a running job has come, from rank 0's newest iteration report: what the jobs list shows as
//! progress, and what the queue's start estimates extrapolate from.

use ringtrain_store::{Job, MetricsQuery, Store, StoreResult};
use serde_json::Value;

pub use ringtrain_views::jobs::LiveProgress;

/// Rank 0's newest iteration report of `job`, as progress; None until it has reported one.
pub async fn live_progress(store: &dyn Store, job: &Job) -> StoreResult<Option<LiveProgress>> {
    // the newest point alone, read from the end of the series: every running job in a list asks this
    let query = MetricsQuery {
        kind: Some("iteration".into()),
        rank: Some(0),
        stride: 1,
        limit: 1,
        newest_first: true,
        ..Default::default()
    };
    let Some(point) = store.query_metrics(job.id, &query).await?.into_iter().next() else { return Ok(None) };
    let newest = point.iteration;
    let point = Some(point);
    let field = |name: &str| point.as_ref().and_then(|p| p.fields.get(name)).and_then(Value::as_f64);
    let total = job.effective.as_ref().map(|e| e.total_iterations as i64);
    let mut progress = LiveProgress {
        iterations_done: newest + 1,
        total_iterations: total,
        epoch: point.as_ref().map_or(0, |p| p.epoch),
        loss: field("loss"),
        samples_per_s: field("samples_per_s"),
        allreduce_share: field("allreduce_share"),
        seconds_left: None,
    };
    progress.seconds_left = job.effective.as_ref().and_then(|e| progress.seconds_left(e.global_batch as f64));
    Ok(Some(progress))
}
