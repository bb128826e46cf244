//! /v1/jobs: submit, run history, one job; cancelled or resumed in [`control`], tagged and noted in
//! [`annotations`]. What a job did is beside it: its state changes in
//! [`events`], its metrics and LR schedule in [`metrics`], its ranks' output in [`logs`], its checkpoints
//! and weights in [`artifacts`]. Every route answers 404 for another team's job.

pub mod annotations;
pub mod artifacts;
pub mod control;
pub mod dry_run;
pub mod events;
pub mod logs;
pub mod metrics;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use ringtrain_core::{JobId, JobState};
use ringtrain_store::{IdempotencyKey, Job, JobFilter, Submitted};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};

use crate::access::team_job;
use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, ApiQuery, JsonBytes};
use crate::placements::job_history;
use crate::progress::live_progress;
use crate::queue::{self, Reader, Standing};
use crate::resources::job_resources;
use crate::state::AppState;
use crate::submission::checks;
use crate::submission::enqueue;

pub use ringtrain_views::jobs::{JobLinks, JobPage, JobResult, JobView, StudyMembership};

/// A job as the API shows it, without what is read beside the job's row (its standing in the queue, its
/// progress, resources and placements).
pub fn job_view(job: &Job) -> JobView {
    {
        let base = format!("/v1/jobs/{}", job.id);
        JobView {
            id: job.id,
            name: job.name.clone(),
            state: job.state,
            team_id: job.team_id,
            priority: job.priority,
            device: job.device,
            workers: job.spec.workers as i32,
            devices: job.devices,
            study: job.study.map(|s| StudyMembership { id: s.study_id, point: s.point }),
            attempt: job.user_attempt(),
            preemptions: job.preemptions,
            max_restarts: job.max_restarts,
            spec: job.spec_json.clone(),
            effective: job.effective.clone(),
            dataset_size: job.dataset_size,
            created_at: job.created_at,
            updated_at: job.updated_at,
            started_at: job.started_at,
            finished_at: job.finished_at,
            result: job.result.clone().and_then(JobResult::from_json),
            error: job.error.clone(),
            unplaceable: job.unplaceable.clone().filter(|_| job.state == JobState::Queued),
            pending_reason: None,
            queue_position: None,
            estimated_start: None,
            last_log_lines: None,
            progress: None,
            resources: None,
            placements: None,
            tags: job.tags.clone(),
            note: job.note.clone(),
            links: JobLinks {
                schedule: format!("{base}/schedule"),
                events: format!("{base}/events"),
                metrics: format!("{base}/metrics"),
                logs: format!("{base}/logs"),
                checkpoints: format!("{base}/checkpoints"),
                this: base,
            },
        }
    }
}

/// Adds where a queued job stands, naming only the jobs `reader` may see.
fn with_standing(mut view: JobView, standing: Option<&Standing>, reader: &Reader) -> JobView {
    if let Some(standing) = standing {
        view.pending_reason = Some(reader.pending_reason(&standing.reason));
        view.queue_position = standing.position;
    }
    view
}

/// Views of `jobs` for `user`, with the standing of those that are queued (one plan for the whole page).
async fn views(state: &AppState, user: &User, jobs: &[Job]) -> ApiResult<Vec<JobView>> {
    let standings = match jobs.iter().any(|j| j.state == JobState::Queued) {
        true => {
            let insight = state.queue_insight().await?;
            Some((queue::standings(&insight, jobs), Reader::new(user, &insight.read.view)))
        }
        false => None,
    };
    let mut views = Vec::with_capacity(jobs.len());
    for job in jobs {
        let mut view = job_view(job);
        if let Some((standings, reader)) = &standings {
            view = with_standing(view, standings.get(&job.id), reader);
            state.annotate_slurm(job.id, &mut view);
        }
        views.push(with_progress(state, job, view).await?);
    }
    Ok(views)
}

/// Adds a running job's progress.
async fn with_progress(state: &AppState, job: &Job, mut view: JobView) -> ApiResult<JobView> {
    if job.state == JobState::Running {
        view.progress = live_progress(state.store.as_ref(), job).await?;
    }
    Ok(view)
}

