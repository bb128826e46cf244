//! Prometheus metrics of the server itself: requests by route and status, a latency histogram per route,
//! and (read from the store at scrape time) jobs by state and the queue depth. Hand-written text format:
//! a handful of series do not need a metrics framework.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use ringtrain_core::JobState;

use crate::state::AppState;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Debug, Default)]
struct Series {
    /// (method, route, status) -> requests
    requests: BTreeMap<(String, String, u16), u64>,
    /// (method, route) -> latency
    latency: BTreeMap<(String, String), Histogram>,
}

#[derive(Debug, Default)]
pub struct Telemetry {
    series: Mutex<Series>,
}

impl Telemetry {
    pub fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let mut series = self.series.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *series.requests.entry((method.to_string(), route.to_string(), status)).or_default() += 1;
        let histogram = series.latency.entry((method.to_string(), route.to_string())).or_default();
        for (bound, count) in BUCKETS.iter().zip(histogram.counts.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        histogram.count += 1;
        histogram.sum += seconds;
    }

    /// The exposition text; `jobs` is the count per state.
    pub fn render(&self, jobs: &[(JobState, i64)]) -> String {
        let series = self.series.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut out = String::new();
        out.push_str("# HELP ringtrain_http_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE ringtrain_http_requests_total counter\n");
        for ((method, route, status), n) in &series.requests {
            let _ = writeln!(
                out,
                "ringtrain_http_requests_total{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {n}",
                escape(route)
            );
        }
        out.push_str("# HELP ringtrain_http_request_duration_seconds HTTP request latency by route.\n");
        out.push_str("# TYPE ringtrain_http_request_duration_seconds histogram\n");
        for ((method, route), h) in &series.latency {
            let labels = format!("method=\"{method}\",route=\"{}\"", escape(route));
            for (bound, count) in BUCKETS.iter().zip(h.counts.iter()) {
                let _ =
                    writeln!(out, "ringtrain_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {count}");
            }
            let _ = writeln!(out, "ringtrain_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(out, "ringtrain_http_request_duration_seconds_sum{{{labels}}} {}", h.sum);
            let _ = writeln!(out, "ringtrain_http_request_duration_seconds_count{{{labels}}} {}", h.count);
        }
        out.push_str("# HELP ringtrain_jobs Jobs by state.\n# TYPE ringtrain_jobs gauge\n");
        for state in JobState::ALL {
            let n = jobs.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
            let _ = writeln!(out, "ringtrain_jobs{{state=\"{state}\"}} {n}");
        }
        let queued = jobs.iter().find(|(s, _)| *s == JobState::Queued).map_or(0, |(_, n)| *n);
        out.push_str(
            "# HELP ringtrain_queue_depth Jobs waiting to be scheduled.\n# TYPE ringtrain_queue_depth gauge\n",
        );
        let _ = writeln!(out, "ringtrain_queue_depth {queued}");
        out
    }
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Middleware: times every request and counts it under its route template (`/v1/jobs/{id}`, never the raw
/// path, so ids do not explode the label set).
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let response = next.run(request).await;
    state.telemetry.observe(&method, &route, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}
