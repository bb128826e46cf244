//! BatchNorm statistics are per rank and computed over that rank's n samples, whatever k is.

use std::sync::Mutex;

use ringtrain_core::JobSpec;
use ringtrain_worker::data::shuffle::epoch_permutation;
use ringtrain_worker::{SoloCollective, TrainOptions, Trainer};

fn spec(workers: usize) -> JobSpec {
    JobSpec::from_json(&format!(
        r#"{{"model": {{"name": "resnet20"}}, "dataset": "synthetic:256", "workers": {workers},
            "per_worker_batch": 8, "epochs": 2, "lr": {{"warmup": {{"kind": "none"}}, "decay": {{"kind": "none"}}}}}}"#
    ))
    .unwrap()
}

/// libtorch has one random generator per process, which `Trainer::new` seeds and then draws the initial
/// weights from: tests building trainers on parallel threads take turns, or one's seeding lands in the
/// middle of another's initialisation and the weights differ.
static TORCH_RNG: Mutex<()> = Mutex::new(());

/// Virtual rank 0's statistics after one step, and all virtual ranks' tables.
fn after_one_step(k: usize) -> (Vec<f32>, Vec<f32>) {
    let _turn = TORCH_RNG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let spec = spec(k);
    let mut comm = SoloCollective;
    let options = TrainOptions { virtual_ranks: k, ..Default::default() };
    let mut trainer = Trainer::new(&spec, &mut comm, options).unwrap();
    let permutation = epoch_permutation(spec.seed, 0, 256);
    trainer.train_step(0, 0, &permutation).unwrap();
    let all = trainer.gather_batch_norm().unwrap();
    let len = all.len() / k;
    (all[..len].to_vec(), all)
}

#[test]
fn batch_norm_sees_n_samples_whatever_k_is() {
    // Rank 0's first batch is the first n samples of the epoch's permutation for every k (its shard starts
    // at 0), and every rank starts from the same weights: if BN normalised over kn samples, or over the
    // ranks together, rank 0's running statistics would change with k.
    let (k1, _) = after_one_step(1);
    for k in [2, 4] {
        let (rank0, _) = after_one_step(k);
        assert_eq!(rank0, k1, "k = {k}");
    }
}

#[test]
fn batch_norm_statistics_differ_by_rank() {
    let (_, all) = after_one_step(4);
    let len = all.len() / 4;
    let tables: Vec<&[f32]> = all.chunks(len).collect();
    for r in 1..4 {
        assert_ne!(tables[0], tables[r], "rank {r} has rank 0's statistics: they were synchronised");
    }
}