/// A dry run's answer as `user` may see it: other teams' jobs and teams are not named (`queue::Reader`).
/// The jobs it would preempt are always other teams': to a tenant, `preempts` is empty, and
/// `pending_reason.victims` still counts them.
async fn dry_run_for(state: &AppState, user: &User, mut answer: dry_run::DryRunView) -> ApiResult<dry_run::DryRunView> {
    let insight = state.queue_insight().await?;
    let reader = Reader::new(user, &insight.read.view);
    answer.message = reader.words(&answer.message);
    answer.pending_reason = answer.pending_reason.map(|reason| reader.hidden_reason(reason));
    answer.estimated_start = answer.estimated_start.map(|estimate| reader.estimate(estimate));
    answer.preempts.retain(|preempted| reader.may_see_job(preempted.job_id));
    answer.delays.retain(|delayed| reader.may_see_job(*delayed));
    Ok(answer)
}

const MAX_IDEMPOTENCY_KEY: usize = 255;

/// Lines of a failed job's output its view carries.
const FAILURE_LINES: i64 = 20;

/// 1 to 255 printable ASCII characters (spaces inside only): the header's pattern in the API document.
fn is_idempotency_key(key: &str) -> bool {
    let visible = |c: char| c.is_ascii_graphic();
    (1..=MAX_IDEMPOTENCY_KEY).contains(&key.len())
        && key.chars().all(|c| visible(c) || c == ' ')
        && key.starts_with(visible)
        && key.ends_with(visible)
}

/// A 200 from `POST /v1/jobs`: a replayed submission's job, or a dry run's answer (only in the API
/// document: each handler path builds its own).
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum SubmitReply {
    Replayed(Box<JobView>),
    DryRun(Box<dry_run::DryRunView>),
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SubmitQuery {
    /// true: store nothing, answer what the scheduler would do with the job now (a `DryRunView`).
    pub dry_run: Option<bool>,
}

/// Submit a job (or, with `dry_run=true`, see what the scheduler would do with it).
///
/// Validates the spec (every field error at once), derives the effective hyperparameters and stores the job
/// as `queued`. With `Idempotency-Key`, the same key and body return the same job (200), the same key with
/// another body is 409. With `dry_run=true` nothing is stored: the answer (200, a `DryRunView`) is the
/// scheduler's policy run on the current cluster with the job added: start (where, within the guarantee or
/// borrowing), reclaim (preempting which jobs), or wait (why, its place in the queue, the estimated start).
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs",
    request_body(content = Object, content_type = "application/json", description = "A job spec"),
    params(SubmitQuery, ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe: 1 to 255 visible ASCII characters",
        pattern = "^[!-~]([ -~]{0,253}[!-~])?$")),
    responses(
        (status = 201, description = "Stored as queued", body = JobView),
        (status = 200, description = "Replayed: this key made this job before (a `JobView`); or, with dry_run=true, what the scheduler would do (a `DryRunView`)",
            body = SubmitReply),
        (status = 400),
        (status = 401),
        (status = 403),
        (status = 409, description = "Idempotency-Key reused with another body"),
        (status = 413),
        (status = 415),
        (status = 422),
        (status = 429, description = "The team already has as many queued jobs as it may (1,000 by default), or a rate limit; see Retry-After"),
    ),
    security(("bearer" = [])))]
