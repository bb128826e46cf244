//! A study's search and cap at work: after a point of a study reports an epoch, the study's
//! device-hour cap (`max_device_hours`) is checked, and reached, every point not ended is stopped. With a
//! `search`, the points' figures at the rungs are read, successive halving (`core::study::halving`) decides,
//! and its decisions are applied: a point not among the best at a rung is stopped at a checkpoint (its job
//! ends `stopped`), a stopped point that a later result puts among the best is resumed from its checkpoint.
//! It runs on the server that took the report, like the reference guard; the search's memory is stored with
//! the study and changed by compare-and-set, so two servers judging at once do not both act on it.

use ringtrain_core::study::halving::{self, Decision, HalvingState, SearchSpec, Trial, TrialStatus};
use ringtrain_core::{JobState, StudyId};
use ringtrain_store::{Job, MetricPoint, MetricsQuery, Study, Transition};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// How often a judgement is tried again when another server changed the memory in between.
const ROUNDS: usize = 3;

/// Judges the study of `job` after it stored `points`, if they hold an epoch's figures.
pub async fn after_report(state: &AppState, job: &Job, points: &[MetricPoint]) -> ApiResult<()> {
    if !points.iter().any(|p| p.kind == "epoch" && p.rank == 0) {
        return Ok(());
    }
    let Some(membership) = job.study else { return Ok(()) };
    let Some(study) = state.store.get_study(membership.study_id).await? else { return Ok(()) };
    if enforce_cap(state, &study).await? {
        return Ok(());
    }
    if search_of(&study).is_none() {
        return Ok(());
    }
    judge(state, study.id).await
}

/// Judges the study of `job` after it ended without a report (it failed, was cancelled or succeeded): a
/// point that will report no more may close a rung, so that the best of the points stopped there goes on.
/// Without this, a search whose last active point failed kept its best point stopped for good.
pub async fn after_end(state: &AppState, job: &Job) -> ApiResult<()> {
    match job.study.filter(|_| job.state.is_terminal()) {
        Some(membership) => judge(state, membership.study_id).await,
        None => Ok(()),
    }
}

/// The study's device-hour cap, if it has one.
pub fn cap_of(study: &Study) -> Option<f64> {
    study.definition.get("max_device_hours")?.as_f64()
}

/// The device-seconds the study's points have held together.
async fn spent_seconds(state: &AppState, jobs: &[Job]) -> ApiResult<f64> {
    let mut spent = 0.0;
    for job in jobs {
        spent += crate::resources::job_resources(state.store.as_ref(), job).await?.device_seconds;
    }
    Ok(spent)
}

/// Stops every point not ended once the study's points together held its cap: true when the cap is
/// reached (nothing more to judge).
async fn enforce_cap(state: &AppState, study: &Study) -> ApiResult<bool> {
    let Some(cap) = cap_of(study) else { return Ok(false) };
    let jobs = state.store.study_jobs(study.id).await?;
    let spent = spent_seconds(state, &jobs).await?;
    if spent < cap * 3600.0 {
        return Ok(false);
    }
    let why = format!(
        "the study's cap of {cap} device-hours is reached ({:.3} spent); its checkpoints are kept",
        spent / 3600.0
    );
    for job in jobs.iter().filter(|j| !j.state.is_terminal()) {
        stop(state, job, &why).await?;
    }
    state.changed().await;
    Ok(true)
}

/// Stops a point's job where it is: a placement checkpoints and stops, a queued job (placed again after a
/// failure or a preemption) ends before it starts. Whether it was stopped (one that ended meanwhile is left).
async fn stop(state: &AppState, job: &Job, why: &str) -> ApiResult<bool> {
    let stopped = match job.state {
        JobState::Scheduled | JobState::Running => state.store.stop_job(job.id, job.attempt, why).await?,
        JobState::Queued => state.store.transition(&Transition::new(job.id, job.state, JobState::Stopped, why)).await?,
        _ => None,
    };
    Ok(stopped.is_some())
}

/// The study's search, if it has one.
pub fn search_of(study: &Study) -> Option<SearchSpec> {
    serde_json::from_value(study.definition.get("search")?.clone()).ok()
}

/// The search's memory as stored (empty before its first decision).
pub fn memory_of(study: &Study) -> HalvingState {
    study.search_state.clone().and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default()
}

/// Reads every point's figures at the rungs, decides, stores the new memory and applies the decisions.
pub async fn judge(state: &AppState, id: StudyId) -> ApiResult<()> {
    for _ in 0..ROUNDS {
        let Some(study) = state.store.get_study(id).await? else { return Ok(()) };
        let Some(search) = search_of(&study) else { return Ok(()) };
        let jobs = state.store.study_jobs(id).await?;
        let mut trials = Vec::with_capacity(jobs.len());
        for job in jobs.iter().filter(|j| j.study.is_some_and(|s| s.point != study.reference_point)) {
            trials.push(trial(state, &search, job).await?);
        }
        let memory = memory_of(&study);
        let (decisions, next) = halving::decide(&search, &trials, &memory);
        if next == memory {
            return resume_promoted(state, &study, &search, &trials, &jobs, &memory).await;
        }
        let stored = serde_json::to_value(&next).map_err(ApiError::internal)?;
        if !state.store.set_search_state(id, study.search_version, &stored).await? {
            continue;
        }
        for decision in decisions {
            apply(state, &search, &trials, &jobs, decision).await?;
        }
        state.changed().await;
        return Ok(());
    }
    tracing::warn!(study = %id, "the search's memory kept changing under this server; the next report judges again");
    Ok(())
}

