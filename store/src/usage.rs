//! What placements used: each rank's time on its device, from its placement to its end, with the job's
//! team, submitting token and device kind. Accounting (device-seconds per team, token, kind, day), team
//! budgets and a job's per-placement history are sums over these spans.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{AssignmentState, JobId, TeamId, TokenId};

use crate::error::StoreResult;

/// One rank's time on its device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSpan {
    pub job_id: JobId,
    /// The placement (the assignment's `attempt`).
    pub placement: i32,
    pub rank: i32,
    pub team_id: TeamId,
    pub created_by: Option<TokenId>,
    pub kind: DeviceKind,
    /// When the placement claimed the device.
    pub start: DateTime<Utc>,
    /// When the rank ended and gave the device back; None while it is live.
    pub end: Option<DateTime<Utc>>,
    pub state: AssignmentState,
    /// The scheduler preempted its placement.
    pub preempted: bool,
    /// Rank 0 only: the iteration its placement resumed from, and the newest iteration reported before it.
    pub resumed_from: Option<i64>,
    pub reached_before: Option<i64>,
}

impl DeviceSpan {
    /// Seconds it held its device within [from, to) (a live one until `to`).
    pub fn seconds_within(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
        let start = self.start.max(from);
        let end = self.end.unwrap_or(to).min(to);
        ((end - start).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0)
    }
}

/// Which spans to read; every field narrows.
#[derive(Debug, Clone, Default)]
pub struct SpanFilter {
    pub teams: Option<Vec<TeamId>>,
    pub job: Option<JobId>,
    /// Spans that held their device at some time at or after `from`...
    pub from: Option<DateTime<Utc>>,
    /// ...and before `to`.
    pub to: Option<DateTime<Utc>>,
}

/// A team's device-seconds in the budget period holding `now`: (period start, next period's start, used).
pub async fn period_use(
    store: &dyn UsageStore,
    team: TeamId,
    period: crate::BudgetPeriod,
    now: DateTime<Utc>,
) -> StoreResult<(DateTime<Utc>, DateTime<Utc>, f64)> {
    let (start, next) = period.bounds(now);
    let filter = SpanFilter { teams: Some(vec![team]), from: Some(start), to: Some(now), job: None };
    let used = store.device_spans(&filter).await?.iter().map(|s| s.seconds_within(start, now)).sum();
    Ok((start, next, used))
}

/// Device-seconds of one team on one kind, over all time (live spans up to now).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTotal {
    pub team: String,
    pub kind: DeviceKind,
    pub device_seconds: f64,
}

#[async_trait]
pub trait UsageStore: Send + Sync {
    /// The spans matching `filter`, by start.
    async fn device_spans(&self, filter: &SpanFilter) -> StoreResult<Vec<DeviceSpan>>;
    /// Every team's device-seconds per kind, summed in the database (what `/metrics` exports).
    async fn device_totals(&self) -> StoreResult<Vec<DeviceTotal>>;
}

macro_rules! impl_usage_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use ringtrain_core::{JobId, TeamId, TokenId};
            use uuid::Uuid;

            use crate::backend::SqlBackend;
            use crate::error::StoreError;
            use crate::usage::{DeviceSpan, SpanFilter, UsageStore};
            use crate::StoreResult;

            type SpanRow = (
                Uuid,
                i32,
                i32,
                Uuid,
                Option<Uuid>,
                String,
                DateTime<Utc>,
                DateTime<Utc>,
                String,
                bool,
                Option<i64>,
                Option<i64>,
            );

            #[async_trait::async_trait]
            impl UsageStore for $store {
                async fn device_totals(&self) -> StoreResult<Vec<crate::usage::DeviceTotal>> {
                    let end = "CASE WHEN a.state IN ('pending', 'delivered', 'running') THEN $1 ELSE a.updated_at END";
                    let seconds = <Self as SqlBackend>::seconds_between("a.created_at", end);
                    let sql = format!(
                        "SELECT t.name, j.device, CAST(SUM({seconds}) AS DOUBLE PRECISION) FROM assignments a \
                         JOIN jobs j ON j.id = a.job_id JOIN teams t ON t.id = j.team_id \
                         GROUP BY t.name, j.device ORDER BY t.name, j.device"
                    );
                    let rows: Vec<(String, String, Option<f64>)> =
                        sqlx::query_as(&sql).bind(crate::now()).fetch_all(self.pool()).await?;
                    Ok(rows
                        .into_iter()
                        .map(|(team, kind, seconds)| crate::usage::DeviceTotal {
                            team,
                            kind: if kind == "gpu" {
                                ringtrain_core::spec::DeviceKind::Gpu
                            } else {
                                ringtrain_core::spec::DeviceKind::Cpu
                            },
                            device_seconds: seconds.unwrap_or(0.0).max(0.0),
                        })
                        .collect())
                }

                async fn device_spans(&self, filter: &SpanFilter) -> StoreResult<Vec<DeviceSpan>> {
                    let mut q = sqlx::QueryBuilder::<<Self as SqlBackend>::Db>::new(
                        "SELECT a.job_id, a.attempt, a.rank, j.team_id, j.created_by, j.device, a.created_at, \
                         a.updated_at, a.state, a.preempted, a.resumed_from, a.reached_before \
                         FROM assignments a JOIN jobs j ON j.id = a.job_id WHERE 1 = 1",
                    );
                    if let Some(teams) = &filter.teams {
                        if teams.is_empty() {
                            return Ok(Vec::new());
                        }
                        q.push(" AND j.team_id IN (");
                        let mut list = q.separated(", ");
                        for team in teams {
                            list.push_bind(team.0);
                        }
                        q.push(")");
                    }
                    if let Some(job) = filter.job {
                        q.push(" AND a.job_id = ").push_bind(job.0);
                    }
                    if let Some(to) = filter.to {
                        q.push(" AND a.created_at < ").push_bind(to);
                    }
                    if let Some(from) = filter.from {
                        q.push(" AND (a.state IN ('pending', 'delivered', 'running') OR a.updated_at >= ")
                            .push_bind(from)
                            .push(")");
                    }
                    q.push(" ORDER BY a.created_at, a.job_id, a.rank");
                    let rows: Vec<SpanRow> = q.build_query_as().fetch_all(self.pool()).await?;
                    rows.into_iter()
                        .map(|row| {
                            let (job, placement, rank, team, by, kind, start, updated, state, preempted, from, reached) =
                                row;
                            let state: ringtrain_core::AssignmentState =
                                state.parse().map_err(|e: String| StoreError::Corrupt(e))?;
                            let kind = match kind.as_str() {
                                "gpu" => ringtrain_core::spec::DeviceKind::Gpu,
                                _ => ringtrain_core::spec::DeviceKind::Cpu,
                            };
                            Ok(DeviceSpan {
                                job_id: JobId(job),
                                placement,
                                rank,
                                team_id: TeamId(team),
                                created_by: by.map(TokenId),
                                kind,
                                start,
                                end: (!state.is_live()).then_some(updated),
                                state,
                                preempted,
                                resumed_from: from,
                                reached_before: reached,
                            })
                        })
                        .collect()
                }
            }
        };
    };
}

pub(crate) use impl_usage_store;
