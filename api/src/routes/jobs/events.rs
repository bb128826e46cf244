//! A job's events: its state changes and restarts, as a JSON page or as a Server-Sent Events stream that
//! follows the job.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use ringtrain_core::JobId;
use ringtrain_store::JobEvent;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::access::team_job;
use crate::admission::requests::StreamSlot;
use crate::auth::User;
use crate::error::ApiResult;
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only events after this sequence number (SSE also honours `Last-Event-ID`).
    pub after: Option<i64>,
}

pub use ringtrain_views::jobs::records::EventList;

const EVENT_PAGE: i64 = 1000;

/// The job's state changes and restarts. With `Accept: text/event-stream`, a Server-Sent Events stream that
/// follows the job until it ends, or until the stream's lifetime (an hour by default) is over: reconnect
/// with `Last-Event-ID` to go on. A token may follow a few streams at once (8 by default; 429 beyond).
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", params(("id" = Uuid, Path), EventsQuery),
    responses((status = 200, description = "JSON list, or an SSE stream (`event: state` for a state change, `event: warning` for a warning, data: a JobEvent)", 
            content((EventList = "application/json"), (String = "text/event-stream"))),
        (status = 404),
        (status = 429, description = "This token already holds as many event streams as it may")),
    security(("bearer" = [])))]
pub async fn job_events(
    State(state): State<AppState>,
    user: User,
    headers: HeaderMap,
    ApiPath(id): ApiPath<JobId>,
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
                return Some((Ok(Event::default().id(event.seq.to_string()).event(&event.kind).data(data)), c));
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