/// Resumes the points the memory promoted whose jobs are still `stopped`. Two judgements run at once when
/// two points report together: one may promote a point whose stop, decided by the other, has not landed
/// yet; the resume finds the job running and does nothing, then the stop lands, and nothing would resume it
/// (the scale-search test saw its best point so, and the search "done"). Every later judgement (a report
/// of any point, a point's end) mends it here. Not past the study's cap, which stopped every point for good.
async fn resume_promoted(
    state: &AppState,
    study: &Study,
    search: &SearchSpec,
    trials: &[Trial],
    jobs: &[Job],
    memory: &HalvingState,
) -> ApiResult<()> {
    let waiting: Vec<&Trial> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Stopped && halving::standing(memory, t.point).1.is_none())
        .collect();
    if waiting.is_empty() {
        return Ok(());
    }
    if let Some(cap) = cap_of(study) {
        if spent_seconds(state, jobs).await? >= cap * 3600.0 {
            return Ok(());
        }
    }
    for trial in waiting {
        let rung = halving::standing(memory, trial.point).0.saturating_sub(1);
        apply(state, search, trials, jobs, Decision::Resume { point: trial.point, rung }).await?;
    }
    state.changed().await;
    Ok(())
}

/// Whether the search's memory as stored now still has `point` stopped (a concurrent judgement may have
/// promoted it after this one decided to stop it).
async fn still_stopped(state: &AppState, job: &Job, point: usize) -> ApiResult<bool> {
    let Some(membership) = job.study else { return Ok(false) };
    let Some(study) = state.store.get_study(membership.study_id).await? else { return Ok(false) };
    Ok(halving::standing(&memory_of(&study), point).1.is_some())
}

/// A point's job as the search sees it: its figures at the rungs it has passed.
async fn trial(state: &AppState, search: &SearchSpec, job: &Job) -> ApiResult<Trial> {
    let curve = state.store.query_metrics(job.id, &MetricsQuery::epoch_curve()).await?;
    let field = search.metric.field();
    let mut at_rungs = Vec::new();
    for rung in 0..search.rungs.len() {
        let epoch = i64::from(search.rung_epoch(rung));
        let figure = curve.iter().find(|p| p.epoch == epoch).and_then(|p| p.fields.get(field)?.as_f64());
        match figure {
            Some(figure) => at_rungs.push(figure),
            None => break,
        }
    }
    let status = match job.state {
        JobState::Queued | JobState::Scheduled | JobState::Running => TrialStatus::Active,
        JobState::Stopped => TrialStatus::Stopped,
        JobState::Succeeded | JobState::Failed | JobState::Cancelled => TrialStatus::Ended,
    };
    let point = job.study.map_or(0, |s| s.point as usize);
    Ok(Trial { point, at_rungs, status })
}

async fn apply(
    state: &AppState,
    search: &SearchSpec,
    trials: &[Trial],
    jobs: &[Job],
    decision: Decision,
) -> ApiResult<()> {
    let (Decision::Stop { point, rung } | Decision::Resume { point, rung }) = decision;
    let Some(job) = jobs.iter().find(|j| j.study.is_some_and(|s| s.point as usize == point)) else { return Ok(()) };
    let figure = trials.iter().find(|t| t.point == point).and_then(|t| t.at_rungs.get(rung)).copied();
    let at = format!(
        "rung {} ({} epochs): {} {}",
        rung + 1,
        search.rungs[rung],
        search.metric.field(),
        figure.map_or("?".into(), |f| format!("{f:.4}"))
    );
    // Another server (or task) may have judged since `jobs` was read: a stop that a later memory took back
    // is not applied, and a resume looks at the job as it is now, not as it was read.
    let Some(job) = state.store.get_job(job.id).await? else { return Ok(()) };
    let job = &job;
    match decision {
        Decision::Stop { .. } => {
            if !still_stopped(state, job, point).await? {
                return Ok(());
            }
            let why = format!("search: not among the best 1/{} at {at}; its checkpoints are kept", search.reduction);
            if stop(state, job, &why).await? {
                tracing::info!(job = %job.id, point, "{why}");
            }
        }
        Decision::Resume { .. } => {
            if job.state == JobState::Stopped {
                let why = format!("search: promoted, now among the best 1/{} at {at}", search.reduction);
                state.store.resume_job(job.id, &why).await?;
                tracing::info!(job = %job.id, point, "{why}");
            }
        }
    }
    Ok(())
}
