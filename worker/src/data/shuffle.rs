//! The per-epoch shuffle: ONE permutation of the training set from (seed, epoch), identical on every rank,
//! cut into k disjoint contiguous shards. Computed here in plain Rust (not with libtorch's global RNG), so it
//! depends on nothing but its inputs.

use std::ops::Range;

pub use ringtrain_core::random::SplitMix64;

/// The permutation of `0..len` for `epoch` of a run seeded with `seed` (Fisher-Yates).
pub fn epoch_permutation(seed: u64, epoch: u64, len: usize) -> Vec<i64> {
    let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ 0x5151_7A1E);
    let mut perm: Vec<i64> = (0..len as i64).collect();
    for i in (1..len).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        perm.swap(i, j);
    }
    perm
}

/// Rank `rank`'s contiguous shard of a permutation of `len` samples over `world` ranks: every shard has
/// floor(len / world) samples; the remainder is dropped so every rank takes the same number of steps.
pub fn shard_range(len: usize, world: usize, rank: usize) -> Range<usize> {
    let size = len / world;
    rank * size..(rank + 1) * size
}

/// The samples of rank `rank`'s step `step` (0-based within the epoch): the step-th slice of `batch` from its
/// shard. Every rank's batch has exactly `batch` samples, whatever the world size.
pub fn batch_indices(perm: &[i64], world: usize, rank: usize, step: usize, batch: usize) -> &[i64] {
    let shard = &perm[shard_range(perm.len(), world, rank)];
    &shard[step * batch..(step + 1) * batch]
}

/// Steps per epoch: floor(floor(len / world) / batch) = floor(len / (world * batch)), the same number the
/// LR schedule in `core` uses.
pub fn steps_per_epoch(len: usize, world: usize, batch: usize) -> usize {
    (len / world) / batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn shards_of_an_epoch_are_disjoint_and_come_from_one_permutation() {
        let (len, world, batch) = (1000, 3, 16);
        let perm = epoch_permutation(42, 5, len);
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..len as i64).collect::<Vec<_>>(), "a permutation");

        let steps = steps_per_epoch(len, world, batch);
        assert_eq!(steps, 1000 / 48);
        let mut seen = HashSet::new();
        for rank in 0..world {
            for step in 0..steps {
                let b = batch_indices(&perm, world, rank, step, batch);
                assert_eq!(b.len(), batch);
                for &i in b {
                    assert!(seen.insert(i), "sample {i} used twice");
                }
            }
        }
        assert_eq!(seen.len(), world * steps * batch);
    }

    #[test]
    fn same_on_every_rank_different_per_epoch_and_seed() {
        assert_eq!(epoch_permutation(1, 0, 500), epoch_permutation(1, 0, 500));
        assert_ne!(epoch_permutation(1, 0, 500), epoch_permutation(1, 1, 500));
        assert_ne!(epoch_permutation(1, 0, 500), epoch_permutation(2, 0, 500));
    }

    #[test]
    fn steps_match_the_schedule_in_core() {
        for (len, world, batch) in [(60_000, 8, 32), (1000, 3, 32), (1_281_167, 256, 32), (7, 1, 7)] {
            let expected = len as u64 / (world as u64 * batch as u64);
            assert_eq!(steps_per_epoch(len, world, batch) as u64, expected);
        }
    }
}
