//! The reference guard: a job whose spec names `guard.reference_job` must keep its training
//! error within `tolerance` of the reference's at the same epoch (compared by epoch: the global batches
//! differ, so iterations do not line up). It runs here, on the server, because only the server has both
//! curves. It is checked whenever either job reports an epoch, comparing every epoch both have (after the
//! warmup, unless `after_warmup` is false), so neither order of progress lets a run slip past: a run ahead
//! of its reference is checked when the reference catches up. A run beyond the tolerance is failed (not
//! retried: it would do the same), its ranks are stopped by their agents' next poll, and the checkpoints it
//! wrote are kept. The reason names the epoch, both errors and the device-hours the stop saved.

use ringtrain_core::spec::GuardSpec;
use ringtrain_core::JobState;
use ringtrain_store::{Job, MetricPoint, MetricsQuery};

use crate::error::ApiResult;
use crate::state::AppState;

/// One finished epoch of a run: its index, last iteration, training error and seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochEnd {
    pub epoch: i64,
    pub last_iteration: i64,
    pub train_error: f64,
    pub seconds: f64,
}

/// Where a run fell off its reference.
#[derive(Debug, Clone, PartialEq)]
pub struct FellOff {
    pub epoch: i64,
    pub mine: f64,
    pub reference: f64,
    /// Seconds the remaining epochs would have taken, at the pace of this one.
    pub seconds_left: f64,
}

/// The first epoch at which `mine` is worse than `reference` by more than the tolerance, among the epochs
/// both have that end after `warmup_iterations` (when the guard compares only those).
pub fn first_fall(
    guard: &GuardSpec,
    warmup_iterations: i64,
    epochs_total: i64,
    mine: &[EpochEnd],
    reference: &[EpochEnd],
) -> Option<FellOff> {
    mine.iter()
        .filter(|m| !guard.after_warmup || m.last_iteration >= warmup_iterations)
        .filter_map(|m| reference.iter().find(|r| r.epoch == m.epoch).map(|r| (m, r)))
        .find(|(m, r)| m.train_error > r.train_error + guard.tolerance)
        .map(|(m, r)| FellOff {
            epoch: m.epoch,
            mine: m.train_error,
            reference: r.train_error,
            seconds_left: (epochs_total - m.epoch - 1).max(0) as f64 * m.seconds,
        })
}

/// Checks, after `job` stored `points`: `job` against its reference, and every active job guarded against
/// `job`. Only epoch reports trigger a check.
pub async fn after_report(state: &AppState, job: &Job, points: &[MetricPoint]) -> ApiResult<()> {
    if !points.iter().any(|p| p.kind == "epoch" && p.rank == 0) {
        return Ok(());
    }
    if let Some(reference) = guard_of(job)?.and_then(|g| g.reference_job) {
        check(state, job, reference).await?;
    }
    for follower in state.store.active_jobs().await? {
        if follower.id != job.id && guard_of(&follower)?.and_then(|g| g.reference_job) == Some(job.id) {
            check(state, &follower, job.id).await?;
        }
    }
    Ok(())
}

/// The job's guard, when it has a reference to follow.
fn guard_of(job: &Job) -> ApiResult<Option<GuardSpec>> {
    Ok(Some(job.spec.guard.clone()).filter(|guard| guard.reference_job.is_some()))
}

async fn epoch_ends(state: &AppState, job: &Job) -> ApiResult<Vec<EpochEnd>> {
    let points = state.store.query_metrics(job.id, &MetricsQuery::epoch_curve()).await?;
    Ok(points
        .iter()
        .filter_map(|p| {
            Some(EpochEnd {
                epoch: p.epoch,
                last_iteration: p.iteration,
                train_error: p.fields.get("train_error")?.as_f64()?,
                seconds: p.fields.get("seconds").and_then(|s| s.as_f64()).unwrap_or(0.0),
            })
        })
        .collect())
}

async fn check(state: &AppState, job: &Job, reference_id: ringtrain_core::JobId) -> ApiResult<()> {
    if !matches!(job.state, JobState::Scheduled | JobState::Running) {
        return Ok(());
    }
    let spec = &job.spec;
    let guard = spec.guard.clone();
    if guard.reference_job.is_none() {
        return Ok(());
    }
    let Some(reference) = state.store.get_job(reference_id).await? else { return Ok(()) };
    if reference.team_id != job.team_id {
        return Ok(());
    }
    let warmup = job.effective.as_ref().map_or(0, |e| e.warmup_iterations as i64);
    let epochs_total = i64::from(spec.epochs);
    let (mine, theirs) = (epoch_ends(state, job).await?, epoch_ends(state, &reference).await?);
    let Some(fall) = first_fall(&guard, warmup, epochs_total, &mine, &theirs) else { return Ok(()) };
    let device_hours = fall.seconds_left * f64::from(job.devices.max(1)) / 3600.0;
    let why = format!(
        "fell off its reference job {reference_id}: train error {:.2} at epoch {} vs {:.2} (tolerance {}); \
         stopped early, saving about {device_hours:.3} device-hours; its checkpoints are kept",
        fall.mine,
        fall.epoch + 1,
        fall.reference,
        guard.tolerance
    );
    if state.store.fail_placement(job.id, job.attempt, &why, false).await?.is_some() {
        tracing::info!(job = %job.id, reference = %reference_id, "{why}");
        state.changed().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(errors: &[f64], per_epoch: i64) -> Vec<EpochEnd> {
        errors
            .iter()
            .enumerate()
            .map(|(e, &train_error)| EpochEnd {
                epoch: e as i64,
                last_iteration: (e as i64 + 1) * per_epoch - 1,
                train_error,
                seconds: 10.0,
            })
            .collect()
    }

    #[test]
    fn a_run_falls_off_at_the_first_epoch_beyond_the_tolerance_after_the_warmup() {
        let guard = GuardSpec::default();
        let reference = curve(&[0.40, 0.30, 0.25, 0.20], 100);
        // epoch 0 is in the warmup (100 iterations: epoch 0 ends at iteration 99)
        let mine = curve(&[0.90, 0.35, 0.24, 0.50], 100);
        let fall = first_fall(&guard, 100, 10, &mine, &reference).unwrap();
        assert_eq!((fall.epoch, fall.mine, fall.reference), (1, 0.35, 0.30));
        assert_eq!(fall.seconds_left, 80.0);
        // within the tolerance everywhere after the warmup: no fall
        let close = curve(&[0.90, 0.31, 0.26, 0.21], 100);
        assert_eq!(first_fall(&guard, 100, 10, &close, &reference), None);
        // with after_warmup off, the warmup's epoch counts
        let strict = GuardSpec { after_warmup: false, ..GuardSpec::default() };
        assert_eq!(first_fall(&strict, 100, 10, &close, &reference).unwrap().epoch, 0);
    }

    #[test]
    fn epochs_the_reference_has_not_reached_are_not_compared() {
        let guard = GuardSpec::default();
        let reference = curve(&[0.40], 10);
        let mine = curve(&[0.41, 0.90], 10);
        assert_eq!(first_fall(&guard, 0, 5, &mine, &reference), None);
    }
}
