//! What ranks report per iteration and per epoch: upserted on (job, kind, iteration, rank), read in pages,
//! optionally downsampled.

use async_trait::async_trait;
use ringtrain_core::JobId;

use crate::error::StoreResult;

pub use ringtrain_views::jobs::records::MetricPoint;

/// Which metrics to read, in (kind, iteration, rank) order.
#[derive(Debug, Clone, Default)]
pub struct MetricsQuery {
    pub kind: Option<String>,
    pub rank: Option<i32>,
    pub from_iteration: Option<i64>,
    /// Continue after this (kind, iteration, rank): the previous page's last point.
    pub after: Option<(String, i64, i32)>,
    /// Keep every `stride`-th point of each (kind, rank) series (1: all).
    pub stride: i64,
    pub limit: i64,
    /// The last points first (with `stride` 1 only): a series' newest point without reading the series.
    pub newest_first: bool,
}

impl MetricsQuery {
    /// Every epoch report of rank 0, in epoch order: a job's curve (epoch reports are all-reduced, the same on
    /// every rank).
    pub fn epoch_curve() -> MetricsQuery {
        MetricsQuery { kind: Some("epoch".into()), rank: Some(0), stride: 1, limit: 100_000, ..Default::default() }
    }
}

#[async_trait]
pub trait MetricStore: Send + Sync {
    /// Upserts on (job, kind, iteration, rank); returns how many points were written.
    async fn record_metrics(&self, job: JobId, points: &[MetricPoint]) -> StoreResult<u64>;
    async fn query_metrics(&self, job: JobId, query: &MetricsQuery) -> StoreResult<Vec<MetricPoint>>;
    /// Points matching the query's kind, rank and from_iteration (for choosing a downsampling stride).
    async fn count_metrics(&self, job: JobId, query: &MetricsQuery) -> StoreResult<i64>;
    /// About `points` points of each series the query selects, and the stride that keeps them. With a kind:
    /// the first report at or after every `stride`-th iteration from the series' first, found by one index
    /// probe each, so the read costs its points whatever the job stored. Without one: every `stride`-th
    /// report of each series, counted over the whole job.
    async fn downsample_metrics(
        &self,
        job: JobId,
        query: &MetricsQuery,
        points: i64,
    ) -> StoreResult<(Vec<MetricPoint>, i64)>;
    /// How far each rank's reports reached, by rank (ranks that reported nothing are absent).
    async fn reported_progress(&self, job: JobId) -> StoreResult<Vec<RankProgress>>;
}

/// How far one rank's reports reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankProgress {
    pub rank: i32,
    /// The newest iteration of its iteration reports (None: none yet).
    pub newest_iteration: Option<i64>,
    /// How many epoch reports it has.
    pub epochs: i64,
}

/// Most metric points written per INSERT: 8 parameters each stays far under both databases' limits.
pub(crate) const METRICS_CHUNK: usize = 500;

/// Keeps the last of several points with the same (kind, iteration, rank): one INSERT may not update a row
/// twice on Postgres.
pub(crate) fn dedup_points(points: &[MetricPoint]) -> Vec<&MetricPoint> {
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<&MetricPoint> =
        points.iter().rev().filter(|p| seen.insert((p.kind.as_str(), p.iteration, p.rank))).collect();
    kept.reverse();
    kept
}

/// Appends the filters that [`MetricStore::query_metrics`] and [`MetricStore::count_metrics`] share.
macro_rules! push_metric_filters {
    ($q:expr, $query:expr) => {
        if let Some(kind) = &$query.kind {
            $q.push(" AND kind = ").push_bind(kind.clone());
        }
        if let Some(rank) = $query.rank {
            $q.push(" AND rank = ").push_bind(rank);
        }
        if let Some(from) = $query.from_iteration {
            $q.push(" AND iteration >= ").push_bind(from);
        }
    };
}

pub(crate) use push_metric_filters;

