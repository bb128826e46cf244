//! The learning-rate schedule pinned to Goyal et al. 2017's numbers, plus properties that must hold for
//! every valid spec.

use proptest::prelude::*;
use ringtrain_core::schedule::{Effective, Phase};
use ringtrain_core::spec::{DecayKind, JobSpec, Scaling, WarmupKind};

/// ImageNet-1k's training set, the dataset of the paper.
const IMAGENET_TRAIN: u64 = 1_281_167;

fn goyal_spec(workers: u32) -> JobSpec {
    JobSpec::from_json(&format!(
        r#"{{"model": {{"name": "resnet50"}}, "dataset": "idx:/data/imagenet", "workers": {workers},
            "per_worker_batch": 32, "epochs": 90, "device": "gpu"}}"#
    ))
    .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn a_schedule_of_more_than_a_billion_iterations_is_refused_not_computed() {
    let spec = JobSpec::from_json(
        r#"{"model": {"name": "mlp"}, "dataset": "synthetic", "per_worker_batch": 1, "epochs": 10000,
            "lr": {"warmup": {"kind": "none"}, "decay": {"kind": "none"}}}"#,
    )
    .unwrap();
    let errors = Effective::new(&spec, 1_000_000_000_000).unwrap_err();
    assert!(
        errors.iter().any(|e| e.path == "epochs" && e.reason.contains("more than 1000000000 iterations")),
        "{errors:?}"
    );
    // and u64::MAX samples do not overflow anything
    assert!(Effective::new(&spec, u64::MAX).is_err());
}

#[test]
fn goyal_kn_8192_warms_up_to_3_2_then_steps_down() {
    let eff = Effective::new(&goyal_spec(256), IMAGENET_TRAIN).unwrap();
    let ipe = eff.iterations_per_epoch;
    assert_eq!(eff.global_batch, 8192);
    assert_eq!(ipe, IMAGENET_TRAIN / 8192);
    assert_eq!(eff.warmup_iterations, 5 * ipe);
    assert_eq!(eff.decay_milestones, vec![30, 60, 80]);

    assert!(close(eff.lr_at(0), 0.1), "warmup starts at base lr, got {}", eff.lr_at(0));
    assert!(eff.lr_at(5 * ipe - 1) < 3.2);
    assert_eq!(eff.lr_at(5 * ipe), 3.2, "the scaled lr is reached exactly at the first post-warmup iteration");
    assert!(close(eff.lr_at(30 * ipe - 1), 3.2));
    assert!(close(eff.lr_at(30 * ipe), 0.32));
    assert!(close(eff.lr_at(60 * ipe), 0.032));
    assert!(close(eff.lr_at(80 * ipe), 0.0032));
    assert!(close(eff.lr_at(90 * ipe - 1), 0.0032));
}

#[test]
fn sqrt_scaling_gives_base_times_sqrt_32() {
    let mut spec = goyal_spec(256);
    spec.lr.scaling = Scaling::Sqrt;
    let eff = Effective::new(&spec, IMAGENET_TRAIN).unwrap();
    assert!(close(eff.scaled_lr, 0.1 * 32f64.sqrt()));
    assert!(close(eff.lr_at(5 * eff.iterations_per_epoch), 0.1 * 32f64.sqrt()));
}

#[test]
fn no_scaling_at_the_reference_batch_and_none() {
    let eff = Effective::new(&goyal_spec(8), IMAGENET_TRAIN).unwrap(); // kn = 256
    assert_eq!(eff.scaled_lr, 0.1);
    let mut spec = goyal_spec(256);
    spec.lr.scaling = Scaling::None;
    assert_eq!(Effective::new(&spec, IMAGENET_TRAIN).unwrap().scaled_lr, 0.1);
}

#[test]
fn constant_warmup_holds_base_then_jumps() {
    let mut spec = goyal_spec(256);
    spec.lr.warmup.kind = WarmupKind::Constant;
    let eff = Effective::new(&spec, IMAGENET_TRAIN).unwrap();
    let w = eff.warmup_iterations;
    assert_eq!(eff.lr_at(0), 0.1);
    assert_eq!(eff.lr_at(w - 1), 0.1);
    assert_eq!(eff.lr_at(w), 3.2);
}

