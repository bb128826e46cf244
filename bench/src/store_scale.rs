//! `ringtrain-bench metrics`: the metrics table at scale. One job's per-iteration curve from many ranks
//! (by default 10^7 points: 64 ranks × 156,250 iterations, a long job's days of reports) is written the way the
//! API writes reports (upserts of up to [`METRICS_CHUNK`](ringtrain_store::metrics) points, a few writers at once),
//! then each read the API makes of it is timed: a page from the start, a page half way (the cursor), the
//! curve downsampled to 1,000 points for one rank and for all ranks (what `?points=` asks), and every rank's progress (the job page's).
//!
//! `ringtrain-bench history`: one team's run history of 10^6 jobs (filled by one statement on Postgres),
//! and the pages `GET /v1/jobs` reads of it: the newest, deep through the cursor, and by state, name prefix,
//! tag and text.
//!
//! Store-level, so the figures are the database's: the HTTP layer in front adds the same per request
//! whatever the table holds.

use std::time::{Duration, Instant};

use ringtrain_core::spec::DeviceKind;
use ringtrain_core::JobId;
use serde::Serialize;
use serde_json::json;

use ringtrain_core::JobState;

use ringtrain_store::{JobFilter, MetricPoint, MetricsQuery, NewJob, NewTeam, Store, StoreResult, Submitted};

#[derive(Debug, Clone, Serialize)]
pub struct MetricsBenchConfig {
    /// Points written in all (rounded down to whole iterations of every rank).
    pub points: u64,
    pub ranks: u32,
    /// Points per write, as one agent report batch.
    pub batch: usize,
    /// Concurrent writers.
    pub writers: usize,
    /// Timed repetitions of each read.
    pub reads: usize,
}

impl Default for MetricsBenchConfig {
    fn default() -> Self {
        MetricsBenchConfig { points: 10_000_000, ranks: 64, batch: 500, writers: 4, reads: 5 }
    }
}