/// Appends the cursor's condition: the points after `$query.after` in the read's order (before it with
/// `newest_first`). `$compare` is `>` or `<`.
macro_rules! push_metric_cursor {
    ($q:expr, $query:expr, $compare:expr) => {
        match (&$query.after, &$query.kind) {
            (None, _) => {}
            // With the kind fixed, compare (iteration, rank) only: next to `kind = $k`, Postgres starts a
            // three-column row comparison at the kind's first point (185 ms half way through 2e6 points), a
            // two-column one at the cursor (under a millisecond).
            (Some((after_kind, iteration, rank)), Some(kind)) if after_kind == kind => {
                $q.push(format!(" AND (iteration, rank) {} (", $compare))
                    .push_bind(*iteration)
                    .push(", ")
                    .push_bind(*rank)
                    .push(")");
            }
            (Some((after_kind, _, _)), Some(kind)) => {
                // a cursor of another kind is before or past every point of this one
                if (after_kind > kind) != $query.newest_first {
                    $q.push(" AND 1 = 0");
                }
            }
            (Some((kind, iteration, rank)), None) => {
                $q.push(format!(" AND (kind, iteration, rank) {} (", $compare))
                    .push_bind(kind.clone())
                    .push(", ")
                    .push_bind(*iteration)
                    .push(", ")
                    .push_bind(*rank)
                    .push(")");
            }
        }
    };
}

pub(crate) use push_metric_cursor;

