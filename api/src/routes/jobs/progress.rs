//! What a job did, as it happens: its events (JSON, or an SSE stream that follows the job), its metrics
//! (paged, optionally downsampled), the learning-rate schedule it uses, and its checkpoints.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use ringtrain_core::{JobId, JobSpec};
use ringtrain_store::{Checkpoint, JobEvent, MetricPoint, MetricsQuery};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::access::team_job;
use crate::admission::requests::StreamSlot;
use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only events after this sequence number (SSE also honours `Last-Event-ID`).
    pub after: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventList {
    pub events: Vec<JobEvent>,
}

const EVENT_PAGE: i64 = 1000;

/// The job's state changes and restarts. With `Accept: text/event-stream`, a Server-Sent Events stream that
/// follows the job until it ends, or until the stream's lifetime (an hour by default) is over: reconnect
/// with `Last-Event-ID` to go on. A token may follow a few streams at once (8 by default; 429 beyond).
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", params(("id" = Uuid, Path), EventsQuery),
    responses((status = 200, description = "JSON list, or an SSE stream (`event: state`, data: a JobEvent)", 
            content((EventList = "application/json"), (String = "text/event-stream"))),
        (status = 404),
        (status = 429, description = "This token already holds as many event streams as it may")),
    security(("bearer" = [])))]
pub async fn job_events(
    State(state): State<AppState>,
    user: User,
    headers: HeaderMap,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> ApiResult<Response> {
    let job = team_job(&state, &user, id).await?;
    let wants_stream = wants_event_stream(&headers);
    let last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let after = query.after.or(last_event_id).unwrap_or(0);
    if !wants_stream {
        let events = state.store.list_events(job.id, after, EVENT_PAGE).await?;
        return Ok(Json(EventList { events }).into_response());
    }
    let slot = state.admission.open_stream(user.token.id)?;
    Ok(Sse::new(follow_events(state, job.id, after, slot)).keep_alive(KeepAlive::default()).into_response())
}

/// Whether the caller asked for Server-Sent Events (`Accept: text/event-stream`) rather than JSON.
pub fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|accept| accept.contains("text/event-stream"))
}

