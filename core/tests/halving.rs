//! Asynchronous successive halving (`study::halving`) driven by scripted curves on a simulated pool: points
//! queued in order, one epoch per device per tick, a point that reaches a rung judged at once; a stopped
//! point frees its device for the next in the queue, a resumed one goes back into the queue ahead of points
//! not yet started (the real queue's order: by submission). Checks promotions, stops, asynchronous starts
//! and what the search spends against the full grid.

use ringtrain_core::study::halving::{
    decide, Decision, HalvingState, SearchKind, SearchMetric, SearchSpec, Trial, TrialStatus,
};

fn asha(rungs: &[u32], reduction: u32) -> SearchSpec {
    SearchSpec { kind: SearchKind::Asha, metric: SearchMetric::TestError, rungs: rungs.to_vec(), reduction }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Queued,
    Running,
    Stopped,
    Done,
}

/// What a simulated search did.
#[derive(Debug, Default)]
struct Run {
    epochs_spent: u32,
    finished: Vec<usize>,
    decisions: Vec<Decision>,
    /// Ticks at which a device stood idle while a point waited in the queue.
    idle_with_work: u32,
    state: HalvingState,
}

/// Runs the search over `curves` (each point's figure after every epoch) on `devices` devices.
fn simulate(spec: &SearchSpec, curves: &[Vec<f64>], devices: usize) -> Run {
    let epochs = curves[0].len() as u32;
    let mut phase = vec![Phase::Queued; curves.len()];
    let mut trained = vec![0u32; curves.len()];
    let mut run = Run::default();
    for _tick in 0..10_000 {
        // free devices take queued points in submission order
        let mut running = phase.iter().filter(|p| **p == Phase::Running).count();
        for waiting in phase.iter_mut().filter(|p| **p == Phase::Queued) {
            if running < devices {
                *waiting = Phase::Running;
                running += 1;
            }
        }
        if running < devices && phase.contains(&Phase::Queued) {
            run.idle_with_work += 1;
        }
        if running == 0 {
            break;
        }
        for point in 0..curves.len() {
            if phase[point] != Phase::Running {
                continue;
            }
            trained[point] += 1;
            run.epochs_spent += 1;
            if trained[point] == epochs {
                phase[point] = Phase::Done;
                run.finished.push(point);
            }
            if !spec.rungs.contains(&trained[point]) {
                continue;
            }
            let trials: Vec<Trial> = (0..curves.len())
                .map(|p| Trial {
                    point: p,
                    at_rungs: spec
                        .rungs
                        .iter()
                        .filter(|r| **r <= trained[p])
                        .map(|r| curves[p][*r as usize - 1])
                        .collect(),
                    status: match phase[p] {
                        Phase::Queued | Phase::Running => TrialStatus::Active,
                        Phase::Stopped => TrialStatus::Stopped,
                        Phase::Done => TrialStatus::Ended,
                    },
                })
                .collect();
            let (decisions, state) = decide(spec, &trials, &run.state);
            run.state = state;
            for decision in decisions {
                match decision {
                    Decision::Stop { point, .. } => phase[point] = Phase::Stopped,
                    Decision::Resume { point, .. } => phase[point] = Phase::Queued,
                }
                run.decisions.push(decision);
            }
        }
    }
    run
}

/// Curves that fall towards each point's final figure by the same amount for every point: the order at
/// every epoch is the final order.
fn consistent(finals: &[f64], epochs: usize) -> Vec<Vec<f64>> {
    finals.iter().map(|f| (1..=epochs).map(|e| f + 0.6 / e as f64).collect()).collect()
}

#[test]
fn the_best_point_trains_to_the_end_for_a_fraction_of_the_grid() {
    // nine multipliers, the fifth best; 9 epochs each: the grid costs 81 epochs
    let finals = [0.30, 0.24, 0.19, 0.15, 0.12, 0.14, 0.18, 0.26, 0.40];
    let curves = consistent(&finals, 9);
    for devices in [1, 2, 3] {
        let run = simulate(&asha(&[1, 3], 3), &curves, devices);
        assert!(run.finished.contains(&4), "{devices} device(s): the best point did not finish: {run:?}");
        let share = f64::from(run.epochs_spent) / 81.0;
        eprintln!("{devices} device(s): {} of 81 epochs ({share:.2}), finished {:?}", run.epochs_spent, run.finished);
        assert!(share <= 0.40, "{devices} device(s): spent {} of 81 epochs ({share:.2})", run.epochs_spent);
        assert_eq!(run.idle_with_work, 0, "a device idled while a point waited: {run:?}");
    }
}

