//! Prometheus metrics of the server itself, with the `prometheus-client` crate: requests by route and
//! status, a latency histogram per route, and (read from the store at scrape time) jobs by state and the
//! queue depth, and what each live rank and each node's ranks use now (CPU cores, resident memory, from the
//! agents' samples). Routes are their templates (`/v1/jobs/{id}`, never the raw path), so ids cannot explode the
//! label set.

use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use ringtrain_core::JobState;

use crate::state::AppState;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeamKindLabels {
    team: String,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RankLabels {
    job: String,
    rank: String,
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// What each live rank uses now (`crate::system_now`), by name: (job, rank, node, CPU cores, resident bytes).
pub type RankUseRow = (String, i32, String, f64, f64);

type LatencyFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;
type DeviceSeconds = Family<TeamKindLabels, Counter<f64, std::sync::atomic::AtomicU64>>;

/// The server's metric families and the registry that renders them.
#[derive(Debug)]
pub struct ServerMetrics {
    /// Held for rendering only: the families below are shared handles into it.
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: LatencyFamily,
    jobs: Family<StateLabels, Gauge>,
    queue_depth: Gauge,
    device_seconds: DeviceSeconds,
    rank_cpu: Family<RankLabels, FloatGauge>,
    rank_memory: Family<RankLabels, FloatGauge>,
    node_cpu: Family<NodeLabels, FloatGauge>,
    node_memory: Family<NodeLabels, FloatGauge>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("ringtrain_http_requests", "HTTP requests by route and status", requests.clone());
        let latency: LatencyFamily = Family::new_with_constructor(|| Histogram::new(BUCKETS));
        registry.register("ringtrain_http_request_duration_seconds", "HTTP request latency by route", latency.clone());
        let jobs = Family::<StateLabels, Gauge>::default();
        registry.register("ringtrain_jobs", "Jobs by state", jobs.clone());
        let queue_depth = Gauge::default();
        registry.register("ringtrain_queue_depth", "Jobs waiting to be scheduled", queue_depth.clone());
        let device_seconds = DeviceSeconds::default();
        registry.register(
            "ringtrain_team_device_seconds",
            "Device-seconds used by each team's jobs, per device kind (every placement, live ones up to now)",
            device_seconds.clone(),
        );
        let rank_cpu = registered(
            &mut registry,
            "ringtrain_rank_cpu_cores",
            "CPU cores each live rank kept busy (its newest sample)",
        );
        let rank_memory = registered(
            &mut registry,
            "ringtrain_rank_resident_bytes",
            "Resident memory of each live rank (its newest sample)",
        );
        let node_cpu = registered(
            &mut registry,
            "ringtrain_node_rank_cpu_cores",
            "CPU cores the live ranks of each node keep busy",
        );
        let node_memory = registered(
            &mut registry,
            "ringtrain_node_rank_resident_bytes",
            "Resident memory of the live ranks of each node",
        );
        ServerMetrics {
            registry: Mutex::new(registry),
            requests,
            latency,
            jobs,
            queue_depth,
            device_seconds,
            rank_cpu,
            rank_memory,
            node_cpu,
            node_memory,
        }
    }
}

impl ServerMetrics {
    pub fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let route = RouteLabels { method: method.to_string(), route: route.to_string() };
        self.latency.get_or_create(&route).observe(seconds);
        let request = RequestLabels { method: route.method, route: route.route, status };
        self.requests.get_or_create(&request).inc();
    }

    /// The exposition text (OpenMetrics); `jobs` is the count per state and `usage` each team's total per
    /// kind, read from the database at scrape time (the counters move up to those totals, so they stay
    /// monotonic in this process and agree across servers).
    pub fn render(
        &self,
        jobs: &[(JobState, i64)],
        usage: &[ringtrain_store::DeviceTotal],
        ranks: &[RankUseRow],
    ) -> String {
        // held while the gauges are set and written: two scrapes at once cannot mix their clears and sets
        let registry = self.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.set_rank_use(ranks);
        for total in usage {
            let labels = TeamKindLabels { team: total.team.clone(), kind: total.kind.as_str() };
            let counter = self.device_seconds.get_or_create(&labels);
            let behind = total.device_seconds - counter.get();
            if behind > 0.0 {
                counter.inc_by(behind);
            }
        }
        let count = |state: JobState| jobs.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
        for state in JobState::ALL {
            self.jobs.get_or_create(&StateLabels { state: state.as_str() }).set(count(state));
        }
        self.queue_depth.set(count(JobState::Queued));
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

/// A family of gauges registered under `name`, as the registry's handle.
fn registered<L>(registry: &mut Registry, name: &str, help: &str) -> Family<L, FloatGauge>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let family = Family::<L, FloatGauge>::default();
    registry.register(name, help, family.clone());
    family
}

impl ServerMetrics {
    /// The live ranks' gauges, and their sums per node: only the ranks live now (an ended job's series go,
    /// so job ids cannot pile up in the label set).
    fn set_rank_use(&self, ranks: &[RankUseRow]) {
        for family in [&self.rank_cpu, &self.rank_memory] {
            family.clear();
        }
        for family in [&self.node_cpu, &self.node_memory] {
            family.clear();
        }
        let mut per_node: std::collections::HashMap<&str, (f64, f64)> = std::collections::HashMap::new();
        for (job, rank, node, cpu, memory) in ranks {
            let labels = RankLabels { job: job.clone(), rank: rank.to_string(), node: node.clone() };
            self.rank_cpu.get_or_create(&labels).set(*cpu);
            self.rank_memory.get_or_create(&labels).set(*memory);
            let sums = per_node.entry(node.as_str()).or_default();
            sums.0 += cpu;
            sums.1 += memory;
        }
        for (node, (cpu, memory)) in per_node {
            let labels = NodeLabels { node: node.to_string() };
            self.node_cpu.get_or_create(&labels).set(cpu);
            self.node_memory.get_or_create(&labels).set(memory);
        }
    }
}

/// The methods the API serves keep their name; any other (an invented `FOO`) counts as `OTHER`, so no
/// caller can grow the label set.
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// Middleware: times every request and counts it under its route template.
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method()).to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let response = next.run(request).await;
    state.metrics.observe(&method, &route, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}
