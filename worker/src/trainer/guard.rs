//! The collapse guard: a run whose training error sits at chance level for a whole epoch after its warmup has
//! stopped learning (typically every ReLU dead after too large an lr, with a finite loss, so the NaN check
//! never fires), and training it to the end only holds devices. Goyal et al. warn of this beyond kn ≈ 8k; the
//! user guide's LeNet-5 at lr 0.4 is a case.

use ringtrain_core::Effective;

use crate::metrics::EpochRecord;

/// How close to chance (1 - 1/classes) an epoch's training error must be to count as collapsed: a network
/// that predicts one class misclassifies every other class's samples, within sampling noise of chance.
pub const CHANCE_MARGIN: f64 = 0.02;

/// Epochs of fewer iterations do not count: over a handful of steps a network that has not learned *yet*
/// looks the same as one that cannot any more (the tests' tiny runs, a user's first try).
pub const MIN_EPOCH_ITERATIONS: u64 = 50;

/// Why the run must stop after `record`'s epoch, or None. Only epochs of at least MIN_EPOCH_ITERATIONS whose
/// every iteration lies after the warmup count: during warmup the lr is still rising and the error may sit
/// at chance for a while.
pub fn collapse(record: &EpochRecord, effective: &Effective, classes: i64, devices: usize) -> Option<String> {
    if classes < 2 {
        return None;
    }
    let first_iteration = record.epoch * effective.iterations_per_epoch;
    if first_iteration < effective.warmup_iterations || effective.iterations_per_epoch < MIN_EPOCH_ITERATIONS {
        return None;
    }
    let chance = 1.0 - 1.0 / classes as f64;
    if record.train_error < chance - CHANCE_MARGIN {
        return None;
    }
    let left = u64::from(effective.epochs).saturating_sub(record.epoch + 1);
    let saved_hours = left as f64 * record.seconds * devices as f64 / 3600.0;
    Some(format!(
        "collapsed to chance: train error {:.3} in epoch {} after the warmup (chance is {chance:.3} for {classes} \
         classes; lr {}): stopping with {left} of {} epochs left, about {saved_hours:.3} device-hours saved; the \
         earlier checkpoints are kept. Lower lr.base or lengthen lr.warmup, or set guard.collapse to false",
        record.train_error,
        record.epoch + 1,
        effective.lr_at(first_iteration),
        effective.epochs,
    ))
}

#[cfg(test)]
mod tests {
    use ringtrain_core::JobSpec;

    use super::*;

    fn effective() -> Effective {
        let spec = JobSpec::from_json(
            r#"{"model": {"name": "mlp"}, "dataset": "synthetic:1000", "per_worker_batch": 10, "epochs": 10,
                "lr": {"base": 0.1, "reference_batch": 10, "warmup": {"kind": "gradual", "epochs": 2}}}"#,
        )
        .unwrap();
        Effective::new(&spec, 1000).unwrap()
    }

    fn epoch(epoch: u64, train_error: f64) -> EpochRecord {
        EpochRecord {
            rank: 0,
            epoch,
            iteration: (epoch + 1) * 100 - 1,
            train_loss: 2.3,
            train_error,
            test_error: 0.9,
            test_loss: 2.3,
            seconds: 36.0,
        }
    }

    #[test]
    fn only_an_epoch_at_chance_after_the_warmup_stops_the_run() {
        let eff = effective();
        // in the warmup (epochs 0 and 1): never
        assert_eq!(collapse(&epoch(1, 0.9), &eff, 10, 2), None);
        // after it: at chance within the margin, not below it
        assert_eq!(collapse(&epoch(2, 0.85), &eff, 10, 2), None);
        let why = collapse(&epoch(2, 0.885), &eff, 10, 2).unwrap();
        assert!(why.starts_with("collapsed to chance: train error 0.885 in epoch 3 after the warmup"), "{why}");
        // 7 epochs of 36 s on 2 devices
        assert!(why.contains("with 7 of 10 epochs left, about 0.140 device-hours saved"), "{why}");
        // chance depends on the classes: 0.5 for two
        assert!(collapse(&epoch(2, 0.49), &eff, 2, 1).is_some());
        assert_eq!(collapse(&epoch(2, 0.45), &eff, 2, 1), None);
        // epochs too short to tell "not yet" from "not any more"
        let short = Effective { iterations_per_epoch: MIN_EPOCH_ITERATIONS - 1, ..eff };
        assert_eq!(collapse(&epoch(2, 0.9), &short, 10, 2), None);
    }
}
