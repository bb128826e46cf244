//! One history per job across its placements: when each placement held its devices, how it ended, what it
//! cost in device-seconds and which iterations the next one had to train again, from the assignments'
//! real start and end times. A job's result carries it, so the result's wall time covers every placement,
//! not only the last.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use ringtrain_core::JobId;
use ringtrain_store::{DeviceSpan, SpanFilter, Store, StoreResult};
use serde::Serialize;
use serde_json::Value;

pub use ringtrain_views::jobs::PlacementRecord;

/// The whole history.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobHistory {
    pub placements: Vec<PlacementRecord>,
    pub wall_seconds: f64,
    pub device_seconds: f64,
    pub iterations_lost: i64,
}

/// The job's history as of now; `succeeding` names the placement whose success is being recorded (its rank
/// 0 is still live at that moment).
pub async fn job_history(store: &dyn Store, job: JobId, succeeding: Option<i32>) -> StoreResult<JobHistory> {
    let spans = store.device_spans(&SpanFilter { job: Some(job), ..Default::default() }).await?;
    // the attempt each placement ran as, from its placement event
    let mut attempts: BTreeMap<i32, i32> = BTreeMap::new();
    for event in store.list_events(job, 0, 100_000).await? {
        if event.to_state.as_deref() == Some("scheduled") {
            attempts.insert(event.placement, event.attempt);
        }
    }
    Ok(summarize(&spans, &attempts, succeeding, ringtrain_store::now()))
}

/// Groups spans by placement. Pure, for tests.
pub fn summarize(
    spans: &[DeviceSpan],
    attempts: &BTreeMap<i32, i32>,
    succeeding: Option<i32>,
    now: DateTime<Utc>,
) -> JobHistory {
    let mut by_placement: BTreeMap<i32, Vec<&DeviceSpan>> = BTreeMap::new();
    for span in spans {
        by_placement.entry(span.placement).or_default().push(span);
    }
    let mut placements: Vec<PlacementRecord> = by_placement
        .iter()
        .map(|(&placement, ranks)| {
            let started_at = ranks.iter().map(|s| s.start).min().unwrap_or(now);
            let live = ranks.iter().any(|s| s.end.is_none());
            let ended_at = if live { None } else { ranks.iter().filter_map(|s| s.end).max() };
            let until = ended_at.unwrap_or(now);
            let ended = if succeeding == Some(placement) {
                "succeeded"
            } else if ranks.iter().any(|s| s.preempted) {
                "preempted"
            } else if live {
                "running"
            } else if ranks.iter().any(|s| s.state == ringtrain_core::AssignmentState::Failed) {
                "failed"
            } else if ranks.iter().all(|s| s.state == ringtrain_core::AssignmentState::Done) {
                "succeeded"
            } else {
                "cancelled"
            };
            let rank0 = ranks.iter().find(|s| s.rank == 0);
            PlacementRecord {
                placement,
                attempt: attempts.get(&placement).copied().unwrap_or(placement),
                started_at,
                ended_at,
                wall_seconds: seconds(until - started_at),
                devices: ranks.len() as u32,
                device_seconds: ranks.iter().map(|s| s.seconds_within(s.start, until.max(s.start))).sum(),
                ended: ended.to_string(),
                resumed_from_iteration: rank0.and_then(|s| s.resumed_from),
                iterations_lost: 0,
                iterations: None,
                restart_seconds: None,
            }
        })
        .collect();
    for i in 1..placements.len() {
        let (before, after) = placements.split_at_mut(i);
        let (previous, this) = (&mut before[i - 1], &mut after[0]);
        if let (Some(from), Some(to)) = (previous.resumed_from_iteration, this.resumed_from_iteration) {
            previous.iterations = Some((to - from).max(0));
        }
        this.restart_seconds = previous.ended_at.map(|end| seconds(this.started_at - end));
    }
    // what placement p+1 trained again is what placement p lost
    let retrained: Vec<i64> = by_placement
        .values()
        .map(|ranks| {
            let rank0 = ranks.iter().find(|s| s.rank == 0);
            match rank0.map(|s| (s.reached_before, s.resumed_from)) {
                Some((Some(reached), Some(from))) => (reached + 1 - from).max(0),
                _ => 0,
            }
        })
        .collect();
    for (i, record) in placements.iter_mut().enumerate() {
        record.iterations_lost = retrained.get(i + 1).copied().unwrap_or(0);
    }
    JobHistory {
        wall_seconds: placements.iter().map(|p| p.wall_seconds).sum(),
        device_seconds: placements.iter().map(|p| p.device_seconds).sum(),
        iterations_lost: placements.iter().map(|p| p.iterations_lost).sum(),
        placements,
    }
}

fn seconds(duration: chrono::Duration) -> f64 {
    (duration.num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0)
}

/// Adds the history to a result: `history` (every placement, and totals), `wall_seconds` the total over
/// placements, and the trainer's own figure for the last placement as `trainer_wall_seconds`.
pub fn annotate(result: &mut Value, history: &JobHistory) {
    let Some(object) = result.as_object_mut() else { return };
    if let Some(trainer) = object.remove("wall_seconds") {
        object.insert("trainer_wall_seconds".into(), trainer);
    }
    object.insert("wall_seconds".into(), Value::from(history.wall_seconds));
    object.insert("device_seconds".into(), Value::from(history.device_seconds));
    object.insert("iterations_lost".into(), Value::from(history.iterations_lost));
    object.insert("history".into(), serde_json::to_value(&history.placements).unwrap_or(Value::Null));
}
