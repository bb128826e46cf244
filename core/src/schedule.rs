//! The learning-rate schedule of Goyal et al. 2017: pure functions from (spec, dataset size) to the effective
//! hyperparameters and the lr of every iteration. The trainer and the API both use these, so the lr a
//! job reports is the lr it trained with.

use serde::{Deserialize, Serialize};

use crate::error::FieldError;
use crate::spec::{DecayKind, JobSpec, LrSpec, MomentumForm, Precision, Scaling, WarmupKind};

/// The hyperparameters a job actually runs with, once defaults, scaling and the dataset size are applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Effective {
    pub workers: u32,
    pub per_worker_batch: u32,
    /// kn
    pub global_batch: u64,
    /// Training samples used per epoch (the dataset size capped by `train_samples`).
    pub train_size: u64,
    /// floor(train_size / kn): the remainder of each epoch's permutation is dropped so every rank takes
    /// the same number of steps.
    pub iterations_per_epoch: u64,
    pub epochs: u32,
    pub total_iterations: u64,
    pub base_lr: f64,
    pub reference_batch: u32,
    pub scaling: Scaling,
    /// The multiplier scaling applies to `base_lr` (kn/reference for linear).
    pub scaling_factor: f64,
    /// base_lr * scaling_factor, capped by `lr.max`: the lr after warmup and before any decay.
    pub scaled_lr: f64,
    pub max_lr: Option<f64>,
    pub warmup_kind: WarmupKind,
    /// The warmup's length: the spec's, or 0 when it is skipped (`warmup_skipped` says why).
    pub warmup_epochs: f64,
    /// round(warmup_epochs * iterations_per_epoch); the scaled lr is reached exactly at this iteration.
    pub warmup_iterations: u64,
    /// Why the spec's warmup is not run: the scaled lr is below the base lr (kn under the reference batch,
    /// or `lr.max` below the base), and a warmup from the base lr could only hold the lr above its target
    /// or ramp it down. Goyal et al.'s warmup ramps up from η to kη with k ≥ 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_skipped: Option<String>,
    pub decay_kind: DecayKind,
    pub decay_milestones: Vec<u32>,
    pub decay_factor: f64,
    pub momentum: f64,
    pub nesterov: bool,
    pub momentum_form: MomentumForm,
    pub weight_decay: f64,
    pub bn_weight_decay: bool,
    pub bias_weight_decay: bool,
    /// The arithmetic trained with (absent in results written before it existed: fp32).
    #[serde(default)]
    pub precision: Precision,
}

/// What the base lr is multiplied by for a global batch of `global_batch`: `lr.multiplier` when given,
/// otherwise the scaling rule's factor.
pub fn scaling_factor(lr: &LrSpec, global_batch: u64) -> f64 {
    let ratio = global_batch as f64 / f64::from(lr.reference_batch);
    match (lr.multiplier, lr.scaling) {
        (Some(multiplier), _) => multiplier,
        (None, Scaling::Linear) => ratio,
        (None, Scaling::Sqrt) => ratio.sqrt(),
        (None, Scaling::None) => 1.0,
    }
}

