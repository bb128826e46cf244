//! Asynchronous successive halving (ASHA; Li et al. 2020, "A System for Massively Parallel Hyperparameter
//! Tuning") over a study's points: each point is compared at rungs (after 1, 2, 4 … epochs) with the points
//! that reached the same rung before it, and goes on only while it is among the best 1/`reduction` of them.
//!
//! How it maps onto jobs: every point is an ordinary job with its whole schedule (the lr decays as in the
//! full run), all queued at once, so a freed device takes the next point at once (asynchronous). When a point
//! reports a rung and is among the best ⌊n/η⌋ of the n points at that rung, it is *promoted* and simply
//! trains on; otherwise it is *stopped* (its job ends `stopped` at a checkpoint). A later point's result can
//! put a stopped point among the best: it is promoted then, and its job resumes from its checkpoint (a
//! resumed point comes before points not yet started in the queue, as ASHA prefers promotions). A promotion
//! is never taken back, as in ASHA. One change for a study's finite set of points: once no other point can
//! reach a rung, the best there goes on even if fewer than η points reached it, so the search always trains
//! at least one point to the end. What stays stopped at the end was not worth its device-hours.
//!
//! This module is the decision alone, a pure function of the points' figures and the search's memory
//! ([`HalvingState`]), so a simulation can test it with scripted curves; the server applies its decisions.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::FieldError;

/// `search` of a study.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSpec {
    pub kind: SearchKind,
    /// The figure points are compared by (lower is better).
    #[serde(default)]
    pub metric: SearchMetric,
    /// Epochs after which points are compared, increasing; each below every point's epochs (the last
    /// promotion trains to the end).
    pub rungs: Vec<u32>,
    /// η: the best 1/η of the points at a rung go on. Default 3.
    #[serde(default = "default_reduction")]
    pub reduction: u32,
}

fn default_reduction() -> u32 {
    3
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchKind {
    /// Asynchronous successive halving.
    Asha,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchMetric {
    #[default]
    TestError,
    TrainError,
}

impl SearchMetric {
    /// The field of an epoch's metric point that holds it.
    pub fn field(self) -> &'static str {
        match self {
            SearchMetric::TestError => "test_error",
            SearchMetric::TrainError => "train_error",
        }
    }
}

/// Most rungs a search may have.
pub const MAX_RUNGS: usize = 16;

impl SearchSpec {
    /// What is wrong with it for points of `epochs` (each point's), as `search.…` fields.
    pub fn problems(&self, epochs: &[u32]) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.rungs.is_empty() || self.rungs.len() > MAX_RUNGS {
            problems.push(FieldError::new("search.rungs", format!("must list 1 to {MAX_RUNGS} epochs")));
        }
        if self.rungs.first() == Some(&0) {
            problems
                .push(FieldError::new("search.rungs[0]", "must be at least 1 (epochs trained before a comparison)"));
        }
        for (i, pair) in self.rungs.windows(2).enumerate() {
            if pair[1] <= pair[0] {
                problems.push(FieldError::new(format!("search.rungs[{}]", i + 1), "must be above the rung before it"));
            }
        }
        if let (Some(&last), Some(&fewest)) = (self.rungs.last(), epochs.iter().min()) {
            if last >= fewest {
                problems.push(FieldError::new(
                    format!("search.rungs[{}]", self.rungs.len() - 1),
                    format!("must be below every point's epochs ({fewest}): the last promotion trains to the end"),
                ));
            }
        }
        if !(2..=16).contains(&self.reduction) {
            problems.push(FieldError::new("search.reduction", "must be 2 to 16 (the best 1/reduction go on)"));
        }
        problems
    }

    /// The epoch index (0-based) whose figure is rung `rung`'s.
    pub fn rung_epoch(&self, rung: usize) -> u32 {
        self.rungs[rung] - 1
    }
}

/// Where a point's job stands, as the search needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrialStatus {
    /// Queued, scheduled or running.
    Active,
    /// Ended `stopped` (by this search).
    Stopped,
    /// Succeeded, failed or cancelled: it gets no decision, but its figures count.
    Ended,
}

