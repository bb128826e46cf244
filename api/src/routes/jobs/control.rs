//! A job stopped or started again: `POST /v1/jobs/{id}/cancel` and `/resume`.

use axum::extract::State;
use axum::Json;
use ringtrain_core::{JobId, JobState};
use ringtrain_store::Cancellation;

use super::JobView;
use crate::access::team_job;
use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiPath;
use crate::state::AppState;
use crate::submission::enqueue;

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
    let room = enqueue::room(&state, &user, 1, "resume it").await?;
    let resumed = room.resume(job.id, &format!("resumed by token {}", token_name(&user))).await?;
    let resumed = resumed.ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    Ok(Json(super::job_view(&resumed)))
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
            Ok(Json(super::job_view(&cancelled)))
        }
        Some(Cancellation::AlreadyEnded(ended)) => Err(ApiError::conflict(format!("job {id} already {}", ended.state))),
        None => Err(ApiError::not_found(format!("no job {id}"))),
    }
}