impl Effective {
    /// Derives the effective hyperparameters. `dataset_size` is the number of training samples of the
    /// dataset (before `train_samples` caps it).
    pub fn new(spec: &JobSpec, dataset_size: u64) -> Result<Effective, Vec<FieldError>> {
        spec.validate_for_dataset(Some(dataset_size))?;
        let train_size = spec.effective_train_size(Some(dataset_size)).unwrap_or(dataset_size);
        let global_batch = spec.global_batch();
        let iterations_per_epoch = train_size / global_batch;
        let lr = &spec.lr;
        let scaling_factor = scaling_factor(lr, global_batch);
        let scaled = lr.base * scaling_factor;
        let scaled_lr = lr.max.map_or(scaled, |max| scaled.min(max));
        let asked_epochs = lr.warmup.resolved_epochs();
        let warmup_skipped =
            (lr.warmup.kind != WarmupKind::None && asked_epochs > 0.0 && scaled_lr < lr.base).then(|| {
                format!(
                    "no warmup: the scaled lr {scaled_lr} is below the base lr {} (global batch {global_batch}, \
                     reference batch {}), so the {} warmup of {asked_epochs} epochs from the base lr would hold \
                     the lr above its target or ramp it down; the run starts at the scaled lr",
                    lr.base,
                    lr.reference_batch,
                    format!("{:?}", lr.warmup.kind).to_lowercase(),
                )
            });
        let warmup_epochs = if warmup_skipped.is_some() { 0.0 } else { asked_epochs };
        Ok(Effective {
            workers: spec.workers,
            per_worker_batch: spec.per_worker_batch,
            global_batch,
            train_size,
            iterations_per_epoch,
            epochs: spec.epochs,
            total_iterations: iterations_per_epoch * u64::from(spec.epochs),
            base_lr: lr.base,
            reference_batch: lr.reference_batch,
            scaling: lr.scaling,
            scaling_factor,
            scaled_lr,
            max_lr: lr.max,
            warmup_kind: lr.warmup.kind,
            warmup_epochs,
            warmup_iterations: (warmup_epochs * iterations_per_epoch as f64).round() as u64,
            warmup_skipped,
            decay_kind: lr.decay.kind,
            decay_milestones: lr.decay.resolved_milestones(spec.epochs),
            decay_factor: lr.decay.factor,
            momentum: spec.optimizer.momentum,
            nesterov: spec.optimizer.nesterov,
            momentum_form: spec.optimizer.momentum_form,
            weight_decay: spec.optimizer.weight_decay,
            bn_weight_decay: spec.optimizer.bn_weight_decay,
            bias_weight_decay: spec.optimizer.bias_weight_decay,
            precision: spec.precision,
        })
    }

    /// The epoch that iteration `t` (0-based) belongs to.
    pub fn epoch_of(&self, iteration: u64) -> u64 {
        iteration / self.iterations_per_epoch.max(1)
    }

    /// The lr of iteration `t` (0-based). Defined for every t; past the end it keeps the last phase's rule.
    pub fn lr_at(&self, iteration: u64) -> f64 {
        let lr =
            if iteration < self.warmup_iterations { self.warmup_lr(iteration) } else { self.decayed_lr(iteration) };
        self.max_lr.map_or(lr, |max| lr.min(max))
    }

    fn warmup_lr(&self, iteration: u64) -> f64 {
        match self.warmup_kind {
            WarmupKind::Gradual => {
                let progress = iteration as f64 / self.warmup_iterations as f64;
                self.base_lr + (self.scaled_lr - self.base_lr) * progress
            }
            WarmupKind::Constant => self.base_lr,
            WarmupKind::None => self.scaled_lr,
        }
    }