/// A point as the search sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub point: usize,
    /// Its figure at each rung it has passed, in rung order.
    pub at_rungs: Vec<f64>,
    pub status: TrialStatus,
}

/// What the search remembers between reports (stored with the study).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HalvingState {
    /// Per rung, the points promoted past it.
    #[serde(default)]
    pub promoted: Vec<BTreeSet<usize>>,
    /// Points stopped and not promoted since → the rung they stopped at.
    #[serde(default)]
    pub stopped: BTreeMap<usize, usize>,
}

/// What to do with a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Stop its job at a checkpoint: not among the best at `rung`.
    Stop { point: usize, rung: usize },
    /// Resume its stopped job: now among the best at `rung`.
    Resume { point: usize, rung: usize },
}

/// The decisions the points' figures call for now, and the memory after them. Points never promoted twice
/// past a rung, never stopped twice at one; a point promoted at once has no decision (it trains on).
pub fn decide(spec: &SearchSpec, trials: &[Trial], previous: &HalvingState) -> (Vec<Decision>, HalvingState) {
    let mut state = previous.clone();
    state.promoted.resize(spec.rungs.len(), BTreeSet::new());
    let mut decisions = Vec::new();
    let mut closed_below: Vec<bool> = Vec::with_capacity(spec.rungs.len());
    for rung in 0..spec.rungs.len() {
        // a point competes at a rung once promoted past the one before: a point stopped below that trained on
        // past this rung before its stop took effect has figures here, but no place
        let competes =
            |t: &Trial| t.at_rungs.len() > rung && (rung == 0 || state.promoted[rung - 1].contains(&t.point));
        let mut here: Vec<(f64, usize)> =
            trials.iter().filter(|t| competes(t)).map(|t| (t.at_rungs[rung], t.point)).collect();
        // best first; a figure that is not a number (a diverged run) is worst
        here.sort_by(|a, b| {
            let key = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
            key(a.0).total_cmp(&key(b.0)).then(a.1.cmp(&b.1))
        });
        // a finite set of points: once no other point can still reach this rung, its best goes on even when
        // fewer than η are here (plain ASHA, made for an endless stream of points, would stop them all)
        let closed = trials.iter().all(|t| {
            competes(t)
                || t.status == TrialStatus::Ended
                || state.stopped.get(&t.point).is_some_and(|&at| at < rung && closed_below[at])
        });
        let mut best = here.len() / spec.reduction as usize;
        if closed && !here.is_empty() {
            best = best.max(1);
        }
        closed_below.push(closed);
        for &(_, point) in &here[..best] {
            if state.promoted[rung].insert(point) && state.stopped.get(&point) == Some(&rung) {
                state.stopped.remove(&point);
                decisions.push(Decision::Resume { point, rung });
            }
        }
        for &(_, point) in &here[best..] {
            let trial = trials.iter().find(|t| t.point == point).expect("a point of the trials");
            let undecided = !state.promoted[rung].contains(&point) && !state.stopped.contains_key(&point);
            if undecided && trial.status == TrialStatus::Active {
                state.stopped.insert(point, rung);
                decisions.push(Decision::Stop { point, rung });
            }
        }
    }
    (decisions, state)
}

/// A point's place in the search, for the study's view: the rungs it passed, and whether it was promoted
/// past the last of them or is stopped at it.
pub fn standing(state: &HalvingState, point: usize) -> (usize, Option<usize>) {
    let promotions = state.promoted.iter().filter(|p| p.contains(&point)).count();
    (promotions, state.stopped.get(&point).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asha(rungs: &[u32]) -> SearchSpec {
        SearchSpec { kind: SearchKind::Asha, metric: SearchMetric::TestError, rungs: rungs.to_vec(), reduction: 3 }
    }

    #[test]
    fn rungs_are_checked_against_the_points() {
        let spec = asha(&[2, 2, 9]);
        let paths: Vec<String> = spec.problems(&[8, 10]).into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["search.rungs[1]", "search.rungs[2]"]);
        let mut spec = asha(&[0]);
        spec.reduction = 1;
        let paths: Vec<String> = spec.problems(&[8]).into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["search.rungs[0]", "search.reduction"]);
        assert!(asha(&[1, 2, 4]).problems(&[8]).is_empty());
    }
}