/// Reads the store for new events whenever something changed (the change notifier that wakes the
/// scheduler and the agents' long polls; `event_poll` is only a safety net for a missed wake-up), and ends
/// once the job is terminal and every event has been sent, or the stream's lifetime is over. The stream
/// holds its token's `slot` until it is dropped.
fn follow_events(
    state: AppState,
    job: JobId,
    after: i64,
    slot: StreamSlot,
) -> impl Stream<Item = Result<Event, Infallible>> {
    struct Cursor {
        state: AppState,
        job: JobId,
        after: i64,
        pending: std::collections::VecDeque<JobEvent>,
        done: bool,
        /// The change version before the last read: a wait returns once it moves on.
        seen: Option<u64>,
        ends_at: tokio::time::Instant,
        _slot: StreamSlot,
    }
    let ends_at = tokio::time::Instant::now() + state.config.admission.max_stream_lifetime;
    let cursor =
        Cursor { state, job, after, pending: Default::default(), done: false, seen: None, ends_at, _slot: slot };
    stream::unfold(cursor, |mut c| async move {
        loop {
            if let Some(event) = c.pending.pop_front() {
                c.after = event.seq;
                let data = serde_json::to_string(&event).unwrap_or_default();
                return Some((Ok(Event::default().id(event.seq.to_string()).event("state").data(data)), c));
            }
            if c.done || tokio::time::Instant::now() >= c.ends_at {
                return None;
            }
            if let Some(seen) = c.seen {
                let wait = c.state.config.event_poll.min(c.ends_at - tokio::time::Instant::now());
                c.state.changes.wait_past(seen, wait).await;
            }
            c.seen = Some(c.state.changes.version());
            // Read the job's state before its events: an event written after this read is still fetched
            // below, so a terminal state seen here means no event can be missed.
            let terminal = match c.state.store.get_job(c.job).await {
                Ok(Some(job)) => job.state.is_terminal(),
                Ok(None) => true,
                Err(err) => {
                    tracing::warn!(error = %err, "event stream: reading the job failed");
                    false
                }
            };
            match c.state.store.list_events(c.job, c.after, EVENT_PAGE).await {
                Ok(events) => {
                    let full_page = events.len() as i64 == EVENT_PAGE;
                    c.pending.extend(events);
                    c.done = terminal && !full_page;
                }
                Err(err) => tracing::warn!(error = %err, "event stream: reading events failed"),
            }
        }
    })
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MetricsParams {
    /// `iteration` or `epoch` reports only.
    pub kind: Option<String>,
    /// Only this metric (`loss`, `lr`, `test_error`, ...); points without it are left out.
    pub name: Option<String>,
    pub rank: Option<i32>,
    pub from_iteration: Option<i64>,
    /// Downsample to about this many points per series (every k-th point), for plots: 1 to 100,000.
    #[param(minimum = 1, maximum = 100_000)]
    pub points: Option<u32>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^.*:-?[0-9]{1,18}:-?[0-9]{1,9}$")]
    pub cursor: Option<String>,
    /// 1 to 10000 (default 1000).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MetricsPage {
    pub points: Vec<MetricPoint>,
    /// Every `stride`-th report of each series was kept.
    pub stride: i64,
    pub next_cursor: Option<String>,
}

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
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(params): ApiQuery<MetricsParams>,
) -> ApiResult<Json<MetricsPage>> {
    let job = team_job(&state, &user, id).await?;
    let bad = |path: &str, reason: &str| ApiError::field(StatusCode::BAD_REQUEST, "bad-query-parameter", path, reason);
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
    let mut query = MetricsQuery {
        kind: params.kind.clone(),
        rank: params.rank,
        from_iteration: params.from_iteration,
        after,
        stride: 1,
        limit: i64::from(limit) + 1,
    };
    if let Some(points) = params.points {
        let count = state.store.count_metrics(job.id, &query).await?;
        query.stride = ((count + i64::from(points) - 1) / i64::from(points)).max(1);
    }
    let mut points = state.store.query_metrics(job.id, &query).await?;
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
    Ok(Json(MetricsPage { points, stride: query.stride, next_cursor }))
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
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(params): ApiQuery<ScheduleParams>,
) -> ApiResult<Json<Value>> {
    let job = team_job(&state, &user, id).await?;
    let Some(size) = job.dataset_size else {
        return Err(ApiError::conflict("the dataset's size is not known until a worker reads it"));
    };
    let spec: JobSpec = serde_json::from_value(job.spec.clone()).map_err(ApiError::internal)?;
    let effective = ringtrain_core::Effective::new(&spec, size as u64)
        .map_err(|errors| ApiError::internal_msg(format!("stored spec no longer validates: {errors:?}")))?;
    let per_iteration = params.per_iteration.unwrap_or(false);
    if per_iteration && effective.total_iterations > MAX_PER_ITERATION {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "too-large",
            "per_iteration",
            format!(
                "{} iterations is more than {MAX_PER_ITERATION}; use the change points",
                effective.total_iterations
            ),
        ));
    }
    Ok(Json(serde_json::to_value(effective.render(per_iteration)).map_err(ApiError::internal)?))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CheckpointList {
    pub checkpoints: Vec<Checkpoint>,
}

/// The job's checkpoints, oldest first; `is_final` marks the finished job's weights.
#[utoipa::path(get, path = "/v1/jobs/{id}/checkpoints", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = CheckpointList),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn job_checkpoints(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<CheckpointList>> {
    let job = team_job(&state, &user, id).await?;
    Ok(Json(CheckpointList { checkpoints: state.store.list_checkpoints(job.id).await? }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedCheckpoints {
    pub deleted: usize,
    pub freed_bytes: i64,
    /// Lines of its ranks' output deleted with them.
    pub log_lines: u64,
}

/// Delete a finished job's artifacts: its checkpoints, final weights too, freeing the team's storage, and
/// its ranks' output (its record, events and metrics stay). Refused (409) while the job may still resume from them.
#[utoipa::path(delete, path = "/v1/jobs/{id}/artifacts", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = DeletedCheckpoints),
        (status = 403),
        (status = 404),
        (status = 409, description = "The job has not finished")),
    security(("bearer" = [])))]
pub async fn delete_job_artifacts(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<DeletedCheckpoints>> {
    user.require_write()?;
    let job = team_job(&state, &user, id).await?;
    if !job.state.is_terminal() {
        return Err(ApiError::conflict(format!("job {id} is {}: it may still resume from its checkpoints", job.state)));
    }
    let deleted = state.store.delete_checkpoints(job.id).await?;
    let folder = state.config.data_dir.join("checkpoints").join(job.id.to_string());
    crate::storage::remove_files(&folder, deleted.iter().map(|c| c.path.as_str())).await;
    let freed_bytes = deleted.iter().map(|c| c.size_bytes).sum();
    let log_lines = state.store.delete_logs(job.id).await?;
    Ok(Json(DeletedCheckpoints { deleted: deleted.len(), freed_bytes, log_lines }))
}
