//! What ranks report per iteration and per epoch: upserted on (job, kind, iteration, rank), read in pages,
//! optionally downsampled.

use async_trait::async_trait;
use ringtrain_core::JobId;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::error::StoreResult;

/// One report of a rank: an `iteration` or `epoch` line. `fields` holds the numbers (`loss`, `lr`,
/// `test_error`, ...). (kind, iteration, rank) is unique per job: reporting it again replaces it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MetricPoint {
    pub kind: String,
    pub rank: i32,
    pub epoch: i64,
    pub iteration: i64,
    pub attempt: i32,
    #[schema(value_type = Object)]
    pub fields: serde_json::Map<String, Value>,
}

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

macro_rules! impl_metric_store {
    ($store:ty) => {
        const _: () = {
            use ringtrain_core::JobId;
            use sqlx::types::Json;

            use crate::backend::SqlBackend;
            use crate::metrics::{dedup_points, push_metric_filters, MetricStore, METRICS_CHUNK};
            use crate::rows::{MetricRow, METRIC_COLUMNS};
            use crate::{now, MetricPoint, MetricsQuery, StoreResult};

            type Builder<'a> = sqlx::QueryBuilder<'a, <$store as SqlBackend>::Db>;

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
                    let mut q = Builder::new(format!("SELECT {METRIC_COLUMNS} FROM "));
                    if stride > 1 {
                        // Every stride-th point of each (kind, rank) series, numbered along the iteration axis.
                        q.push(
                            "(SELECT m.*, ROW_NUMBER() OVER (PARTITION BY kind, rank ORDER BY iteration) - 1 AS rn \
                             FROM metrics m WHERE job_id = ",
                        );
                    } else {
                        q.push("(SELECT m.*, 0 AS rn FROM metrics m WHERE job_id = ");
                    }
                    q.push_bind(job.0);
                    push_metric_filters!(q, query);
                    q.push(") s WHERE rn % ").push_bind(stride).push(" = 0");
                    if let Some((kind, iteration, rank)) = &query.after {
                        q.push(" AND (kind, iteration, rank) > (")
                            .push_bind(kind.clone())
                            .push(", ")
                            .push_bind(*iteration)
                            .push(", ")
                            .push_bind(*rank)
                            .push(")");
                    }
                    q.push(" ORDER BY kind, iteration, rank LIMIT ").push_bind(query.limit);
                    let rows: Vec<MetricRow> = q.build_query_as().fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn reported_progress(&self, job: JobId) -> StoreResult<Vec<crate::metrics::RankProgress>> {
                    let rows: Vec<(i32, Option<i64>, Option<i64>)> = sqlx::query_as(
                        "SELECT rank, MAX(CASE WHEN kind = 'iteration' THEN iteration END), \
                         SUM(CASE WHEN kind = 'epoch' THEN 1 ELSE 0 END) FROM metrics WHERE job_id = $1 GROUP BY rank",
                    )
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
