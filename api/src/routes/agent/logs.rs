//! A rank's output lines, relayed by its agent (`POST /v1/agent/jobs/{id}/logs`): accepted from an agent
//! holding a rank of that placement, within the job's rate and total, each line stored once.

use axum::extract::State;
use axum::Json;
use ringtrain_core::{FieldError, JobId};
use ringtrain_protocol::{LogAck, LogBatch, MAX_LOG_LINE_BYTES};

use crate::access::assigned_job;
use crate::auth::Agent;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, JsonBody};
use crate::state::AppState;

/// Lines in one batch.
const MAX_BATCH_LINES: usize = 2_000;

/// A batch of one rank's output lines. Lines beyond the job's rate (`--log-lines-per-second`) or its total
/// (`--max-log-lines-per-job`) are dropped and counted.
#[utoipa::path(post, path = "/v1/agent/jobs/{id}/logs", tag = "agent", params(("id" = Uuid, Path)),
    request_body = LogBatch,
    responses((status = 200, body = LogAck), (status = 404), (status = 422)),
    security(("bearer" = [])))]
pub async fn report_logs(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<JobId>,
    JsonBody(body): JsonBody<LogBatch>,
) -> ApiResult<Json<LogAck>> {
    let job = assigned_job(&state, &agent, id, body.attempt).await?;
    let mut errors = Vec::new();
    if !(0..job.devices).contains(&body.rank) {
        errors.push(FieldError::new(
            "rank",
            format!("must be 0 to {} (the job has {} ranks)", job.devices - 1, job.devices),
        ));
    }
    if body.lines.len() > MAX_BATCH_LINES {
        errors.push(FieldError::new("lines", format!("at most {MAX_BATCH_LINES} lines per batch")));
    }
    for (i, line) in body.lines.iter().enumerate().take(MAX_BATCH_LINES) {
        if !matches!(line.stream.as_str(), "stdout" | "stderr") {
            errors.push(FieldError::new(format!("lines[{i}].stream"), "must be stdout or stderr"));
        }
        if line.text.len() > MAX_LOG_LINE_BYTES {
            errors.push(FieldError::new(format!("lines[{i}].text"), format!("at most {MAX_LOG_LINE_BYTES} bytes")));
        }
        if line.seq < 0 {
            errors.push(FieldError::new(format!("lines[{i}].seq"), "must be at least 0"));
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    let wanted = body.lines.len();
    let room = (state.config.max_log_lines_per_job - state.store.count_logs(job.id).await?).max(0) as usize;
    let allowed = state.log_budgets.take(job.id, wanted.min(room), std::time::Instant::now());
    let stored = state.store.append_logs(job.id, body.attempt, body.rank, &body.lines[..allowed]).await?;
    Ok(Json(LogAck { stored, dropped: (wanted - allowed) as u64 }))
}
