//! What a job measured and the learning rate it trains with: its metrics (paged, optionally downsampled)
//! and its schedule.

use axum::extract::State;
use axum::Json;
use ringtrain_core::JobId;
use ringtrain_store::MetricsQuery;
use serde::Deserialize;
use serde_json::Value;
use utoipa::IntoParams;

use crate::access::team_job;
use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MetricsParams {
    /// Reports of this kind only: `iteration`, `epoch`, or `system` (each rank's CPU and memory as its agent
    /// sampled them, whose `iteration` is the Unix second of the sample).
    pub kind: Option<String>,
    /// Only this metric (`loss`, `lr`, `test_error`, ...); points without it are left out.
    pub name: Option<String>,
    pub rank: Option<i32>,
    pub from_iteration: Option<i64>,
    /// Downsample to about this many points per series, for plots: 1 to 100,000. With `kind`, the first report
    /// at or after every `stride`-th iteration of each series (cheap however long the job ran); without, every
    /// `stride`-th report of each series (the whole job is counted).
    #[param(minimum = 1, maximum = 100_000)]
    pub points: Option<u32>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^.*:-?[0-9]{1,18}:-?[0-9]{1,9}$")]
    pub cursor: Option<String>,
    /// 1 to 10000 (default 1000).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<u32>,
}

pub use ringtrain_views::jobs::records::MetricsPage;

const MAX_METRICS_PAGE: u32 = 10_000;
/// The most points per series a downsampled read asks for.
const MAX_POINTS: u32 = 100_000;

/// Per-iteration and per-epoch metrics (loss, lr, throughput, allreduce time, test error).
#[utoipa::path(get, path = "/v1/jobs/{id}/metrics", tag = "jobs", params(("id" = Uuid, Path), MetricsParams),
    responses((status = 200, body = MetricsPage),
        (status = 400),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn job_metrics(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<JobId>,
    ApiQuery(params): ApiQuery<MetricsParams>,
) -> ApiResult<Json<MetricsPage>> {
    let job = team_job(&state, &user, id).await?;
    let bad = |path: &str, reason: &str| ApiError::field(ProblemType::BadQueryParameter, path, reason);
    let limit = params.limit.unwrap_or(1000);
    if !(1..=MAX_METRICS_PAGE).contains(&limit) {
        return Err(bad("limit", "must be 1 to 10000"));
    }
    if params.points.is_some_and(|points| !(1..=MAX_POINTS).contains(&points)) {
        return Err(bad("points", "must be 1 to 100000"));
    }
    let after = match &params.cursor {
        None => None,
        Some(cursor) => {
            Some(parse_metrics_cursor(cursor).ok_or_else(|| bad("cursor", "not a cursor this server issued"))?)
        }
    };
    let query = MetricsQuery {
        kind: params.kind.clone(),
        rank: params.rank,
        from_iteration: params.from_iteration,
        after,
        stride: 1,
        limit: i64::from(limit) + 1,
        newest_first: false,
    };
    let (mut points, stride) = match params.points {
        Some(points) => state.store.downsample_metrics(job.id, &query, i64::from(points)).await?,
        None => (state.store.query_metrics(job.id, &query).await?, 1),
    };
    let more = points.len() > limit as usize;
    points.truncate(limit as usize);
    let next_cursor = if more { points.last().map(|p| format!("{}:{}:{}", p.kind, p.iteration, p.rank)) } else { None };
    if let Some(name) = &params.name {
        points.retain_mut(|p| match p.fields.remove(name) {
            Some(value) => {
                p.fields = [(name.clone(), value)].into_iter().collect();
                true
            }
            None => false,
        });
    }
    Ok(Json(MetricsPage { points, stride, next_cursor }))
}

fn parse_metrics_cursor(cursor: &str) -> Option<(String, i64, i32)> {
    let mut parts = cursor.rsplitn(3, ':');
    let rank = parts.next()?.parse().ok()?;
    let iteration = parts.next()?.parse().ok()?;
    let kind = parts.next()?.to_string();
    Some((kind, iteration, rank))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ScheduleParams {
    /// Also list the lr of every iteration.
    pub per_iteration: Option<bool>,
}

/// The most per-iteration lrs one response lists.
pub const MAX_PER_ITERATION: u64 = 2_000_000;

/// The learning-rate schedule the job trains with: effective hyperparameters, per-epoch summary and change
/// points (`?per_iteration=true` adds every iteration's lr).
#[utoipa::path(get, path = "/v1/jobs/{id}/schedule", tag = "jobs", params(("id" = Uuid, Path), ScheduleParams),
    responses((status = 200, description = "ScheduleView", body = Object),
        (status = 404),
        (status = 409, description = "The dataset's size is not known yet"),
        (status = 422, description = "per_iteration for a job of more than 2,000,000 iterations")),
    security(("bearer" = [])))]
pub async fn job_schedule(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<JobId>,
    ApiQuery(params): ApiQuery<ScheduleParams>,
) -> ApiResult<Json<Value>> {
    let job = team_job(&state, &user, id).await?;
    let Some(size) = job.dataset_size else {
        return Err(ApiError::conflict("the dataset's size is not known until a worker reads it"));
    };
    let effective = ringtrain_core::Effective::new(&job.spec, size as u64)
        .map_err(|errors| ApiError::internal_msg(format!("stored spec no longer validates: {errors:?}")))?;
    let per_iteration = params.per_iteration.unwrap_or(false);
    if per_iteration && effective.total_iterations > MAX_PER_ITERATION {
        return Err(ApiError::field(
            ProblemType::TooLarge,
            "per_iteration",
            format!(
                "{} iterations is more than {MAX_PER_ITERATION}; use the change points",
                effective.total_iterations
            ),
        ));
    }
    Ok(Json(serde_json::to_value(effective.render(per_iteration)).map_err(ApiError::internal)?))
}
