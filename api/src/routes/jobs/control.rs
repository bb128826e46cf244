//! A job stopped or started again: `POST /v1/jobs/{id}/cancel` and `/resume`, and the room in the team's queue
//! that a job entering it needs (a submission too).

use axum::extract::State;
use axum::Json;
use ringtrain_core::{JobId, JobState};
use ringtrain_store::Cancellation;

use super::JobView;
use crate::access::team_job;
use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::ApiPath;
use crate::state::AppState;

/// 429 when the team already has as many queued jobs as it may; `then` says what to do later ("submit
/// again").
pub async fn check_queue_room(state: &AppState, user: &User, then: &str) -> ApiResult<()> {
    if state.queue_room.surely_room(user.team_id, state.config.max_queued_per_team) {
        return Ok(());
    }
    let queued = state.store.count_queued(user.team_id).await?;
    state.queue_room.counted(user.team_id, queued);
    if queued >= state.config.max_queued_per_team {
        let reason = format!("your team has {queued} queued jobs, the most it may; {then} when some have started");
        return Err(ApiError::too_many(ProblemType::QueueFull, reason, 60));
    }
    Ok(())
}

/// How events name the token that acted: its label, else its id.
fn token_name(user: &User) -> String {
    user.token.label.clone().unwrap_or_else(|| user.token.id.to_string())
}

/// Resume a failed, cancelled or stopped job: it is queued again, placed like any job, and resumes from its newest
/// checkpoint (from the start when it has none, or its artifacts were deleted), with its restart budget
/// anew.
#[utoipa::path(post, path = "/v1/jobs/{id}/resume", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = JobView), (status = 403),
        (status = 404),
        (status = 409, description = "The job has not ended, or succeeded"),
        (status = 429, description = "The team's queue is full")),
    security(("bearer" = [])))]
pub async fn resume_job(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<JobView>> {
    let job = team_job(&state, &user, id).await?;
    user.require_write()?;
    if !matches!(job.state, JobState::Failed | JobState::Cancelled | JobState::Stopped) {
        return Err(ApiError::conflict(format!(
            "job {id} is {}: only a failed, cancelled or stopped job can be resumed",
            job.state
        )));
    }
    check_queue_room(&state, &user, "resume it").await?;
    let resumed = state.store.resume_job(job.id, &format!("resumed by token {}", token_name(&user))).await?;
    let resumed = resumed.ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    state.queue_room.queued(user.team_id, 1);
    state.changed().await;
    Ok(Json(JobView::from(&resumed)))
}

/// Cancel a job that has not finished; its ranks are told to stop (by their agents' next poll).
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = JobView), (status = 403),
        (status = 404),
        (status = 409, description = "Already finished")),
    security(("bearer" = [])))]
pub async fn cancel_job(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<JobView>> {
    let job = team_job(&state, &user, id).await?;
    user.require_write()?;
    let reason = format!("cancelled by token {}", token_name(&user));
    match state.store.cancel_job(job.id, &reason).await? {
        Some(Cancellation::Cancelled(cancelled)) => {
            crate::search::after_end(&state, &cancelled).await?;
            // Ranks already handed to agents keep their devices until the agents, told by their next poll,
            // stop them and say so.
            state.changed().await;
            Ok(Json(JobView::from(&cancelled)))
        }
        Some(Cancellation::AlreadyEnded(ended)) => Err(ApiError::conflict(format!("job {id} already {}", ended.state))),
        None => Err(ApiError::not_found(format!("no job {id}"))),
    }
}