macro_rules! impl_metric_store {
    ($store:ty) => {
        const _: () = {
            use ringtrain_core::JobId;
            use sqlx::types::Json;

            use crate::backend::SqlBackend;
            use crate::metrics::{dedup_points, push_metric_cursor, push_metric_filters, MetricStore, METRICS_CHUNK};
            use crate::rows::{MetricRow, METRIC_COLUMNS};
            use crate::{now, MetricPoint, MetricsQuery, StoreResult};

            type Builder<'a> = sqlx::QueryBuilder<'a, <$store as SqlBackend>::Db>;

            impl $store {
                /// Every point the filters keep, from the cursor on: a range of the primary key (job, kind,
                /// iteration, rank) read in its order, so a page costs its own points whatever the job stored.
                /// (Through the downsampling's subquery it sorted every point of the job: 86 ms for a page of
                /// 200k points, seconds at 10^7.)
                async fn query_all_metrics(&self, job: JobId, query: &MetricsQuery) -> StoreResult<Vec<MetricPoint>> {
                    let mut q = Builder::new(format!("SELECT {METRIC_COLUMNS} FROM metrics WHERE job_id = "));
                    q.push_bind(job.0);
                    push_metric_filters!(q, query);
                    let (compare, order) = match query.newest_first {
                        false => (">", "kind, iteration, rank"),
                        true => ("<", "kind DESC, iteration DESC, rank DESC"),
                    };
                    push_metric_cursor!(q, query, compare);
                    q.push(format!(" ORDER BY {order} LIMIT ")).push_bind(query.limit);
                    let rows: Vec<MetricRow> = q.build_query_as().fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                /// The points of one kind at the first reported iteration at or after each of `buckets`
                /// iterations `stride` apart from `first`, from the cursor on: one index probe per bucket.
                async fn query_buckets(
                    &self,
                    job: JobId,
                    query: &MetricsQuery,
                    kind: &str,
                    first: i64,
                    stride: i64,
                    buckets: i64,
                ) -> StoreResult<Vec<MetricPoint>> {
                    let mut q = Builder::new("WITH RECURSIVE buckets(b, n) AS (SELECT ");
                    q.push_bind(first).push(", 1 UNION ALL SELECT b + ").push_bind(stride);
                    q.push(", n + 1 FROM buckets WHERE n < ").push_bind(buckets);
                    q.push(format!(") SELECT {METRIC_COLUMNS} FROM metrics WHERE job_id = "));
                    q.push_bind(job.0).push(" AND kind = ").push_bind(kind.to_string());
                    q.push(" AND iteration IN (SELECT (SELECT iteration FROM metrics WHERE job_id = ");
                    q.push_bind(job.0).push(" AND kind = ").push_bind(kind.to_string());
                    if let Some(rank) = query.rank {
                        // that rank's own reports (a probe of `metrics_by_rank`): ranks may differ in what they kept
                        q.push(" AND rank = ").push_bind(rank);
                    }
                    q.push(" AND iteration >= b ORDER BY iteration LIMIT 1) FROM buckets)");
                    push_metric_filters!(q, query);
                    push_metric_cursor!(q, query, ">");
                    q.push(" ORDER BY kind, iteration, rank LIMIT ").push_bind(query.limit);
                    let rows: Vec<MetricRow> = q.build_query_as().fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }
            }

            #[async_trait::async_trait]
            impl MetricStore for $store {
                async fn record_metrics(&self, job: JobId, points: &[MetricPoint]) -> StoreResult<u64> {
                    let points = dedup_points(points);
                    let now = now();
                    let mut written = 0;
                    // Behind any heartbeat waiting for SQLite's one writer (see write_gate).
                    let _turn = match self.write_gate() {
                        Some(gate) => Some(gate.bulk().await),
                        None => None,
                    };
                    let mut tx = self.pool().begin().await?;
                    for chunk in points.chunks(METRICS_CHUNK) {
                        let mut q = Builder::new(
                            "INSERT INTO metrics (job_id, kind, iteration, rank, epoch, attempt, fields, reported_at) ",
                        );
                        q.push_values(chunk, |mut row, p| {
                            row.push_bind(job.0)
                                .push_bind(p.kind.clone())
                                .push_bind(p.iteration)
                                .push_bind(p.rank)
                                .push_bind(p.epoch)
                                .push_bind(p.attempt)
                                .push_bind(Json(p.fields.clone()))
                                .push_bind(now);
                        });
                        // A later attempt replaces what an earlier one reported for the same step (the resumed
                        // run is the one the final weights come from); an older attempt never overwrites a newer.
                        q.push(
                            " ON CONFLICT (job_id, kind, iteration, rank) DO UPDATE SET epoch = excluded.epoch, \
                             attempt = excluded.attempt, fields = excluded.fields, reported_at = excluded.reported_at \
                             WHERE metrics.attempt <= excluded.attempt",
                        );
                        written += q.build().execute(&mut *tx).await?.rows_affected();
                    }
                    tx.commit().await?;
                    Ok(written)
                }

                async fn query_metrics(&self, job: JobId, query: &MetricsQuery) -> StoreResult<Vec<MetricPoint>> {
                    let stride = query.stride.max(1);
                    if stride == 1 {
                        return self.query_all_metrics(job, query).await;
                    }
                    let mut q = Builder::new(format!("SELECT {METRIC_COLUMNS} FROM "));
                    // Every stride-th point of each (kind, rank) series, numbered along the iteration axis.
                    q.push(
                        "(SELECT m.*, ROW_NUMBER() OVER (PARTITION BY kind, rank ORDER BY iteration) - 1 AS rn \
                         FROM metrics m WHERE job_id = ",
                    );
                    q.push_bind(job.0);
                    push_metric_filters!(q, query);
                    q.push(") s WHERE rn % ").push_bind(stride).push(" = 0");
                    push_metric_cursor!(q, query, ">");
                    q.push(" ORDER BY kind, iteration, rank LIMIT ").push_bind(query.limit);
                    let rows: Vec<MetricRow> = q.build_query_as().fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn reported_progress(&self, job: JobId) -> StoreResult<Vec<crate::metrics::RankProgress>> {
                    // The ranks of each kind by a skip scan of `metrics_by_rank` (each next rank one probe),
                    // then each rank's newest iteration and its epoch reports: probes and ranges of that index,
                    // never the whole job.
                    let next_rank = |kind: &str, name: &str| {
                        format!(
                            "{name}(rank) AS (SELECT (SELECT rank FROM metrics WHERE job_id = $1 AND kind = '{kind}' \
                             ORDER BY rank LIMIT 1) UNION ALL SELECT (SELECT m.rank FROM metrics m WHERE m.job_id = $1 \
                             AND m.kind = '{kind}' AND m.rank > {name}.rank ORDER BY m.rank LIMIT 1) FROM {name} \
                             WHERE {name}.rank IS NOT NULL)"
                        )
                    };
                    let sql = format!(
                        "WITH RECURSIVE {}, {}, ranks(rank) AS (SELECT rank FROM iteration_ranks WHERE rank IS NOT NULL \
                         UNION SELECT rank FROM epoch_ranks WHERE rank IS NOT NULL) \
                         SELECT rank, (SELECT m.iteration FROM metrics m WHERE m.job_id = $1 AND m.kind = 'iteration' \
                         AND m.rank = ranks.rank ORDER BY m.iteration DESC LIMIT 1), (SELECT COUNT(*) FROM metrics m \
                         WHERE m.job_id = $1 AND m.kind = 'epoch' AND m.rank = ranks.rank) FROM ranks",
                        next_rank("iteration", "iteration_ranks"),
                        next_rank("epoch", "epoch_ranks"),
                    );
                    let rows: Vec<(i32, Option<i64>, Option<i64>)> = sqlx::query_as(&sql)
                    .bind(job.0)
                    .fetch_all(self.pool())
                    .await?;
                    Ok(rows
                        .into_iter()
                        .map(|(rank, newest_iteration, epochs)| crate::metrics::RankProgress {
                            rank,
                            newest_iteration,
                            epochs: epochs.unwrap_or(0),
                        })
                        .collect())
                }

                async fn downsample_metrics(
                    &self,
                    job: JobId,
                    query: &MetricsQuery,
                    points: i64,
                ) -> StoreResult<(Vec<MetricPoint>, i64)> {
                    let points = points.max(1);
                    let Some(kind) = query.kind.clone() else {
                        let count = self.count_metrics(job, query).await?;
                        let stride = ((count + points - 1) / points).max(1);
                        let strided = MetricsQuery { stride, newest_first: false, ..query.clone() };
                        return Ok((self.query_metrics(job, &strided).await?, stride));
                    };
                    // the series' ends, each from its end of the index
                    let end = |newest_first| MetricsQuery { after: None, stride: 1, limit: 1, newest_first, ..query.clone() };
                    let first = self.query_all_metrics(job, &end(false)).await?;
                    let last = self.query_all_metrics(job, &end(true)).await?;
                    let (Some(first), Some(last)) = (first.first(), last.first()) else { return Ok((Vec::new(), 1)) };
                    let (origin, last) = (first.iteration, last.iteration);
                    let stride = ((last - origin + points) / points).max(1);
                    let ascending = MetricsQuery { newest_first: false, ..query.clone() };
                    if stride == 1 {
                        return Ok((self.query_all_metrics(job, &ascending).await?, 1));
                    }
                    // buckets on the grid from the series' first iteration, from the cursor's on
                    let from = match &query.after {
                        Some((after_kind, iteration, _)) if *after_kind == kind => (*iteration).max(origin),
                        _ => origin,
                    };
                    let first_bucket = origin + (from - origin) / stride * stride;
                    let buckets = (last - first_bucket) / stride + 1;
                    let points = self.query_buckets(job, &ascending, &kind, first_bucket, stride, buckets).await?;
                    Ok((points, stride))
                }

                async fn count_metrics(&self, job: JobId, query: &MetricsQuery) -> StoreResult<i64> {
                    let mut q = Builder::new("SELECT COUNT(*) FROM metrics WHERE job_id = ");
                    q.push_bind(job.0);
                    push_metric_filters!(q, query);
                    let (count,): (i64,) = q.build_query_as().fetch_one(self.pool()).await?;
                    Ok(count)
                }
            }
        };
    };
}

pub(crate) use impl_metric_store;
