//! What the study routes answer: the views of a study, its points and its search, and how they are made
//! from the stored study and its jobs (its points' curves, costs and standing in a search).

use std::collections::BTreeMap;

use ringtrain_core::study::halving::{self, SearchMetric, SearchSpec};
use ringtrain_core::study::{self, StudyRequest};
use ringtrain_core::{JobId, JobState};
use ringtrain_store::{Job, MetricsQuery, Study};
use serde_json::{Map, Value};

use crate::error::ApiResult;
use crate::state::AppState;

pub use ringtrain_views::studies::{
    PlannedPointView, SearchSummary, StudyDryRun, StudyLinks, StudyPage, StudyPointView, StudySummary, StudyView,
};

/// A study's job with the point it stands for.
pub(super) struct PointJob {
    point: i32,
    job: Job,
    /// A finished job the study reused as its reference (`reference_job`): not the study's own.
    reused: bool,
}

/// The study's own jobs, each at its point, and a reused reference (`reference_job`) at the reference point.
pub(super) async fn point_jobs(state: &AppState, study: &Study, own: Vec<Job>) -> ApiResult<Vec<PointJob>> {
    let mut jobs: Vec<PointJob> =
        own.into_iter().map(|job| PointJob { point: job.study.map_or(0, |s| s.point), job, reused: false }).collect();
    let reused = study.definition.get("reference_job").and_then(|id| serde_json::from_value::<JobId>(id.clone()).ok());
    if let Some(id) = reused {
        if let Some(job) = state.store.get_job(id).await? {
            jobs.insert(0, PointJob { point: study.reference_point, job, reused: true });
        }
    }
    Ok(jobs)
}

pub(super) async fn study_point_jobs(state: &AppState, study: &Study) -> ApiResult<Vec<PointJob>> {
    let own = state.store.study_jobs(study.id).await?;
    point_jobs(state, study, own).await
}

pub(super) fn count_states(jobs: &[PointJob]) -> BTreeMap<String, u64> {
    let mut states = BTreeMap::new();
    for PointJob { job, .. } in jobs {
        *states.entry(job.state.as_str().to_string()).or_insert(0) += 1;
    }
    states
}

pub(super) async fn view(state: &AppState, study: &Study, jobs: Vec<PointJob>) -> ApiResult<StudyView> {
    let overrides: Vec<Map<String, Value>> = stored_points(&study.definition);
    let mut points = Vec::with_capacity(jobs.len());
    for PointJob { point, job, reused } in &jobs {
        let point_overrides = overrides.get(*point as usize).cloned().unwrap_or_default();
        let mut view = point_view(state, job, *point, point_overrides, *point == study.reference_point).await?;
        view.reused = *reused;
        points.push(view);
    }
    let reference = points.iter().find(|p| p.is_reference).and_then(|p| p.final_test_error);
    for point in &mut points {
        point.vs_reference = point.final_test_error.zip(reference).map(|(mine, theirs)| mine - theirs);
    }
    let search = crate::search::search_of(study).map(|search| search_summary(study, &search, &mut points, &jobs));
    let device_hours = points.iter().filter(|p| !p.reused).map(|p| p.device_seconds).sum::<f64>() / 3600.0;
    let base = format!("/v1/studies/{}", study.id);
    Ok(StudyView {
        id: study.id,
        name: study.name.clone(),
        team_id: study.team_id,
        created_at: study.created_at,
        reference_point: study.reference_point,
        states: count_states(&jobs),
        points,
        definition: study.definition.clone(),
        device_hours,
        max_device_hours: crate::search::cap_of(study),
        search,
        links: StudyLinks { plot: format!("{base}/plot.svg"), cancel: format!("{base}/cancel"), this: base },
    })
}

/// Each point's overrides as the stored definition made them.
fn stored_points(definition: &Value) -> Vec<Map<String, Value>> {
    serde_json::from_value::<StudyRequest>(definition.clone())
        .ok()
        .and_then(|request| {
            let points = request.plan().ok()?;
            Some(points.into_iter().map(|p| p.overrides).collect())
        })
        .unwrap_or_default()
}

async fn point_view(
    state: &AppState,
    job: &Job,
    point: i32,
    overrides: Map<String, Value>,
    is_reference: bool,
) -> ApiResult<StudyPointView> {
    let epochs = state.store.query_metrics(job.id, &MetricsQuery::epoch_curve()).await?;
    let field = |name: &str| -> Vec<f64> { epochs.iter().filter_map(|p| p.fields.get(name)?.as_f64()).collect() };
    let (train_error, test_error) = (field("train_error"), field("test_error"));
    let effective = job.effective.as_ref();
    // the kinds as the API spells them (their serde names)
    let text = |kind: Option<Value>| kind.as_ref().and_then(Value::as_str).map(str::to_string);
    let result = job.result.as_ref();
    let final_test_error = match job.state {
        JobState::Succeeded => {
            result.and_then(|r| r["final_test_error"].as_f64()).or_else(|| test_error.last().copied())
        }
        _ => None,
    };
    let wall_seconds = job.started_at.map(|start| {
        let end = job.finished_at.unwrap_or_else(chrono::Utc::now);
        (end - start).num_milliseconds() as f64 / 1000.0
    });
    Ok(StudyPointView {
        point,
        label: study::label(&overrides),
        overrides,
        job_id: job.id,
        state: job.state,
        is_reference,
        workers: job.spec.workers,
        devices: job.devices,
        global_batch: effective.map_or(0, |e| e.global_batch),
        scaled_lr: effective.map(|e| e.scaled_lr),
        warmup: text(effective.and_then(|e| serde_json::to_value(e.warmup_kind).ok())),
        scaling: text(effective.and_then(|e| serde_json::to_value(e.scaling).ok())),
        train_error,
        test_error,
        final_test_error,
        vs_reference: None,
        wall_seconds,
        samples_per_s: result.and_then(|r| r["samples_per_s"].as_f64()),
        error: job.error.clone(),
        device_seconds: crate::resources::job_resources(state.store.as_ref(), job).await?.device_seconds,
        reused: false,
        search: None,
        rungs_passed: None,
        at_rungs: None,
    })
}

