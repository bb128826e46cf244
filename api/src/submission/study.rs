//! A study submission: the request parsed and planned into points ([`plan`]), the points fitted to the
//! pool's devices ([`fit_devices`]), and each point checked as a job and all of them stored in one
//! transaction ([`submit`]). The route (`routes/studies`) only calls these and shapes the answer.

use ringtrain_core::study::{self, PlannedPoint, StudyRequest};
use ringtrain_core::{FieldError, JobId, StudyId};
use ringtrain_store::{Job, NewStudy, Study, StudyPoint};

use axum::http::StatusCode;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::submission::checks;
use crate::submission::enqueue;

/// A study request, resolved (its template applied) and planned.
#[derive(Debug)]
pub struct PlannedStudy {
    pub request: StudyRequest,
    pub points: Vec<PlannedPoint>,
    /// The point the others are compared with.
    pub reference: usize,
}

/// Parses, resolves and plans the request: every point's spec, and which is the reference. A scale search's
/// `reference_job` is read here: its spec becomes the base.
pub async fn plan(state: &AppState, user: &User, body: &[u8]) -> ApiResult<PlannedStudy> {
    let mut request = parse_request(body)?;
    if let (Some(id), Some("scale_search")) = (request.reference_job, request.template.as_deref()) {
        request.base = Some(reused_base(state, user, id, request.base.is_some()).await?);
    }
    let request = request.resolved().map_err(|e| ApiError::validation(vec![e]))?;
    if let Some(name) = &request.name {
        check_name(name)?;
    }
    let points = request.plan().map_err(ApiError::validation)?;
    let reference = study::reference_point(&request, &points);
    Ok(PlannedStudy { request, points, reference })
}

/// The request, with the JSON path of a wrong type or an unknown field.
fn parse_request(body: &[u8]) -> ApiResult<StudyRequest> {
    let value = crate::extract::parse_value(body)?;
    crate::extract::require_object(&value)?;
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let path = if path == "." { String::new() } else { path };
        ApiError::validation(vec![FieldError::new(path, err.inner().to_string())])
    })
}

/// The spec of a finished job of the team, to be a scale search's base (its name dropped): the study
/// compares with that run instead of running the reference again.
async fn reused_base(state: &AppState, user: &User, id: JobId, base_given: bool) -> ApiResult<serde_json::Value> {
    let refuse = |path: &str, reason: String| ApiError::validation(vec![FieldError::new(path, reason)]);
    if base_given {
        return Err(refuse(
            "base",
            "give base or reference_job, not both: the reference job's spec is the base".into(),
        ));
    }
    let job = match state.store.get_job(id).await? {
        Some(job) if user.owns(job.team_id) => job,
        _ => return Err(refuse("reference_job", format!("no job {id} in your team"))),
    };
    if job.state != ringtrain_core::JobState::Succeeded {
        return Err(refuse(
            "reference_job",
            format!(
                "must be a job that finished (succeeded): its curve is what the candidates are judged by; {id} is {}",
                job.state.as_str()
            ),
        ));
    }
    let mut base = serde_json::to_value(&job.spec).map_err(ApiError::internal)?;
    if let Some(base) = base.as_object_mut() {
        base.remove("name");
    }
    Ok(base)
}

fn check_name(name: &str) -> ApiResult<()> {
    let problems = ringtrain_core::validate::name_problems(name);
    match problems.is_empty() {
        true => Ok(()),
        false => {
            Err(ApiError::validation(problems.into_iter().map(|reason| FieldError::new("name", reason)).collect()))
        }
    }
}

/// Points that leave `devices` unset and ask for more workers than the pool has devices of their kind get
/// the most devices that fit and divide k: a study is meant to run, not to wait for a pool it cannot have.
pub async fn fit_devices(state: &AppState, points: &mut [PlannedPoint]) -> ApiResult<()> {
    if points.iter().all(|p| p.spec.devices.is_some()) {
        return Ok(());
    }
    let insight = state.queue_insight().await?;
    for point in points.iter_mut().filter(|p| p.spec.devices.is_none()) {
        let capacity =
            insight.read.view.nodes.iter().flat_map(|n| &n.devices).filter(|d| d.kind == point.spec.device).count();
        let k = point.spec.workers;
        if (k as usize) <= capacity || capacity == 0 {
            continue;
        }
        let fits = (1..=capacity as u32).rev().find(|d| k % d == 0).unwrap_or(1);
        point.spec.devices = Some(fits.into());
        point.spec_json["devices"] = fits.into();
    }
    Ok(())
}