#[test]
fn gradual_warmup_rises_every_iteration() {
    let eff = Effective::new(&goyal_spec(256), IMAGENET_TRAIN).unwrap();
    let step = (3.2 - 0.1) / eff.warmup_iterations as f64;
    for t in 0..eff.warmup_iterations {
        assert!(close(eff.lr_at(t + 1) - eff.lr_at(t), step), "iteration {t}");
    }
}

#[test]
fn cap_bounds_every_lr() {
    let mut spec = goyal_spec(256);
    spec.lr.max = Some(1.0);
    let eff = Effective::new(&spec, IMAGENET_TRAIN).unwrap();
    assert_eq!(eff.scaled_lr, 1.0);
    assert!(eff.lr_per_iteration().iter().all(|&lr| lr <= 1.0));
}

#[test]
fn cosine_decays_from_scaled_lr_towards_zero() {
    let mut spec = goyal_spec(256);
    spec.lr.decay.kind = DecayKind::Cosine;
    let eff = Effective::new(&spec, IMAGENET_TRAIN).unwrap();
    let w = eff.warmup_iterations;
    assert_eq!(eff.lr_at(w), 3.2);
    let mid = w + (eff.total_iterations - w) / 2;
    assert!((eff.lr_at(mid) - 1.6).abs() < 0.01);
    assert!(eff.lr_at(eff.total_iterations - 1) < 1e-3);
}

#[test]
fn momentum_correction_is_the_lr_ratio_and_one_when_lr_is_unchanged() {
    let eff = Effective::new(&goyal_spec(256), IMAGENET_TRAIN).unwrap();
    let ipe = eff.iterations_per_epoch;
    assert!(close(eff.momentum_correction(30 * ipe - 1), 0.1));
    assert_eq!(eff.momentum_correction(10 * ipe), 1.0);
    assert!(eff.momentum_correction(0) > 1.0, "during gradual warmup the lr rises every step");
}

#[test]
fn change_points_mark_warmup_and_each_milestone() {
    let eff = Effective::new(&goyal_spec(256), IMAGENET_TRAIN).unwrap();
    let ipe = eff.iterations_per_epoch;
    let points = eff.change_points();
    let at: Vec<(u64, Phase)> = points.iter().map(|p| (p.iteration, p.phase)).collect();
    assert_eq!(
        at,
        vec![
            (0, Phase::Warmup { shape: WarmupKind::Gradual }),
            (5 * ipe, Phase::Constant),
            (30 * ipe, Phase::StepDecay { milestone: 1 }),
            (60 * ipe, Phase::StepDecay { milestone: 2 }),
            (80 * ipe, Phase::StepDecay { milestone: 3 }),
        ]
    );
    assert!(close(points[2].momentum_correction, 0.1));
}

#[test]
fn render_summarises_every_epoch_and_lists_iterations_on_request() {
    let eff = Effective::new(&goyal_spec(256), IMAGENET_TRAIN).unwrap();
    let compact = eff.render(false);
    assert_eq!(compact.epochs.len(), 90);
    assert!(compact.per_iteration.is_none());
    assert!(close(compact.epochs[0].lr_first, 0.1));
    assert!(close(compact.epochs[30].lr_max, 0.32));
    let full = eff.render(true);
    assert_eq!(full.per_iteration.as_ref().unwrap().len() as u64, eff.total_iterations);
    let json = serde_json::to_value(&full).unwrap();
    assert_eq!(json["change_points"][0]["phase"]["kind"], "warmup");
}

#[test]
fn remainder_of_each_epoch_is_dropped() {
    let spec = JobSpec::from_json(
        r#"{"model": {"name": "mlp"}, "dataset": "synthetic:1000", "workers": 3, "per_worker_batch": 32,
            "epochs": 4, "lr": {"warmup": {"epochs": 1}}}"#,
    )
    .unwrap();
    let eff = Effective::new(&spec, 1000).unwrap();
    assert_eq!(eff.iterations_per_epoch, 10); // floor(1000 / 96)
    assert_eq!(eff.total_iterations, 40);
}