/// Milliseconds of one kind of read.
#[derive(Debug, Clone, Serialize)]
pub struct ReadTimes {
    pub read: &'static str,
    /// Points (or jobs) the read returned.
    pub returned: usize,
    pub min_ms: f64,
    pub median_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MetricsBenchReport {
    pub config: MetricsBenchConfig,
    pub stored: u64,
    pub write_s: f64,
    pub points_per_s: f64,
    pub reads: Vec<ReadTimes>,
}

/// Writes the curve into the database at `url` (a job of a new team) and times the reads.
pub async fn metrics(url: &str, config: &MetricsBenchConfig) -> StoreResult<MetricsBenchReport> {
    let store = ringtrain_store::connect(url).await?;
    let job = bench_job(store.as_ref()).await?;
    let ranks = config.ranks.max(1);
    let iterations = (config.points / u64::from(ranks)).max(1) as i64;
    let started = Instant::now();
    let writers = config.writers.max(1);
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let (store, batch) = (store.clone(), config.batch.max(1));
        // writer w takes every w-th slice of iterations, each slice reported by every rank in turn
        tasks.push(tokio::spawn(async move {
            let per_batch = (batch as i64 / i64::from(ranks)).max(1);
            let mut first = writer as i64 * per_batch;
            while first < iterations {
                let last = (first + per_batch).min(iterations);
                let points: Vec<MetricPoint> = (first..last)
                    .flat_map(|iteration| (0..ranks as i32).map(move |rank| point(iteration, rank)))
                    .collect();
                store.record_metrics(job, &points).await?;
                first += per_batch * writers as i64;
            }
            StoreResult::Ok(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| ringtrain_store::StoreError::Corrupt(format!("a writer panicked: {e}")))??;
    }
    let write_s = started.elapsed().as_secs_f64();
    let stored = iterations as u64 * u64::from(ranks);
    // What autovacuum does after a write of this size, and would not have had time to here: without fresh
    // statistics Postgres plans a page of the primary key as a sort of every point (120 ms at 2e5).
    if url.starts_with("postgres") {
        use sqlx::Connection;
        let mut connection = sqlx::PgConnection::connect(url).await?;
        sqlx::query("ANALYZE metrics").execute(&mut connection).await?;
    }

    let iteration = |rank: Option<i32>| MetricsQuery {
        kind: Some("iteration".into()),
        rank,
        stride: 1,
        limit: 1001,
        ..Default::default()
    };
    let mut reads = Vec::new();
    let first_page = iteration(None);
    reads.push(time(config.reads, "first page (1,000 points)", || store.query_metrics(job, &first_page)).await?);
    let half_way = MetricsQuery { after: Some(("iteration".into(), iterations / 2, 0)), ..iteration(None) };
    reads.push(time(config.reads, "page half way (cursor)", || store.query_metrics(job, &half_way)).await?);
    for (read, rank) in [("rank 0 downsampled to 1,000", Some(0)), ("all ranks downsampled to 1,000", None)] {
        reads.push(time(config.reads, read, || downsampled(store.as_ref(), job, iteration(rank), 1000)).await?);
    }
    reads.push(time(config.reads, "every rank's progress", || store.reported_progress(job)).await?);
    Ok(MetricsBenchReport {
        config: config.clone(),
        stored,
        write_s,
        points_per_s: stored as f64 / write_s.max(1e-9),
        reads,
    })
}

/// What `GET /v1/jobs/{id}/metrics?points=N` does.
async fn downsampled(store: &dyn Store, job: JobId, query: MetricsQuery, points: i64) -> StoreResult<Vec<MetricPoint>> {
    Ok(store.downsample_metrics(job, &query, points).await?.0)
}

async fn time<F, Fut, T>(repeat: usize, read: &'static str, mut once: F) -> StoreResult<ReadTimes>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StoreResult<Vec<T>>>,
{
    let mut times: Vec<Duration> = Vec::new();
    let mut returned = 0;
    for _ in 0..repeat.max(1) {
        let started = Instant::now();
        returned = once().await?.len();
        times.push(started.elapsed());
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(ReadTimes {
        read,
        returned,
        min_ms: ms(times[0]),
        median_ms: ms(times[times.len() / 2]),
        max_ms: ms(times[times.len() - 1]),
    })
}

fn point(iteration: i64, rank: i32) -> MetricPoint {
    let loss = 2.3 / (1.0 + iteration as f64 * 1e-4) + f64::from(rank) * 1e-3;
    let fields = json!({"loss": loss, "lr": 0.1, "samples_per_s": 5000.0, "allreduce_share": 0.1});
    MetricPoint {
        kind: "iteration".into(),
        rank,
        epoch: iteration / 1000,
        iteration,
        attempt: 1,
        fields: fields.as_object().cloned().unwrap_or_default(),
    }
}

async fn bench_job(store: &dyn Store) -> StoreResult<JobId> {
    let name = format!("bench-metrics-{}", uuid::Uuid::new_v4().simple());
    let team = store.create_team(NewTeam { name, gpu_quota: 0, cpu_quota: 0, storage_quota_bytes: None }).await?;
    let new = NewJob {
        id: JobId::new(),
        team_id: team.id,
        created_by: None,
        name: Some("bench-metrics".into()),
        spec_json: json!({"name": "bench-metrics", "model": {"name": "lenet5"}, "dataset": "fashion-mnist"}),
        effective: None,
        dataset_size: None,
        priority: 0,
        device: DeviceKind::Cpu,
        devices: 64,
        max_restarts: 0,
        study: None,
    };
    match store.submit_job(new, None).await? {
        Submitted::Created(job) | Submitted::Replayed(job) => Ok(job.id),
        Submitted::KeyReused => Err(ringtrain_store::StoreError::Corrupt("no key was given".into())),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HistoryBenchConfig {
    /// Jobs in the team's history.
    pub jobs: u64,
    /// Timed repetitions of each read.
    pub reads: usize,
}

impl Default for HistoryBenchConfig {
    fn default() -> Self {
        HistoryBenchConfig { jobs: 1_000_000, reads: 5 }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HistoryBenchReport {
    pub config: HistoryBenchConfig,
    pub fill_s: f64,
    pub reads: Vec<ReadTimes>,
}

/// Fills one team's history with `config.jobs` ended jobs (1% still queued; every 10th tagged `sweep`; one in
/// 10^5 noted "needle") in one statement, then times pages of 50 as `GET /v1/jobs` asks them, and the
/// scheduler's read of the queue. Postgres only.
pub async fn history(url: &str, config: &HistoryBenchConfig) -> StoreResult<HistoryBenchReport> {
    use sqlx::Connection;
    let store = ringtrain_store::connect(url).await?;
    let name = format!("bench-history-{}", uuid::Uuid::new_v4().simple());
    let team = store.create_team(NewTeam { name, gpu_quota: 0, cpu_quota: 0, storage_quota_bytes: None }).await?;
    let started = Instant::now();
    let mut connection = sqlx::PgConnection::connect(url).await?;
    sqlx::query(
        "INSERT INTO jobs (id, team_id, name, spec, state, priority, device, devices, max_restarts, created_at, \
         updated_at, finished_at, tags, note) \
         SELECT gen_random_uuid(), $1, 'run-' || (i % 1000) || '-' || i, \
         jsonb_build_object('name', 'run-' || i, 'model', jsonb_build_object('name', 'lenet5'), 'dataset', 'fashion-mnist'), \
         CASE WHEN i % 100 = 0 THEN 'queued' WHEN i % 10 = 1 THEN 'failed' WHEN i % 10 = 2 THEN 'cancelled' \
         ELSE 'succeeded' END, 0, 'cpu', 2, 3, now() - (($2 - i) * interval '1 second'), now(), \
         CASE WHEN i % 100 = 0 THEN NULL ELSE now() END, \
         CASE WHEN i % 10 = 0 THEN '[\"sweep\"]' ELSE '[]' END, \
         CASE WHEN i % 100000 = 7 THEN 'a needle in the history' ELSE 'lr sweep, run ' || i END \
         FROM generate_series(1, $2) AS i",
    )
    .bind(team.id.0)
    .bind(config.jobs as i64)
    .execute(&mut connection)
    .await?;
    sqlx::query("ANALYZE jobs").execute(&mut connection).await?;
    let fill_s = started.elapsed().as_secs_f64();

    let page = |filter: JobFilter| JobFilter { limit: 51, ..filter };
    let newest = page(JobFilter::default());
    let mut reads = vec![time(config.reads, "newest page (50)", || store.list_jobs(team.id, &newest)).await?];
    // the cursor of the page half way: the seq of the newest job's half
    let first = store.list_jobs(team.id, &JobFilter { limit: 1, ..JobFilter::default() }).await?;
    let half_way = first.first().map(|job| job.seq - config.jobs as i64 / 2);
    let deep = page(JobFilter { before_seq: half_way, ..JobFilter::default() });
    reads.push(time(config.reads, "page half way (cursor)", || store.list_jobs(team.id, &deep)).await?);
    let filters = [
        ("state=queued (1%)", JobFilter { state: Some(JobState::Queued), ..JobFilter::default() }),
        ("name_prefix=run-42", JobFilter { name_prefix: Some("run-42".into()), ..JobFilter::default() }),
        ("tag=sweep (10%)", JobFilter { tag: Some("sweep".into()), ..JobFilter::default() }),
        ("q=needle (10 jobs)", JobFilter { text: Some("needle".into()), ..JobFilter::default() }),
    ];
    for (read, filter) in filters {
        let filter = page(filter);
        reads.push(time(config.reads, read, || store.list_jobs(team.id, &filter)).await?);
    }
    // what each scheduler pass reads first: the head of every team's queue (ViewConfig::queue_window's 1,000)
    reads
        .push(time(config.reads, "scheduler queue (first 1,000 per team and kind)", || store.list_queued(1000)).await?);
    Ok(HistoryBenchReport { config: config.clone(), fill_s, reads })
}
