//! What an agent relays from the ranks of one placement: that they started, their metrics, and the result.
//! Each is accepted only from an agent holding a rank of that attempt, and a success only from rank 0's.
//! (Checkpoints are uploaded as files, `PUT .../checkpoints/{name}` in [`super::files`]; there is no route that
//! records a path an agent names, which would let it make the server serve any file.)

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use ringtrain_core::{AssignmentState, FieldError, JobId, JobState};
use ringtrain_protocol::{AttemptBody, MetricsAck, MetricsBatch, Outcome, ResultAck, ResultReport};
use ringtrain_store::{Assignment, MetricPoint, Transition};
use serde_json::{Map, Value};

use crate::access::{assigned_job, rank_zero_job};
use crate::auth::Agent;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, JsonBody};
use crate::state::AppState;

/// The ranks of this attempt started: scheduled → running.
#[utoipa::path(post, path = "/v1/agent/jobs/{id}/running", tag = "agent", params(("id" = Uuid, Path)),
    request_body = AttemptBody,
    responses((status = 200, description = "Running"),
        (status = 404),
        (status = 409, description = "Stale attempt or state")),
    security(("bearer" = [])))]
pub async fn job_running(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<JobId>,
    JsonBody(body): JsonBody<AttemptBody>,
) -> ApiResult<StatusCode> {
    let job = assigned_job(&state, &agent, id, body.attempt).await?;
    let transition =
        Transition::new(job.id, JobState::Scheduled, JobState::Running, format!("{} started", job.placement_name()))
            .at_attempt(body.attempt);
    match state.store.transition(&transition).await? {
        Some(_) => {
            // wakes the job's event streams
            state.changed().await;
            Ok(StatusCode::OK)
        }
        None => Err(ApiError::conflict(format!("job {id} attempt {} is not scheduled", body.attempt))),
    }
}

pub const MAX_REPORTS: usize = 10_000;
/// The kind of an agent's sample of a rank's CPU and memory, whose iteration is the Unix second it was
/// taken at (`ringtrain_agent`'s `system_metrics`).
pub const SYSTEM_KIND: &str = "system";
/// How far ahead of the server's clock an agent's may be for its system reports.
const SYSTEM_CLOCK_SLACK_S: i64 = 86_400;
/// Numbers one report may carry besides kind, rank, epoch and iteration.
pub const MAX_REPORT_FIELDS: usize = 32;
/// The longest name of a reported number.
pub const MAX_FIELD_NAME: usize = 64;

/// Turns a rank's report into a stored point, naming the path of anything wrong. `total_iterations`, when
/// known, bounds the iteration: a report past the job's end is not one the trainer makes.
pub fn parse_report(
    i: usize,
    attempt: i32,
    ranks: i32,
    total_iterations: Option<u64>,
    mut report: Map<String, Value>,
) -> Result<MetricPoint, Vec<FieldError>> {
    let mut errors = Vec::new();
    let path = |field: &str| format!("reports[{i}].{field}");
    let kind = match report.remove("kind") {
        Some(Value::String(kind))
            if (1..=32).contains(&kind.len()) && kind.chars().all(|c| c.is_ascii_lowercase() || c == '_') =>
        {
            kind
        }
        _ => {
            errors.push(FieldError::new(path("kind"), "must be a name of a-z and _ (iteration, epoch, ...)"));
            String::new()
        }
    };
    let mut integer = |field: &str, max: i64| match report.remove(field).and_then(|v| v.as_i64()) {
        Some(n) if (0..=max).contains(&n) => n,
        _ => {
            errors.push(FieldError::new(path(field), format!("must be an integer from 0 to {max}")));
            0
        }
    };
    let rank = integer("rank", i64::from(ranks.max(1) - 1));
    let epoch = integer("epoch", i64::from(i32::MAX));
    // an agent's system report is keyed by the Unix second it was taken at, by the agent's clock: one
    // that is off by up to a day is let by (a refused report would take the rank's training reports of the
    // same batch with it)
    let last_iteration = match kind.as_str() {
        SYSTEM_KIND => chrono::Utc::now().timestamp() + SYSTEM_CLOCK_SLACK_S,
        _ => total_iterations.map_or(i64::MAX / 2, |total| i64::try_from(total).unwrap_or(i64::MAX)),
    };
    let iteration = integer("iteration", last_iteration);
    if report.len() > MAX_REPORT_FIELDS {
        errors.push(FieldError::new(path("*"), format!("at most {MAX_REPORT_FIELDS} numbers per report")));
    }
    for (name, value) in report.iter().take(MAX_REPORT_FIELDS + 1) {
        let plain = (1..=MAX_FIELD_NAME).contains(&name.len())
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !plain {
            let shown: String = name.chars().take(MAX_FIELD_NAME).collect();
            errors.push(FieldError::new(
                path(&shown),
                format!("a metric's name is 1 to {MAX_FIELD_NAME} of a-z, 0-9 and _"),
            ));
        } else if !(value.is_number() || value.is_null()) {
            errors.push(FieldError::new(path(name), "must be a number"));
        } else if kind == SYSTEM_KIND && value.as_f64().is_some_and(|v| !v.is_finite() || v < 0.0) {
            // shown per node to every team and exported: a measure, never negative
            errors.push(FieldError::new(path(name), "must be a number of at least 0"));
        }
    }
    if errors.is_empty() {
        Ok(MetricPoint { kind, rank: rank as i32, epoch, iteration, attempt, fields: report })
    } else {
        Err(errors)
    }
}

