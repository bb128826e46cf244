//! Which sample comes when in an epoch of a sharded split: a function of the seed and the epoch alone.
//!
//! The shards are put in a shuffled order, cut into windows of [`WINDOW_SHARDS`] consecutive shards, and the
//! samples of each window shuffled together. The result is one sequence of the split's samples, which the
//! trainer cuts exactly as it cuts an in-memory data set's permutation (`shuffle::batch_indices`: worker w
//! takes the w-th contiguous part, step by step). So the samples and their order do not depend on how many
//! devices, processes, virtual ranks or loader threads there are, and a resume mid-epoch recomputes the
//! sequence and starts where it stopped without reading the shards before. A reader walking its part needs
//! the shards of about one window at a time: its memory and cache are bounded by the window, whatever the
//! split's size.
//!
//! Packing shuffles the images before it shards them (`pack`), so a window of shards already mixes the
//! classes; the window shuffle then mixes within it (Streaming's `py1b` and WebDataset's shard shuffle plus
//! buffer work the same way).

use ringtrain_core::random::SplitMix64;

/// Shards shuffled together. With shards of ~64 MiB (~500 ImageNet images), a window is ~4,000 samples:
/// ten times a shard, the spread MosaicML's Streaming recommends for vision.
pub const WINDOW_SHARDS: usize = 8;

/// The epoch's sequence of a split's samples, numbered through the split shard by shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochOrder {
    samples: Vec<i64>,
}

impl EpochOrder {
    /// The order of `epoch` of a run seeded with `seed`, over shards holding `shard_samples` samples each.
    pub fn new(shard_samples: &[u64], window_shards: usize, seed: u64, epoch: u64) -> EpochOrder {
        let firsts: Vec<i64> = shard_samples
            .iter()
            .scan(0i64, |next, &n| {
                let first = *next;
                *next += n as i64;
                Some(first)
            })
            .collect();
        let mut shards: Vec<usize> = (0..shard_samples.len()).collect();
        shuffle(&mut shards, &mut SplitMix64::new(mix(seed, epoch, u64::MAX)));
        let mut samples = Vec::with_capacity(shard_samples.iter().sum::<u64>() as usize);
        for (window, group) in shards.chunks(window_shards.max(1)).enumerate() {
            let start = samples.len();
            for &shard in group {
                samples.extend(firsts[shard]..firsts[shard] + shard_samples[shard] as i64);
            }
            shuffle(&mut samples[start..], &mut SplitMix64::new(mix(seed, epoch, window as u64)));
        }
        EpochOrder { samples }
    }

    /// The samples, in the epoch's order.
    pub fn samples(&self) -> &[i64] {
        &self.samples
    }
}

/// Fisher-Yates.
fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// A generator's seed for one part (`what`) of one epoch of one run.
fn mix(seed: u64, epoch: u64, what: u64) -> u64 {
    let mut rng = SplitMix64::new(seed ^ 0x5348_4152_4453_u64);
    let a = rng.next_u64() ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    SplitMix64::new(a ^ what.wrapping_mul(0xD6E8_FEB8_6659_FD93)).next_u64()
}

/// The shard holding sample `sample` and its place in it, given each shard's first sample
/// (`SplitIndex::first_samples`).
pub fn locate(first_samples: &[u64], sample: u64) -> (usize, u64) {
    let shard = first_samples.partition_point(|&first| first <= sample).saturating_sub(1);
    (shard, sample - first_samples[shard])
}

/// The seed of one sample's augmentation in one epoch: the same crop and flip whichever thread, process or
/// device decodes it.
pub fn augmentation_seed(seed: u64, epoch: u64, sample: u64) -> u64 {
    mix(seed ^ 0xA11C_E5ED, epoch, sample)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const SHARDS: [u64; 7] = [50, 50, 50, 50, 50, 50, 17];

    #[test]
    fn an_epoch_visits_every_sample_once_the_same_for_any_reader() {
        let order = EpochOrder::new(&SHARDS, 3, 7, 2);
        let total: u64 = SHARDS.iter().sum();
        let seen: HashSet<i64> = order.samples().iter().copied().collect();
        assert_eq!((order.samples().len(), seen.len()), (total as usize, total as usize));
        assert_eq!(order, EpochOrder::new(&SHARDS, 3, 7, 2), "a function of the seed and the epoch alone");
        assert_ne!(order, EpochOrder::new(&SHARDS, 3, 7, 3));
        assert_ne!(order, EpochOrder::new(&SHARDS, 3, 8, 2));
    }

    #[test]
    fn a_window_holds_the_samples_of_its_shards_only() {
        let window = 2;
        let order = EpochOrder::new(&SHARDS, window, 1, 0);
        let firsts: Vec<u64> = SHARDS.iter().scan(0, |n, &s| Some(std::mem::replace(n, *n + s))).collect();
        // walk the order: a window closes when every sample of the shards met since it opened has been met,
        // and never holds more than `window` shards
        let (mut met, mut since) = (HashSet::new(), 0u64);
        for &sample in order.samples() {
            met.insert(locate(&firsts, sample as u64).0);
            since += 1;
            assert!(met.len() <= window, "{met:?}");
            if met.iter().map(|&s| SHARDS[s]).sum::<u64>() == since {
                (met, since) = (HashSet::new(), 0);
            }
        }
        assert_eq!(since, 0, "the last window closed with the epoch");
        // and the samples within a window are mixed, not shard by shard
        let first_window: Vec<usize> = order.samples()[..100].iter().map(|&s| locate(&firsts, s as u64).0).collect();
        assert!(first_window.windows(2).filter(|w| w[0] != w[1]).count() > 20, "{first_window:?}");
    }

    #[test]
    fn samples_are_located_in_their_shard() {
        let firsts = [0, 10, 30];
        assert_eq!(locate(&firsts, 0), (0, 0));
        assert_eq!(locate(&firsts, 9), (0, 9));
        assert_eq!(locate(&firsts, 10), (1, 0));
        assert_eq!(locate(&firsts, 35), (2, 5));
    }
}