/// Each point's standing in the search (written into `points`), and what the search found and cost.
fn search_summary(
    study: &Study,
    search: &SearchSpec,
    points: &mut [StudyPointView],
    jobs: &[PointJob],
) -> SearchSummary {
    let memory = crate::search::memory_of(study);
    let rungs = search.rungs.len();
    // a point the search promoted whose job is still `stopped` is about to resume: the search goes on
    let mut awaiting_resume = false;
    for point in points.iter_mut() {
        let curve = match search.metric {
            SearchMetric::TrainError => &point.train_error,
            SearchMetric::TestError => &point.test_error,
        };
        // the curves hold one figure per finished epoch, from the first
        let figures = (0..rungs).map_while(|r| curve.get(search.rung_epoch(r) as usize).copied()).collect();
        point.at_rungs = Some(figures);
        if point.is_reference {
            let what =
                if point.reused { "the reference: a finished job, reused" } else { "the reference: trains to the end" };
            point.search = Some(what.into());
            continue;
        }
        let (passed, stopped_at) = halving::standing(&memory, point.point as usize);
        awaiting_resume |= stopped_at.is_none() && point.state == JobState::Stopped;
        point.rungs_passed = Some(passed);
        point.search = Some(match (stopped_at, point.state) {
            (Some(rung), _) => format!("stopped at rung {} ({} epochs)", rung + 1, search.rungs[rung]),
            (None, _) if passed == rungs => format!("promoted past every rung ({rungs})"),
            (None, _) if passed > 0 => format!("promoted past rung {passed} of {rungs}"),
            (None, JobState::Failed | JobState::Cancelled) => format!("{} before rung {}", point.state, passed + 1),
            (None, JobState::Queued) => "not started".into(),
            (None, _) => format!("training to rung 1 ({} epochs)", search.rungs[0]),
        });
    }
    let candidates = || points.iter().filter(|p| !p.is_reference);
    let finished_best = candidates()
        .filter_map(|p| Some((p.final_test_error?, p.point)))
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let furthest_best = || {
        candidates()
            .filter_map(|p| Some(((p.rungs_passed?, -p.test_error.last().copied()?), p.point)))
            .max_by(|a, b| a.0 .0.cmp(&b.0 .0).then(a.0 .1.total_cmp(&b.0 .1)).then(b.1.cmp(&a.1)))
            .map(|(_, point)| point)
    };
    let best_point = finished_best.map(|(_, point)| point).or_else(furthest_best);
    let best = best_point.and_then(|b| points.iter().find(|p| p.point == b));
    let best_job = best_point.and_then(|b| jobs.iter().find(|j| j.point == b && !j.reused)).map(|j| &j.job);
    // a reused reference cost this study nothing, and the grid would not run it again either
    let own = || points.iter().filter(|p| !p.reused);
    let device_seconds: f64 = own().map(|p| p.device_seconds).sum();
    // the cap stopped every point for good: none of them resumes
    let held: f64 = points.iter().map(|p| p.device_seconds).sum();
    let capped = crate::search::cap_of(study).is_some_and(|cap| held >= cap * 3600.0);
    // a stopped or active point at its pace so far, over its whole schedule (unknown while an active one has
    // trained no epoch); one that ended otherwise cost the grid what it cost here (a failed point fails there too)
    let grid_seconds: Option<f64> = own()
        .map(|p| {
            if matches!(p.state, JobState::Succeeded | JobState::Failed | JobState::Cancelled) {
                return Some(p.device_seconds);
            }
            let epochs = jobs.iter().find(|j| j.job.id == p.job_id).map_or(0, |j| j.job.spec.epochs);
            let trained = p.test_error.len().max(p.train_error.len());
            (trained > 0).then(|| p.device_seconds / trained as f64 * f64::from(epochs))
        })
        .sum();
    SearchSummary {
        spec: serde_json::to_value(search).unwrap_or_default(),
        done: (!awaiting_resume || capped)
            && !jobs.iter().any(|j| matches!(j.job.state, JobState::Queued | JobState::Scheduled | JobState::Running)),
        best_point,
        best_multiplier: best.and_then(|p| p.overrides.get("lr.multiplier")?.as_f64()),
        best_spec: best_job.and_then(|j| serde_json::to_value(&j.spec).ok()).map(|mut spec| {
            if let Some(spec) = spec.as_object_mut() {
                spec.remove("name");
            }
            spec
        }),
        device_hours: device_seconds / 3600.0,
        grid_device_hours: grid_seconds.map(|s| s / 3600.0),
        saved_device_hours: grid_seconds.map(|s| (s - device_seconds) / 3600.0),
    }
}