#[test]
fn a_point_stopped_for_want_of_rivals_is_resumed_when_it_proves_best() {
    // one device: point 0 reaches rung 1 alone (⌊1/3⌋ = 0 go on) and is stopped; once points 1 and 2 are
    // worse there, it is the best of three and resumes
    let curves = consistent(&[0.10, 0.30, 0.35, 0.40], 4);
    let run = simulate(&asha(&[1], 3), &curves, 1);
    assert_eq!(
        &run.decisions[..4],
        [
            Decision::Stop { point: 0, rung: 0 },
            Decision::Stop { point: 1, rung: 0 },
            Decision::Resume { point: 0, rung: 0 },
            Decision::Stop { point: 2, rung: 0 },
        ],
        "{run:?}"
    );
    assert_eq!(run.finished, [0], "{run:?}");
    // point 3 was judged among four: ⌊4/3⌋ = 1, and point 0 holds that place
    assert_eq!(run.decisions.last(), Some(&Decision::Stop { point: 3, rung: 0 }));
}

#[test]
fn when_no_other_point_can_reach_a_rung_its_best_goes_on() {
    // four points, η = 3, two rungs: at most one point reaches the second rung, where ⌊1/3⌋ = 0 would stop
    // it; once every other point is stopped below, it is the best there and trains to the end
    let curves = consistent(&[0.30, 0.10, 0.20, 0.40], 4);
    for devices in [1, 2, 4] {
        let run = simulate(&asha(&[1, 2], 3), &curves, devices);
        assert!(run.finished.contains(&1), "{devices} device(s): {run:?}");
        assert!(run.state.promoted[1].contains(&1), "{run:?}");
    }
    // a point that ended (failed) without reaching the rung does not hold the rung open
    let spec = asha(&[1], 3);
    let trials = [
        Trial { point: 0, at_rungs: vec![0.3], status: TrialStatus::Active },
        Trial { point: 1, at_rungs: vec![], status: TrialStatus::Ended },
    ];
    let (decisions, state) = decide(&spec, &trials, &HalvingState::default());
    assert!(decisions.is_empty() && state.promoted[0].contains(&0), "{decisions:?} {state:?}");
    let waiting = [trials[0].clone(), Trial { point: 1, at_rungs: vec![], status: TrialStatus::Active }];
    let (decisions, _) = decide(&spec, &waiting, &HalvingState::default());
    assert_eq!(decisions, [Decision::Stop { point: 0, rung: 0 }]);
}

#[test]
fn a_promotion_is_never_taken_back_and_no_point_is_stopped_twice() {
    // a late point that is better at the rung does not demote the one promoted before it
    let curves = consistent(&[0.20, 0.30, 0.35, 0.05, 0.50, 0.60], 6);
    let run = simulate(&asha(&[2], 3), &curves, 2);
    let mut stops = std::collections::BTreeMap::new();
    for decision in &run.decisions {
        if let Decision::Stop { point, rung } = decision {
            assert!(stops.insert((*point, *rung), ()).is_none(), "stopped twice: {run:?}");
        }
    }
    for promoted in &run.state.promoted[0] {
        assert!(run.finished.contains(promoted), "promoted point {promoted} did not finish: {run:?}");
    }
    assert!(run.finished.contains(&3), "{run:?}");
}

#[test]
fn a_point_that_trained_past_its_stop_takes_no_place_at_the_next_rung() {
    // point 0 was stopped at rung 1 but reported rung 2 before its ranks stopped; points 1 to 3 reach rung 2
    let spec = asha(&[1, 2], 3);
    let mut memory = HalvingState::default();
    memory.stopped.insert(0, 0);
    memory.promoted = vec![[1, 2, 3].into_iter().collect(), Default::default()];
    let trials: Vec<Trial> = [
        (0, 0.01, TrialStatus::Stopped),
        (1, 0.3, TrialStatus::Active),
        (2, 0.2, TrialStatus::Active),
        (3, 0.4, TrialStatus::Active),
    ]
    .into_iter()
    .map(|(point, at_two, status)| Trial { point, at_rungs: vec![if point == 0 { 0.9 } else { 0.5 }, at_two], status })
    .collect();
    let (decisions, state) = decide(&spec, &trials, &memory);
    assert_eq!(state.promoted[1].iter().copied().collect::<Vec<_>>(), [2]);
    assert_eq!(decisions, [Decision::Stop { point: 1, rung: 1 }, Decision::Stop { point: 3, rung: 1 }]);
    assert_eq!(state.stopped.get(&0), Some(&0));
}

#[test]
fn a_diverged_point_ranks_last() {
    let spec = asha(&[1], 2);
    let trials: Vec<Trial> = [f64::NAN, 0.5, 0.4, 0.3]
        .iter()
        .enumerate()
        .map(|(point, figure)| Trial { point, at_rungs: vec![*figure], status: TrialStatus::Active })
        .collect();
    let (decisions, state) = decide(&spec, &trials, &HalvingState::default());
    assert_eq!(state.promoted[0].iter().copied().collect::<Vec<_>>(), [2, 3]);
    assert_eq!(decisions, [Decision::Stop { point: 1, rung: 0 }, Decision::Stop { point: 0, rung: 0 }]);
}
