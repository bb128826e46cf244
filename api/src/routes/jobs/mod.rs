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
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{Effective, JobId, JobState, StudyId, TeamId};
use ringtrain_store::{IdempotencyKey, Job, JobFilter, RankLogLine, Submitted, Unplaceable};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};

use crate::access::team_job;
use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, ApiQuery, JsonBytes};
use crate::placements::{job_history, PlacementRecord};
use crate::progress::{live_progress, LiveProgress};
use crate::queue::{self, EstimatedStart, Reader, Standing};
use crate::resources::{job_resources, JobResources};
use crate::state::AppState;
use crate::submission::checks;
use crate::submission::enqueue;

/// A job as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    pub id: JobId,
    pub name: Option<String>,
    #[schema(value_type = String, example = "queued")]
    pub state: JobState,
    pub team_id: TeamId,
    pub priority: i32,
    /// `cpu` or `gpu`.
    #[schema(value_type = String, example = "cpu")]
    pub device: DeviceKind,
    /// k: the ranks of the run's math (global batch workers × per_worker_batch).
    pub workers: i32,
    /// The devices it holds when placed, each playing workers / devices virtual ranks (the spec's `devices`,
    /// by default `workers`).
    pub devices: i32,
    /// The study this job is a point of, and which point (0-based).
    pub study: Option<StudyMembership>,
    /// The attempt: 0 until first placed, 1 for the first run, one more per restart after a failure. A run
    /// that was preempted and resumes elsewhere continues the same attempt.
    pub attempt: i32,
    /// How often the scheduler reclaimed its devices (it resumed from its last checkpoint each time).
    pub preemptions: i32,
    pub max_restarts: i32,
    /// The spec as submitted.
    #[schema(value_type = Object)]
    pub spec: Value,
    /// The effective hyperparameters (scaled lr, warmup iterations, milestones...); null while the
    /// dataset's size is unknown.
    #[schema(value_type = Option<Object>)]
    pub effective: Option<Effective>,
    pub dataset_size: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub error: Option<String>,
    /// While queued: the pool as it exists cannot place this job (more devices than it has of the kind,
    /// or none of the kind), why, and since when. The job fails once the platform's grace period (an hour
    /// by default) has passed without the pool growing.
    pub unplaceable: Option<Unplaceable>,
    /// While queued: why it has not started, from the scheduler's own policy run on the current cluster
    /// (what its next pass decides). `code` is one of waiting_for_devices, head_of_line,
    /// head_of_line_reserved, behind_reservation, team_at_guarantee_pool_full, reclaiming,
    /// reclaim_after_min_run_time, too_large, no_devices_of_kind, previous_placement_stopping,
    /// beyond_queue_window, starting_next_pass, budget_exhausted; the other fields are the code's numbers (user guide, "Why a job
    /// waits"); `message` says it in words.
    #[schema(value_type = Option<Object>)]
    pub pending_reason: Option<Value>,
    /// While queued: its place among the waiting jobs of its device kind, as the policy orders them (1 is
    /// next); absent when it starts in the next pass or cannot be placed.
    pub queue_position: Option<u32>,
    /// While queued, on `GET /v1/jobs/{id}` only: when it is expected to start, and on what that rests.
    /// Here and in `pending_reason`, another team's job or team is null and "a job of another team" in
    /// words (a platform admin sees the ids).
    pub estimated_start: Option<EstimatedStart>,
    /// Failed, on `GET /v1/jobs/{id}` only: the last stderr lines of its last placement's ranks (the whole
    /// output is at `/v1/jobs/{id}/logs`).
    pub last_log_lines: Option<Vec<RankLogLine>>,
    /// While running: how far it has come (rank 0's newest report: iterations done of the total, epoch,
    /// loss, samples/s, all-reduce share); absent until it reports.
    pub progress: Option<LiveProgress>,
    /// On `GET /v1/jobs/{id}` only, once placed: the device-seconds it used, and what its ranks reported of
    /// their memory and CPU.
    pub resources: Option<JobResources>,
    /// On `GET /v1/jobs/{id}` only, once placed: every placement so far (devices, wall time, device-seconds,
    /// how it ended, where it resumed): an elastic job's device count over time.
    pub placements: Option<Vec<PlacementRecord>>,
    /// What the team wrote about the run (`PATCH /v1/jobs/{id}`): tags to filter by, and a note.
    pub tags: Vec<String>,
    pub note: String,
    pub links: JobLinks,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StudyMembership {
    pub id: StudyId,
    pub point: i32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct JobLinks {
    #[serde(rename = "self")]
    pub this: String,
    pub schedule: String,
    pub events: String,
    pub metrics: String,
    pub logs: String,
    pub checkpoints: String,
}

impl From<&Job> for JobView {
    fn from(job: &Job) -> Self {
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
            result: job.result.clone(),
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

impl JobView {
    /// Adds where a queued job stands, naming only the jobs `reader` may see.
    fn with_standing(mut self, standing: Option<&Standing>, reader: &Reader) -> Self {
        if let Some(standing) = standing {
            self.pending_reason = Some(reader.reason_json(&standing.reason));
            self.queue_position = standing.position;
        }
        self
    }
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
        let mut view = JobView::from(job);
        if let Some((standings, reader)) = &standings {
            view = view.with_standing(standings.get(&job.id), reader);
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
    if let Some(reason) = answer.pending_reason.as_mut() {
        reader.hide_ids(reason);
    }
    answer.estimated_start = answer.estimated_start.map(|estimate| estimate.for_reader(&reader));
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
            Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(JobView::from(&job))).into_response())
        }
        Submitted::Replayed(job) => Ok((StatusCode::OK, Json(JobView::from(&job))).into_response()),
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

#[derive(Debug, Serialize, ToSchema)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
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
    let mut view = JobView::from(&job);
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
    let mut view = view.with_standing(standing.as_ref(), &reader);
    let planned = insight.read.view.queued.iter().any(|q| q.id == job.id);
    if planned {
        let estimate = queue::estimate(&state, &insight, insight.read.view.clone(), job.id).await?;
        view.estimated_start = Some(estimate.for_reader(&reader));
    }
    state.annotate_slurm(job.id, &mut view);
    Ok(Json(view))
}
