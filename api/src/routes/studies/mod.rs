//! Studies: one base spec, many points, each an ordinary job of the team (quota-scheduled,
//! cancellable, with its own metrics), and one table that compares them. `POST /v1/studies` creates all the
//! points' jobs in one transaction (or, with `?dry_run=true`, shows every point's schedule and stores
//! nothing); `GET /v1/studies/{id}` is the table; `GET /v1/studies/{id}/plot.svg` draws error vs epoch per
//! point (Goyal's Figure 2); cancelling a study cancels every point that has not ended.
//! The views these answer with, and how they are made from a study and its jobs, are in [`views`].

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ringtrain_core::{study, StudyId};
use ringtrain_store::Study;
use serde::Deserialize;
use serde_json::Value;
use utoipa::IntoParams;

use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, ApiQuery, JsonBytes};
use crate::state::AppState;
use crate::submission::checks;
use crate::submission::study::{self as study_submission, PlannedStudy};

mod views;
use views::{count_states, point_jobs, study_point_jobs, view};
pub use views::{
    PlannedPointView, SearchSummary, StudyDryRun, StudyLinks, StudyPage, StudyPointView, StudySummary, StudyView,
};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StudySubmitQuery {
    /// Plan every point (its spec, effective hyperparameters and lr schedule) and store nothing.
    pub dry_run: Option<bool>,
}

/// Create a study: a base spec and axes (every combination) or points (each a set of overrides), or a
/// built-in `template` (`goyal`: Goyal et al.'s Table 1 in miniature). Every point is an ordinary job of the
/// team. Points that do not set `devices` get the devices that fit the pool (k stays the math; each device
/// plays k/devices virtual ranks).
#[utoipa::path(post, path = "/v1/studies", tag = "studies", params(StudySubmitQuery),
    request_body(content = Object, content_type = "application/json",
        description = "{name?, template?: \"goyal\" | \"scale_search\", base?: spec, axes?: {path: [values]}, points?: [{path: value}], reference?: index, guard_points?: bool, search?: {kind, metric?, rungs, reduction?}, max_device_hours?: number, target_workers?, devices?, candidates?, warmup_epochs?, reference_job? (scale_search)}"),
    responses((status = 201, body = StudyView, description = "Created: every point's job is queued"),
        (status = 200, body = StudyDryRun, description = "dry_run=true: the plan; nothing stored"),
        (status = 403),
        (status = 422),
        (status = 429, description = "The team's queue cannot take this many more jobs")),
    security(("bearer" = [])))]
pub async fn create_study(
    State(state): State<AppState>,
    user: User,
    ApiQuery(query): ApiQuery<StudySubmitQuery>,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Response> {
    user.require_write()?;
    let mut planned = study_submission::plan(&state, &user, &body).await?;
    study_submission::fit_devices(&state, &mut planned.points).await?;
    if query.dry_run == Some(true) {
        return Ok(Json(dry_run(&state, &user, &planned).await?).into_response());
    }
    let (study, jobs) = study_submission::submit(&state, &user, planned).await?;
    let view = view(&state, &study, point_jobs(&state, &study, jobs).await?).await?;
    let location = format!("/v1/studies/{}", study.id);
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(view)).into_response())
}

/// Every point's schedule, with nothing stored.
async fn dry_run(state: &AppState, user: &User, study: &PlannedStudy) -> ApiResult<StudyDryRun> {
    let (request, points, reference) = (&study.request, &study.points, study.reference);
    let mut planned = Vec::with_capacity(points.len());
    for (i, point) in points.iter().enumerate() {
        let size = checks::dataset_size(state, user, &point.spec).await?;
        let effective = checks::effective(&point.spec, size)?;
        let schedule = effective.map(|e| e.render(false));
        planned.push(PlannedPointView {
            point: i,
            label: study::label(&point.overrides),
            is_reference: i == reference,
            spec: point.spec_json.clone(),
            schedule,
        });
    }
    Ok(StudyDryRun {
        dry_run: true,
        name: request.name.clone(),
        reference_point: reference,
        points: planned,
        max_device_hours: request.max_device_hours,
        budget_left_device_hours: study_submission::budget_left(state, user).await?,
    })
}

/// The caller's team's study, or 404.
async fn team_study(state: &AppState, user: &User, id: StudyId) -> ApiResult<Study> {
    match state.store.get_study(id).await? {
        Some(study) if user.owns(study.team_id) => Ok(study),
        _ => Err(ApiError::not_found(format!("no study {id}"))),
    }
}

/// One study: every point's state, error curves, final test error, time and throughput, and which is the
/// reference.
#[utoipa::path(get, path = "/v1/studies/{id}", tag = "studies", params(("id" = Uuid, Path)),
    responses((status = 200, body = StudyView), (status = 404)),
    security(("bearer" = [])))]
