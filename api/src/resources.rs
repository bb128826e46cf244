//! What a job has used, for its page (`GET /v1/jobs/{id}`): the device-seconds of all its placements
//! (the accounting's own spans), and what its rank processes reported of their machine in their newest
//! metrics lines (peak resident memory, CPU cores busy). GPU memory is not reported yet.

use chrono::Utc;
use ringtrain_store::{Job, MetricsQuery, SpanFilter, Store, StoreResult};
use serde_json::Value;

pub use ringtrain_views::jobs::JobResources;

/// What `job` has used so far.
pub async fn job_resources(store: &dyn Store, job: &Job) -> StoreResult<JobResources> {
    let spans = store.device_spans(&SpanFilter { job: Some(job.id), ..Default::default() }).await?;
    let (start, now) = (job.created_at, Utc::now());
    let device_seconds = spans.iter().map(|s| s.seconds_within(start, now)).sum();
    let (mut peak, mut cores): (Option<f64>, Option<f64>) = (None, None);
    for rank in store.reported_progress(job.id).await? {
        let Some(newest) = rank.newest_iteration else { continue };
        let query = MetricsQuery {
            kind: Some("iteration".into()),
            rank: Some(rank.rank),
            from_iteration: Some(newest),
            stride: 1,
            limit: 1,
            ..Default::default()
        };
        let Some(point) = store.query_metrics(job.id, &query).await?.into_iter().next() else { continue };
        let field = |name: &str| point.fields.get(name).and_then(Value::as_f64).filter(|v| v.is_finite() && *v > 0.0);
        if let Some(bytes) = field("peak_rss_bytes") {
            peak = Some(peak.map_or(bytes, |p| p.max(bytes)));
        }
        if let Some(busy) = field("cpu_cores") {
            cores = Some(cores.unwrap_or(0.0) + busy);
        }
    }
    Ok(JobResources { device_seconds, peak_rss_bytes: peak, cpu_cores: cores })
}
