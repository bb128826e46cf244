//! `GET /v1/jobs/{id}/logs`: what the job's ranks printed, filtered by rank, placement and text, in pages
//! or as an SSE stream that follows the job.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use ringtrain_core::JobId;
use ringtrain_store::{LogQuery, RankLogLine};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::access::team_job;
use crate::admission::requests::StreamSlot;
use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, ApiQuery};
use crate::routes::jobs::events::wants_event_stream;
use crate::state::AppState;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    /// Only this rank's lines.
    #[param(minimum = 0)]
    pub rank: Option<i32>,
    /// Only this placement's lines (the `placement` of the job's events).
    #[param(minimum = 0)]
    pub attempt: Option<i32>,
    /// Only lines after this id (`next_since` of the previous page; SSE also honours `Last-Event-ID`).
    #[param(minimum = 0)]
    pub since: Option<i64>,
    /// Only lines containing this text (case-sensitive), 1 to 200 characters.
    #[param(min_length = 1, max_length = 200)]
    pub q: Option<String>,
    /// 1 to 5000 (default 1000).
    #[param(minimum = 1, maximum = 5000)]
    pub limit: Option<i64>,
}

pub use ringtrain_views::jobs::records::LogPage;

const MAX_LIMIT: i64 = 5000;
/// How often a following stream looks for new lines (log batches do not move the change notifier).
const FOLLOW_POLL: Duration = Duration::from_secs(1);

/// The job's rank output: each rank's stderr and the stdout lines that are not metric reports, as their
/// agents relayed them, in arrival order. With `Accept: text/event-stream`, an SSE stream (`event: line`,
/// data: a line) that follows the job until it has ended and every line was sent.
#[utoipa::path(get, path = "/v1/jobs/{id}/logs", tag = "jobs", params(("id" = Uuid, Path), LogsQuery),
    responses((status = 200, description = "JSON page, or an SSE stream",
            content((LogPage = "application/json"), (String = "text/event-stream"))),
        (status = 400), (status = 404),
        (status = 429, description = "This token already holds as many event streams as it may")),
    security(("bearer" = [])))]
pub async fn job_logs(
    State(state): State<AppState>,
    user: User,
    headers: HeaderMap,
    ApiPath(id): ApiPath<JobId>,
    ApiQuery(params): ApiQuery<LogsQuery>,
) -> ApiResult<Response> {
    let job = team_job(&state, &user, id).await?;
    let bad = |field: &str, reason: &str| ApiError::field(ProblemType::BadQueryParameter, field, reason);
    let limit = params.limit.unwrap_or(1000);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(bad("limit", "must be 1 to 5000"));
    }
    if params.q.as_ref().is_some_and(|q| q.is_empty() || q.chars().count() > 200) {
        return Err(bad("q", "must be 1 to 200 characters"));
    }
    if params.rank.is_some_and(|r| r < 0)
        || params.attempt.is_some_and(|a| a < 0)
        || params.since.is_some_and(|s| s < 0)
    {
        return Err(bad("rank", "rank, attempt and since must be at least 0"));
    }
    let last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let since = params.since.or(last_event_id).unwrap_or(0);
    let query = LogQuery { rank: params.rank, attempt: params.attempt, after: Some(since), contains: params.q, limit };
    if !wants_event_stream(&headers) {
        let lines = state.store.query_logs(job.id, &query).await?;
        let next_since = lines.last().map_or(since, |l| l.id);
        return Ok(Json(LogPage { lines, next_since }).into_response());
    }
    let slot = state.admission.open_stream(user.token.id)?;
    Ok(Sse::new(follow_logs(state, job.id, query, slot)).keep_alive(KeepAlive::default()).into_response())
}

/// Reads new lines every [`FOLLOW_POLL`] (or sooner when something changed), and ends once the job is
/// terminal and no line is left, or the stream's lifetime is over.
fn follow_logs(
    state: AppState,
    job: JobId,
    query: LogQuery,
    slot: StreamSlot,
) -> impl Stream<Item = Result<Event, Infallible>> {
    struct Cursor {
        state: AppState,
        job: JobId,
        query: LogQuery,
        pending: std::collections::VecDeque<RankLogLine>,
        done: bool,
        first: bool,
        ends_at: tokio::time::Instant,
        _slot: StreamSlot,
    }
    let ends_at = tokio::time::Instant::now() + state.config.admission.max_stream_lifetime;
    let cursor =
        Cursor { state, job, query, pending: Default::default(), done: false, first: true, ends_at, _slot: slot };
    stream::unfold(cursor, |mut c| async move {
        loop {
            if let Some(line) = c.pending.pop_front() {
                c.query.after = Some(line.id);
                let data = serde_json::to_string(&line).unwrap_or_default();
                return Some((Ok(Event::default().id(line.id.to_string()).event("line").data(data)), c));
            }
            if c.done || tokio::time::Instant::now() >= c.ends_at {
                return None;
            }
            if !c.first {
                let seen = c.state.changes.version();
                let wait = FOLLOW_POLL.min(c.ends_at - tokio::time::Instant::now());
                c.state.changes.wait_past(seen, wait).await;
            }
            c.first = false;
            // the job's state before its lines: a line stored after this read is still fetched below
            let terminal = match c.state.store.get_job(c.job).await {
                Ok(Some(job)) => job.state.is_terminal(),
                Ok(None) => true,
                Err(err) => {
                    tracing::warn!(error = %err, "log stream: reading the job failed");
                    false
                }
            };
            match c.state.store.query_logs(c.job, &c.query).await {
                Ok(lines) => {
                    let full_page = lines.len() as i64 == c.query.limit;
                    c.pending.extend(lines);
                    c.done = terminal && !full_page;
                }
                Err(err) => tracing::warn!(error = %err, "log stream: reading lines failed"),
            }
        }
    })
}