/// Checks every point as a job of the team (each problem named by its point: `points[2].lr.base`) within
/// the team's queue limit, and stores the study and its jobs in one transaction.
pub async fn submit(state: &AppState, user: &User, planned: PlannedStudy) -> ApiResult<(Study, Vec<Job>)> {
    let PlannedStudy { request, mut points, reference } = planned;
    let new_jobs = (points.len() - usize::from(request.reference_job.is_some())) as i64;
    let room = enqueue::room(state, user, new_jobs, "create the study again").await?;
    check_cap_against_budget(state, user, request.max_device_hours).await?;
    let study_id = StudyId::new();
    let mut ids: Vec<JobId> = points.iter().map(|_| JobId::new()).collect();
    // a reused reference is a job already: it is not submitted again
    let reused = request.reference_job.map(|id| (reference, id));
    if let Some((point, id)) = reused {
        ids[point] = id;
    }
    let mut jobs = Vec::with_capacity(points.len());
    let mut errors = Vec::new();
    for (i, point) in points.iter_mut().enumerate() {
        if reused.is_some_and(|(point, _)| point == i) {
            continue;
        }
        point.spec_json["name"] = study::point_name(request.name.as_deref(), i, &point.overrides).into();
        if request.guard_points && i != reference {
            point.spec_json["guard"]["reference_job"] = ids[reference].to_string().into();
        }
        let reading = ringtrain_core::read_spec(&point.spec_json).map_err(ApiError::validation)?;
        let membership = StudyPoint { study_id, point: i as i32 };
        match checks::checked_job(state, user, reading, point.spec_json.clone(), Some(membership)).await {
            Ok(mut job) => {
                job.id = ids[i];
                jobs.push(job);
            }
            // name the point each problem belongs to
            Err(err) if err.status() == StatusCode::UNPROCESSABLE_ENTITY => {
                errors.extend(err.problem().errors.into_iter().map(|e| {
                    let at = if e.path.is_empty() { format!("points[{i}]") } else { format!("points[{i}].{}", e.path) };
                    FieldError::new(at, e.reason)
                }))
            }
            Err(err) => return Err(err),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    let definition = serde_json::to_value(&request).map_err(ApiError::internal)?;
    let new = NewStudy {
        id: study_id,
        team_id: user.team_id,
        created_by: Some(user.token.id),
        name: request.name.clone(),
        definition,
        reference_point: reference as i32,
    };
    room.study(new, jobs).await
}

/// What is left of the team's budget in the current period, in device-hours; None without a budget.
pub async fn budget_left(state: &AppState, user: &User) -> ApiResult<Option<f64>> {
    let Some(team) = state.store.get_team(user.team_id).await? else { return Ok(None) };
    let Some(budget) = team.budget else { return Ok(None) };
    let now = ringtrain_store::now();
    let (_, _, used_seconds) = ringtrain_store::period_use(state.store.as_ref(), team.id, budget.period, now).await?;
    Ok(Some((budget.device_hours - used_seconds / 3600.0).max(0.0)))
}

/// A study's cap may not promise more device-hours than the team's budget has left this period (422 at
/// `max_device_hours`): the study would be stopped by the budget, not by its cap.
async fn check_cap_against_budget(state: &AppState, user: &User, cap: Option<f64>) -> ApiResult<()> {
    let (Some(cap), Some(left)) = (cap, budget_left(state, user).await?) else { return Ok(()) };
    if cap > left {
        return Err(ApiError::validation(vec![FieldError::new(
            "max_device_hours",
            format!("{cap} is more than the team's budget has left this period ({left:.3} device-hours)"),
        )]));
    }
    Ok(())
}
