//! A hash for UUID-keyed maps of one pass. The std `HashMap`'s SipHash costs more than the rest of a lookup
//! for a 16-byte key, and a `BTreeMap` or a binary search over 10k UUIDs costs a chain of cache misses per
//! lookup; a pass over 100k queued jobs on 10k nodes makes hundreds of thousands of these. The keys are
//! UUIDs the server made (random v4), but tests use small counters, so both halves are folded through a
//! 64×64→128-bit multiply: every input bit reaches the bits hashbrown picks buckets and tags from.
//! Not for keys a client chooses: it makes no attempt to resist collisions crafted on purpose.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from a UUID newtype to a value, hashed with [`UuidHasher`].
pub(crate) type UuidMap<K, V> = HashMap<K, V, BuildHasherDefault<UuidHasher>>;

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct UuidHasher(u64);

impl Hasher for UuidHasher {
    fn write(&mut self, bytes: &[u8]) {
        // a UUID arrives as its 16 bytes (after a length prefix, which `write_usize` folds in below)
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            // big-endian: a UUID made from a counter varies in its last bytes, which become the low bits
            self.mix(u64::from_be_bytes(word));
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        fold(self.0)
    }
}

impl UuidHasher {
    fn mix(&mut self, word: u64) {
        self.0 = fold(self.0 ^ word);
    }
}

/// The two halves of `x` times an odd constant, xored: the high half depends on every bit of `x`.
fn fold(x: u64) -> u64 {
    let product = u128::from(x) * 0x9e37_79b9_7f4a_7c15;
    (product as u64) ^ ((product >> 64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringtrain_core::NodeId;
    use uuid::Uuid;

    #[test]
    fn small_counters_and_random_ids_spread_over_the_buckets() {
        let hash = |id: NodeId| {
            use std::hash::BuildHasher;
            BuildHasherDefault::<UuidHasher>::default().hash_one(id)
        };
        for ids in [
            (0..4096u128).map(|n| NodeId(Uuid::from_u128(n))).collect::<Vec<_>>(),
            (0..4096).map(|_| NodeId::new()).collect(),
        ] {
            // the low 12 bits pick one of 4096 buckets: a good hash fills most of them
            let mut buckets: Vec<u64> = ids.iter().map(|&id| hash(id) & 0xfff).collect();
            buckets.sort_unstable();
            buckets.dedup();
            assert!(buckets.len() > 2400, "{} buckets of 4096", buckets.len());
            // and the top 7 bits (hashbrown's tags) vary too
            let mut tags: Vec<u64> = ids.iter().map(|&id| hash(id) >> 57).collect();
            tags.sort_unstable();
            tags.dedup();
            assert!(tags.len() > 100, "{} tags of 128", tags.len());
        }
    }
}