pub async fn get_study(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<StudyId>,
) -> ApiResult<Json<StudyView>> {
    let study = team_study(&state, &user, id).await?;
    let jobs = study_point_jobs(&state, &study).await?;
    Ok(Json(view(&state, &study, jobs).await?))
}

/// Error vs epoch for every point (training error dashed, test error solid), as SVG: Goyal's Figure 2.
#[utoipa::path(get, path = "/v1/studies/{id}/plot.svg", tag = "studies", params(("id" = Uuid, Path)),
    responses((status = 200, content_type = "image/svg+xml", body = String), (status = 404)),
    security(("bearer" = [])))]
pub async fn study_plot(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<StudyId>,
) -> ApiResult<Response> {
    let study = team_study(&state, &user, id).await?;
    let jobs = study_point_jobs(&state, &study).await?;
    let view = view(&state, &study, jobs).await?;
    let curves: Vec<study::plot::Curve> = view
        .points
        .iter()
        .map(|p| study::plot::Curve {
            label: plot_label(p),
            train_error: p.train_error.clone(),
            test_error: p.test_error.clone(),
        })
        .collect();
    let title = format!("{}: error vs epoch", view.name.as_deref().unwrap_or("study"));
    let svg = study::plot::svg(&title, &curves);
    Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}

/// A point in the plot's legend, short enough to read beside it: "#4 kn=1024, lr 0.4 (linear), gradual
/// (reference)"; a point with an lr multiplier (a scale search's candidate) shows it in place of the rule,
/// "lr 0.05657 (×5.657)".
fn plot_label(p: &StudyPointView) -> String {
    let or_dash = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    let reference = if p.is_reference { " (reference)" } else { "" };
    // four significant figures, trailing zeros dropped (0.05657, 0.4)
    let lr = p.scaled_lr.map_or_else(|| "-".into(), |lr| study::scale_search::round4(lr).to_string());
    let rule = match p.overrides.get("lr.multiplier").and_then(Value::as_f64) {
        Some(m) => format!("×{m}"),
        None => or_dash(&p.scaling),
    };
    format!("#{} kn={}, lr {lr} ({rule}), {}{reference}", p.point, p.global_batch, or_dash(&p.warmup))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListStudiesQuery {
    /// `next_cursor` of the previous page.
    #[param(pattern = "^-?[0-9]{1,18}$")]
    pub cursor: Option<String>,
    /// 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
}

/// The team's studies, newest first.
#[utoipa::path(get, path = "/v1/studies", tag = "studies", params(ListStudiesQuery),
    responses((status = 200, body = StudyPage), (status = 400)),
    security(("bearer" = [])))]
pub async fn list_studies(
    State(state): State<AppState>,
    user: User,
    ApiQuery(query): ApiQuery<ListStudiesQuery>,
) -> ApiResult<Json<StudyPage>> {
    let bad = |path: &str, reason: &str| ApiError::field(ProblemType::BadQueryParameter, path, reason);
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(bad("limit", "must be 1 to 100"));
    }
    let before = match &query.cursor {
        None => None,
        Some(cursor) => Some(cursor.parse::<i64>().map_err(|_| bad("cursor", "not a cursor this server issued"))?),
    };
    let mut studies = state.store.list_studies(user.team_id, before, i64::from(limit) + 1).await?;
    let more = studies.len() > limit as usize;
    studies.truncate(limit as usize);
    let next_cursor = if more { studies.last().map(|s| s.seq.to_string()) } else { None };
    let mut summaries = Vec::with_capacity(studies.len());
    for study in studies {
        let jobs = study_point_jobs(&state, &study).await?;
        summaries.push(StudySummary {
            id: study.id,
            name: study.name,
            created_at: study.created_at,
            points: jobs.len(),
            states: count_states(&jobs),
        });
    }
    Ok(Json(StudyPage { studies: summaries, next_cursor }))
}

/// Cancel every point of the study that has not ended.
#[utoipa::path(post, path = "/v1/studies/{id}/cancel", tag = "studies", params(("id" = Uuid, Path)),
    responses((status = 200, body = StudyView), (status = 403), (status = 404)),
    security(("bearer" = [])))]
pub async fn cancel_study(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<StudyId>,
) -> ApiResult<Json<StudyView>> {
    let study = team_study(&state, &user, id).await?;
    user.require_write()?;
    let who = user.token.label.clone().unwrap_or_else(|| user.token.id.to_string());
    let reason = format!("study {} cancelled by token {who}", study.id);
    for job in state.store.study_jobs(study.id).await? {
        // a point that ended meanwhile stays as it ended
        if !job.state.is_terminal() {
            state.store.cancel_job(job.id, &reason).await?;
        }
    }
    state.changed().await;
    let jobs = study_point_jobs(&state, &study).await?;
    Ok(Json(view(&state, &study, jobs).await?))
}