/// A batch of metric reports from the ranks of one attempt. (kind, iteration, rank) is the de-duplication
/// key: a resumed attempt's report replaces the earlier one instead of adding to it.
#[utoipa::path(post, path = "/v1/agent/jobs/{id}/metrics", tag = "agent", params(("id" = Uuid, Path)),
    request_body = MetricsBatch,
    responses((status = 200, body = MetricsAck, description = "Stored; beyond the job's budget of iteration reports per second, an evenly spaced subset (`downsampled`, `stride`)"),
        (status = 404),
        (status = 422, description = "A report's field is wrong: kind, rank, epoch, an iteration past the job's total (a `system` report's, a Unix second more than a day ahead of the server's clock; its numbers must be at least 0), more than 32 numbers, a name not of a-z, 0-9 and _")),
    security(("bearer" = [])))]
pub async fn report_metrics(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<JobId>,
    JsonBody(body): JsonBody<MetricsBatch>,
) -> ApiResult<Json<MetricsAck>> {
    if body.reports.len() > MAX_REPORTS {
        return Err(ApiError::validation(vec![FieldError::new("reports", format!("at most {MAX_REPORTS} per batch"))]));
    }
    let job = assigned_job(&state, &agent, id, body.attempt).await?;
    let total_iterations = job.effective.as_ref().map(|e| e.total_iterations);
    let mut points = Vec::with_capacity(body.reports.len());
    let mut errors = Vec::new();
    for (i, report) in body.reports.into_iter().enumerate() {
        match parse_report(i, body.attempt, job.devices, total_iterations, report) {
            Ok(point) => points.push(point),
            Err(mut e) => errors.append(&mut e),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    let thinned = state.metric_budgets.thin(job.id, points, std::time::Instant::now());
    state.store.record_metrics(job.id, &thinned.kept).await?;
    crate::reference_guard::after_report(&state, &job, &thinned.kept).await?;
    crate::search::after_report(&state, &job, &thinned.kept).await?;
    let warnings = state.training_watch.observe(job.id, &thinned.kept, std::time::Instant::now());
    for warning in &warnings {
        tracing::info!(job = %job.id, %warning, "warning");
        state.store.add_job_event(job.id, "warning", warning).await?;
    }
    if !warnings.is_empty() {
        // wakes the job's event streams
        state.changed().await;
    }
    Ok(Json(MetricsAck { accepted: thinned.kept.len(), downsampled: thinned.dropped, stride: thinned.stride }))
}

/// How long a success report waits here for the attempt's other ranks to end before the agent is told to
/// try again.
const OTHER_RANKS_WAIT: Duration = Duration::from_secs(10);

/// A success is taken only once every other rank of the attempt ended `done`. An agent ends its rank's
/// assignment after it sent the rank's last metric lines, so a job never succeeds with a rank's lines
/// still on the way, nor with lines that died with a killed agent: that rank's assignment never ends
/// `done`, the restarted agent reports it lost, the attempt fails and resumes from a checkpoint every
/// rank's reports reached ([`crate::resume`]). Waits here a few seconds (the other agents are usually
/// a tick behind), then answers 503 with `Retry-After` (the agent retries) or 409 when one of them ended
/// otherwise.
async fn other_ranks_done(state: &AppState, job: JobId, attempt: i32) -> ApiResult<()> {
    let deadline = tokio::time::Instant::now() + OTHER_RANKS_WAIT;
    loop {
        let ranks = state.store.job_assignments(job, attempt).await?;
        let others: Vec<&Assignment> = ranks.iter().filter(|a| a.rank != 0).collect();
        if let Some(ended) =
            others.iter().find(|a| matches!(a.state, AssignmentState::Failed | AssignmentState::Cancelled))
        {
            return Err(ApiError::conflict(format!(
                "rank {} of job {job} attempt {attempt} ended {}: the attempt cannot succeed",
                ended.rank, ended.state
            )));
        }
        let waiting: Vec<i32> = others.iter().filter(|a| a.state != AssignmentState::Done).map(|a| a.rank).collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::new(
                ProblemType::RanksStillRunning,
                format!("rank(s) {waiting:?} of job {job} attempt {attempt} have not ended yet: report again"),
            )
            .retry_after(2));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The attempt ended. A retryable failure with restarts left requeues the job (it resumes from its last
/// checkpoint); otherwise the job ends succeeded or failed.
#[utoipa::path(post, path = "/v1/agent/jobs/{id}/result", tag = "agent", params(("id" = Uuid, Path)),
    request_body = ResultReport,
    responses((status = 200, body = ResultAck),
        (status = 404),
        (status = 409, description = "Stale attempt, the job already ended, or another rank of the attempt ended failed"),
        (status = 503, description = "Another rank of the attempt has not ended yet: report again (Retry-After)")),
    security(("bearer" = [])))]
pub async fn report_result(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<JobId>,
    JsonBody(body): JsonBody<ResultReport>,
) -> ApiResult<Json<ResultAck>> {
    if body.error.as_ref().is_some_and(|e| e.len() > 16_384) {
        return Err(ApiError::validation(vec![FieldError::new("error", "at most 16384 bytes")]));
    }
    // any rank's agent may report a failure; only rank 0's (which holds result.json) a success
    let job = match body.outcome {
        Outcome::Succeeded => rank_zero_job(&state, &agent, id, body.attempt).await?,
        Outcome::Failed => assigned_job(&state, &agent, id, body.attempt).await?,
    };
    if body.outcome == Outcome::Succeeded {
        other_ranks_done(&state, job.id, body.attempt).await?;
    }
    let ended = match body.outcome {
        Outcome::Succeeded => {
            let mut result = body.result;
            if let Some(result) = result.as_mut() {
                let history = crate::placements::job_history(state.store.as_ref(), job.id, Some(body.attempt)).await?;
                crate::placements::annotate(result, &history);
            }
            state.store.succeed_job(job.id, body.attempt, result).await?
        }
        Outcome::Failed => {
            let why = body.error.as_deref().unwrap_or("unknown error");
            state.store.fail_placement(job.id, body.attempt, why, body.retryable).await?
        }
    };
    let Some(updated) = ended else {
        return Err(ApiError::conflict(format!("job {id} attempt {} is no longer running", body.attempt)));
    };
    crate::search::after_end(&state, &updated).await?;
    // Every agent holding a rank of this attempt learns from its next poll that the attempt is over and
    // reports its assignments ended, which frees their devices.
    state.changed().await;
    Ok(Json(ResultAck { state: updated.state }))
}