    fn decayed_lr(&self, iteration: u64) -> f64 {
        match self.decay_kind {
            DecayKind::None => self.scaled_lr,
            DecayKind::Step => {
                let epoch = self.epoch_of(iteration);
                let passed = self.decay_milestones.iter().filter(|&&m| u64::from(m) <= epoch).count();
                self.scaled_lr * self.decay_factor.powi(passed as i32)
            }
            DecayKind::Cosine => {
                let span = self.total_iterations.saturating_sub(self.warmup_iterations).max(1) as f64;
                let progress = ((iteration - self.warmup_iterations) as f64 / span).min(1.0);
                self.scaled_lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }

    /// The lr of every iteration of the job.
    pub fn lr_per_iteration(&self) -> Vec<f64> {
        (0..self.total_iterations).map(|t| self.lr_at(t)).collect()
    }

    /// The factor lr_{t+1}/lr_t by which the Goyal-form momentum buffer is scaled between iterations t and
    /// t+1 (1 when the lr does not change, and for a zero lr).
    pub fn momentum_correction(&self, iteration: u64) -> f64 {
        correction(self.lr_at(iteration), self.lr_at(iteration + 1))
    }

    /// The compact JSON form: per-epoch summary and the change points.
    pub fn render(&self, per_iteration: bool) -> ScheduleView {
        let ipe = self.iterations_per_epoch;
        // The lr is monotone between change points, so an epoch's extremes lie at its ends or on either side
        // of a change point inside it: a few evaluations per epoch, whatever the iteration count.
        let changes: Vec<u64> = self.change_points().iter().map(|c| c.iteration).collect();
        let epochs = (0..u64::from(self.epochs))
            .map(|e| {
                let first = e * ipe;
                let last = (first + ipe).saturating_sub(1);
                let inside = changes.iter().filter(|&&c| c > first && c <= last).flat_map(|&c| [c - 1, c]);
                let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
                for t in [first, last].into_iter().chain(inside) {
                    let lr = self.lr_at(t);
                    min = min.min(lr);
                    max = max.max(lr);
                }
                EpochSummary {
                    epoch: e,
                    first_iteration: first,
                    lr_first: self.lr_at(first),
                    lr_last: self.lr_at(last),
                    lr_min: min,
                    lr_max: max,
                }
            })
            .collect();
        ScheduleView {
            effective: self.clone(),
            epochs,
            change_points: self.change_points(),
            per_iteration: per_iteration.then(|| self.lr_per_iteration()),
        }
    }

    /// The iterations where the rule giving the lr changes: warmup start and end, each step milestone, the
    /// start of a cosine decay.
    pub fn change_points(&self) -> Vec<ChangePoint> {
        let mut points = Vec::new();
        let mut add = |iteration: u64, phase: Phase| {
            if iteration < self.total_iterations.max(1) {
                let lr = self.lr_at(iteration);
                let previous = iteration.checked_sub(1).map(|t| self.lr_at(t));
                points.push(ChangePoint {
                    iteration,
                    epoch: self.epoch_of(iteration),
                    lr,
                    phase,
                    momentum_correction: previous.map_or(1.0, |prev| correction(prev, lr)),
                });
            }
        };
        let warming = self.warmup_iterations > 0 && self.warmup_kind != WarmupKind::None;
        if warming {
            add(0, Phase::Warmup { shape: self.warmup_kind });
        }
        let after_warmup = if warming { self.warmup_iterations } else { 0 };
        match self.decay_kind {
            DecayKind::Cosine => add(after_warmup, Phase::Cosine),
            DecayKind::None | DecayKind::Step => add(after_warmup, Phase::Constant),
        }
        if self.decay_kind == DecayKind::Step {
            for (i, &m) in self.decay_milestones.iter().enumerate() {
                add(u64::from(m) * self.iterations_per_epoch, Phase::StepDecay { milestone: i as u32 + 1 });
            }
        }
        points
    }
}

fn correction(from: f64, to: f64) -> f64 {
    if from == 0.0 || from == to {
        1.0
    } else {
        to / from
    }
}

/// The schedule as the API and `ringtrain schedule` return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleView {
    pub effective: Effective,
    pub epochs: Vec<EpochSummary>,
    pub change_points: Vec<ChangePoint>,
    /// The lr of every iteration, only when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_iteration: Option<Vec<f64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochSummary {
    pub epoch: u64,
    pub first_iteration: u64,
    pub lr_first: f64,
    pub lr_last: f64,
    pub lr_min: f64,
    pub lr_max: f64,
}

/// Where a new rule starts: from `iteration` on, the lr follows `phase`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangePoint {
    pub iteration: u64,
    pub epoch: u64,
    /// The lr at `iteration`.
    pub lr: f64,
    pub phase: Phase,
    /// lr_t / lr_{t-1}: the factor the Goyal-form momentum buffer is scaled by on entering this point.
    pub momentum_correction: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Phase {
    /// Warming up (gradual: a per-iteration linear ramp; constant: `base` held).
    Warmup { shape: WarmupKind },
    /// The scaled lr, held until the next change point.
    Constant,
    /// The i-th step decay (1-based): the scaled lr times factor^i.
    StepDecay { milestone: u32 },
    /// Half-cosine decay to the end of training.
    Cosine,
}