/// Goyal's warmup ramps up from η to kη (k ≥ 1). Below the reference batch the scaled lr is under the base,
/// and a warmup from the base would ramp down: it is skipped, and the effective hyperparameters say why.
#[test]
fn warmup_is_skipped_where_it_would_go_down() {
    // the user guide's example: kn = 2 × 32 = 64 against a reference batch of 256
    let spec = JobSpec::from_json(
        r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "workers": 2, "per_worker_batch": 32,
            "epochs": 6, "lr": {"base": 0.1, "reference_batch": 256, "warmup": {"kind": "gradual", "epochs": 1}}}"#,
    )
    .unwrap();
    let eff = Effective::new(&spec, 60_000).unwrap();
    assert!(close(eff.scaled_lr, 0.025));
    assert_eq!((eff.warmup_iterations, eff.warmup_epochs), (0, 0.0));
    let why = eff.warmup_skipped.as_deref().unwrap();
    assert!(why.contains("scaled lr 0.025 is below the base lr 0.1"), "{why}");
    assert!(close(eff.lr_at(0), 0.025), "the run starts at the scaled lr: {}", eff.lr_at(0));
    assert!(eff.change_points().iter().all(|c| !matches!(c.phase, Phase::Warmup { .. })));
    // a constant warmup would hold the base lr, above the target: skipped too
    let mut constant = spec.clone();
    constant.lr.warmup.kind = WarmupKind::Constant;
    assert!(close(Effective::new(&constant, 60_000).unwrap().lr_at(0), 0.025));
    // at or above the reference batch the warmup runs as asked
    let mut k8 = spec.clone();
    k8.workers = 8;
    let eff = Effective::new(&k8, 60_000).unwrap();
    assert_eq!((eff.warmup_skipped.as_deref(), eff.warmup_iterations), (None, 234));
    assert!(close(eff.lr_at(0), 0.1));
}

prop_compose! {
    fn any_spec()(
        workers in 1u32..64,
        batch in 1u32..64,
        epochs in 2u32..40,
        warmup_fraction in 0.0f64..0.99,
        warmup_kind in prop_oneof![Just(WarmupKind::None), Just(WarmupKind::Constant), Just(WarmupKind::Gradual)],
        decay_kind in prop_oneof![Just(DecayKind::Step), Just(DecayKind::Cosine), Just(DecayKind::None)],
        scaling in prop_oneof![Just(Scaling::Linear), Just(Scaling::Sqrt), Just(Scaling::None)],
        base in 0.001f64..1.0,
        max in proptest::option::of(0.01f64..10.0),
        factor in 0.01f64..1.0,
    ) -> JobSpec {
        let mut spec = goyal_spec(workers);
        spec.per_worker_batch = batch;
        spec.epochs = epochs;
        spec.lr.base = base;
        spec.lr.max = max;
        spec.lr.scaling = scaling;
        spec.lr.warmup.kind = warmup_kind;
        spec.lr.warmup.epochs = match warmup_kind {
            WarmupKind::None => None,
            _ => Some((warmup_fraction * f64::from(epochs)).floor()),
        };
        spec.lr.decay.kind = decay_kind;
        spec.lr.decay.factor = factor;
        if decay_kind == DecayKind::Step {
            let first = spec.lr.warmup.resolved_epochs() as u32;
            let ms: Vec<u32> = (first.max(1)..epochs).step_by(3).collect();
            spec.lr.decay.milestones = Some(ms);
        }
        spec
    }
}

/// The index ranges over which a single rule applies (between consecutive change points).
fn phases(eff: &Effective) -> Vec<std::ops::Range<u64>> {
    let mut starts: Vec<u64> = eff.change_points().iter().map(|p| p.iteration).collect();
    starts.push(eff.total_iterations);
    starts.windows(2).map(|w| w[0]..w[1]).collect()
}