pub async fn submit_job(
    State(state): State<AppState>,
    user: User,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<SubmitQuery>,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Response> {
    user.require_write()?;
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(value) => {
            let key = std::str::from_utf8(value.as_bytes()).ok().filter(|key| is_idempotency_key(key));
            let key = key.ok_or_else(|| {
                ApiError::field(
                    ProblemType::BadHeader,
                    "Idempotency-Key",
                    format!("must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters (spaces only inside)"),
                )
            })?;
            let request_hash = crate::hex(&Sha256::digest(&body));
            Some(IdempotencyKey { key: key.to_string(), request_hash })
        }
    };
    let (reading, spec_json) = checks::parse_spec(&body)?;
    let room = enqueue::room(&state, &user, 1, "submit again").await?;
    let spec = reading.spec.clone();
    let new = checks::checked_job(&state, &user, reading, spec_json, None).await?;
    if query.dry_run == Some(true) {
        let answer = dry_run::answer(&state, &user, &spec, new.effective).await?;
        return Ok(Json(dry_run_for(&state, &user, answer).await?).into_response());
    }
    match room.submit(new, key).await? {
        Submitted::Created(job) => {
            let location = format!("/v1/jobs/{}", job.id);
            Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(job_view(&job))).into_response())
        }
        Submitted::Replayed(job) => Ok((StatusCode::OK, Json(job_view(&job))).into_response()),
        Submitted::KeyReused => {
            Err(ApiError::conflict("this Idempotency-Key was already used with a different request body"))
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListJobsQuery {
    /// queued | scheduled | running | succeeded | failed | cancelled
    #[param(value_type = Option<String>, pattern = "^(queued|scheduled|running|succeeded|failed|cancelled)$")]
    pub state: Option<JobState>,
    /// Only jobs whose name starts with this (case-sensitive).
    pub name_prefix: Option<String>,
    /// RFC 3339; inclusive.
    pub created_after: Option<DateTime<Utc>>,
    /// RFC 3339; exclusive.
    pub created_before: Option<DateTime<Utc>>,
    /// Only jobs with this tag.
    pub tag: Option<String>,
    /// Only jobs whose name or note holds this text (ASCII case ignored).
    pub q: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^-?[0-9]{1,18}$")]
    pub cursor: Option<String>,
    /// 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

const MAX_PAGE: u32 = 500;

/// The team's run history, newest first.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(ListJobsQuery),
    responses((status = 200, body = JobPage), (status = 400),
        (status = 401)),
    security(("bearer" = [])))]
pub async fn list_jobs(
    State(state): State<AppState>,
    user: User,
    ApiQuery(query): ApiQuery<ListJobsQuery>,
) -> ApiResult<Json<JobPage>> {
    let limit = query.limit.unwrap_or(50);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::field(ProblemType::BadQueryParameter, "limit", format!("must be 1 to {MAX_PAGE}")));
    }
    let before_seq = match &query.cursor {
        None => None,
        Some(cursor) => Some(cursor.parse::<i64>().map_err(|_| {
            ApiError::field(ProblemType::BadQueryParameter, "cursor", "not a cursor this server issued")
        })?),
    };
    let filter = JobFilter {
        state: query.state,
        name_prefix: query.name_prefix.filter(|p| !p.is_empty()),
        created_after: query.created_after,
        created_before: query.created_before,
        before_seq,
        tag: query.tag.filter(|t| !t.is_empty()),
        text: query.q.filter(|q| !q.is_empty()),
        // One more than asked tells whether another page exists.
        limit: i64::from(limit) + 1,
    };
    let mut jobs = state.store.list_jobs(user.team_id, &filter).await?;
    let more = jobs.len() > limit as usize;
    jobs.truncate(limit as usize);
    let next_cursor = if more { jobs.last().map(|j| j.seq.to_string()) } else { None };
    Ok(Json(JobPage { jobs: views(&state, &user, &jobs).await?, next_cursor }))
}

/// One job: spec, effective hyperparameters, state, result.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = JobView), (status = 400),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn get_job(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<JobView>> {
    let job = team_job(&state, &user, id).await?;
    let mut view = job_view(&job);
    if job.attempt > 0 {
        view.resources = Some(job_resources(state.store.as_ref(), &job).await?);
        view.placements = Some(job_history(state.store.as_ref(), job.id, None).await?.placements);
    }
    if job.state == JobState::Failed {
        view.last_log_lines = Some(state.store.last_stderr_lines(job.id, job.attempt, FAILURE_LINES).await?);
        return Ok(Json(view));
    }
    if job.state != JobState::Queued {
        return Ok(Json(with_progress(&state, &job, view).await?));
    }
    let insight = state.queue_insight().await?;
    let standing = insight.standing(&job);
    let reader = Reader::new(&user, &insight.read.view);
    let mut view = with_standing(view, standing.as_ref(), &reader);
    let planned = insight.read.view.queued.iter().any(|q| q.id == job.id);
    if planned {
        let estimate = queue::estimate(&state, &insight, insight.read.view.clone(), job.id).await?;
        view.estimated_start = Some(reader.estimate(estimate));
    }
    state.annotate_slurm(job.id, &mut view);
    Ok(Json(view))
}