proptest! {
    /// The per-epoch summary is computed from a few points per epoch (the lr is monotone between change
    /// points): it must equal the extremes over every iteration.
    #[test]
    fn epoch_extremes_match_every_iteration(spec in any_spec(), size in 4096u64..100_000) {
        let eff = Effective::new(&spec, size).unwrap();
        let view = eff.render(false);
        let ipe = eff.iterations_per_epoch;
        for summary in &view.epochs {
            let lrs: Vec<f64> = (summary.first_iteration..summary.first_iteration + ipe).map(|t| eff.lr_at(t)).collect();
            let min = lrs.iter().copied().fold(f64::INFINITY, f64::min);
            let max = lrs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            prop_assert_eq!(summary.lr_min, min, "epoch {}", summary.epoch);
            prop_assert_eq!(summary.lr_max, max, "epoch {}", summary.epoch);
        }
    }

    /// During warmup the lr never falls and never passes the scaled lr.
    #[test]
    fn warmup_never_goes_down(spec in any_spec(), size in 4096u64..100_000) {
        let eff = Effective::new(&spec, size).unwrap();
        for t in 0..eff.warmup_iterations {
            // (a step decay may fall on the first iteration after the warmup: that is the decay)
            if t + 1 < eff.warmup_iterations {
                prop_assert!(eff.lr_at(t + 1) >= eff.lr_at(t), "t = {}: {} then {}", t, eff.lr_at(t), eff.lr_at(t + 1));
            }
            prop_assert!(eff.lr_at(t) <= eff.scaled_lr * (1.0 + 1e-12), "t = {}", t);
        }
    }

    #[test]
    fn never_exceeds_max(spec in any_spec(), size in 4096u64..100_000) {
        let eff = Effective::new(&spec, size).unwrap();
        if let Some(max) = spec.lr.max {
            for lr in eff.lr_per_iteration() {
                prop_assert!(lr <= max);
            }
        }
    }

    #[test]
    fn gradual_warmup_is_continuous(spec in any_spec(), size in 4096u64..100_000) {
        let eff = Effective::new(&spec, size).unwrap();
        prop_assume!(eff.warmup_kind == WarmupKind::Gradual && eff.warmup_iterations > 0);
        let w = eff.warmup_iterations;
        let step = (eff.scaled_lr - eff.base_lr).abs() / w as f64;
        // consecutive lrs differ by at most one ramp step, and the ramp ends one step below the scaled lr
        for t in 0..w - 1 {
            let jump = (eff.lr_at(t + 1) - eff.lr_at(t)).abs();
            prop_assert!(jump <= step * (1.0 + 1e-9) + 1e-15, "jump {} at {} > step {}", jump, t, step);
        }
        let capped_last_ramp = eff.lr_at(w - 1);
        let ramp_end = (eff.base_lr + (eff.scaled_lr - eff.base_lr) * (w - 1) as f64 / w as f64)
            .min(eff.max_lr.unwrap_or(f64::INFINITY));
        prop_assert!((capped_last_ramp - ramp_end).abs() <= 1e-12);
        // the scaled lr itself is reached at iteration w, unless a step decay starts at that very epoch
        let decays_at_warmup_end = eff.decay_milestones.iter().any(|&m| u64::from(m) * eff.iterations_per_epoch == w);
        if !decays_at_warmup_end && eff.decay_kind != DecayKind::Cosine || eff.decay_kind == DecayKind::Cosine {
            prop_assert_eq!(eff.lr_at(w), eff.scaled_lr);
        }
    }

    #[test]
    fn monotone_within_each_phase(spec in any_spec(), size in 4096u64..100_000) {
        let eff = Effective::new(&spec, size).unwrap();
        for phase in phases(&eff) {
            let lrs: Vec<f64> = phase.clone().map(|t| eff.lr_at(t)).collect();
            let rising = lrs.windows(2).all(|w| w[1] >= w[0]);
            let falling = lrs.windows(2).all(|w| w[1] <= w[0]);
            prop_assert!(rising || falling, "phase {:?} is not monotone", phase);
        }
    }

    #[test]
    fn every_lr_is_positive_and_finite(spec in any_spec(), size in 4096u64..100_000) {
        let eff = Effective::new(&spec, size).unwrap();
        // cosine reaches 0 only past the last iteration
        for lr in eff.lr_per_iteration() {
            prop_assert!(lr.is_finite() && lr > 0.0);
        }
    }
}
