//! The free devices of one kind, indexed for gang placement with locality.
//!
//! Nodes are kept in a `BTreeSet` ordered by (free count, node), so each placement costs O(nodes used ·
//! log nodes) instead of a scan of the pool: a pass over 10k jobs on 1k nodes stays in the milliseconds.

use std::collections::BTreeSet;

/// A node by its position in the pass's node list (sorted by `NodeId`), and a device index on it.
pub(crate) type Slot = (u32, u32);

#[derive(Debug, Clone, Default)]
pub(crate) struct Pool {
    /// Per node, its free device indices, sorted in *descending* order so that `pop` hands out the lowest.
    free: Vec<Vec<u32>>,
    /// (free count, node) for every node with at least one free device.
    by_free: BTreeSet<(u32, u32)>,
    total: u64,
}

impl Pool {
    /// `free[node]` lists the node's free device indices (any order, no duplicates).
    pub(crate) fn new(mut free: Vec<Vec<u32>>) -> Self {
        let mut by_free = BTreeSet::new();
        let mut total = 0;
        for (node, devices) in free.iter_mut().enumerate() {
            devices.sort_unstable_by(|a, b| b.cmp(a));
            if !devices.is_empty() {
                by_free.insert((devices.len() as u32, node as u32));
                total += devices.len() as u64;
            }
        }
        Pool { free, by_free, total }
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    pub(crate) fn free_on(&self, node: u32) -> u32 {
        self.free.get(node as usize).map_or(0, |d| d.len() as u32)
    }

    /// Takes up to `n` free devices of `node` (lowest indices first).
    pub(crate) fn take_on_node(&mut self, node: u32, n: u32, out: &mut Vec<Slot>) -> u32 {
        let Some(devices) = self.free.get_mut(node as usize) else { return 0 };
        let before = devices.len() as u32;
        let taken = n.min(before);
        if taken == 0 {
            return 0;
        }
        for _ in 0..taken {
            let index = devices.pop().expect("counted above");
            out.push((node, index));
        }
        self.by_free.remove(&(before, node));
        if before > taken {
            self.by_free.insert((before - taken, node));
        }
        self.total -= u64::from(taken);
        taken
    }

    /// Takes `k` free devices on as few nodes as possible, or nothing when fewer than `k` are free.
    ///
    /// The fewest nodes: while no single node can hold the rest, take the node with the most free devices
    /// whole (taking the largest first minimises the count). The rest then goes to the *smallest* node that
    /// holds it (best fit), which keeps nodes with many free devices whole for later large jobs.
    pub(crate) fn take(&mut self, k: u32) -> Option<Vec<Slot>> {
        if k == 0 || self.total < u64::from(k) {
            return None;
        }
        let mut out = Vec::with_capacity(k as usize);
        let mut remaining = k;
        while remaining > 0 {
            if let Some(&(_, node)) = self.by_free.range((remaining, 0)..).next() {
                remaining -= self.take_on_node(node, remaining, &mut out);
            } else {
                // the largest count, and among nodes with it the first, so ties break the same way as above
                let &(count, _) = self.by_free.iter().next_back().expect("total >= remaining > 0");
                let &(_, node) = self.by_free.range((count, 0)..).next().expect("exists");
                remaining -= self.take_on_node(node, count, &mut out);
            }
        }
        out.sort_unstable();
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(free_counts: &[u32]) -> Pool {
        Pool::new(free_counts.iter().map(|&n| (0..n).collect()).collect())
    }

    fn nodes_of(slots: &[Slot]) -> Vec<u32> {
        let mut nodes: Vec<u32> = slots.iter().map(|s| s.0).collect();
        nodes.dedup();
        nodes
    }

    #[test]
    fn placement_table() {
        // (free devices per node, k, expected nodes used, or None when it must not place)
        type Case<'a> = (&'a [u32], u32, Option<&'a [u32]>);
        let cases: &[Case] = &[
            (&[8, 8], 8, Some(&[0])),             // whole job on one node
            (&[8, 3, 5], 3, Some(&[1])),          // best fit: the node with exactly 3, not the 8
            (&[8, 4, 5], 4, Some(&[1])),          // best fit among several that fit
            (&[2, 6, 4], 9, Some(&[1, 2])),       // two nodes: the largest whole, then best fit (4 ≥ 3)
            (&[3, 3, 3, 3], 7, Some(&[0, 1, 2])), // needs three nodes whatever we do
            (&[5, 2, 2, 4], 9, Some(&[0, 3])),    // 5 + 4, not 5 + 2 + 2
            (&[4, 4], 9, None),                   // gang: 8 free < 9, nothing is taken
            (&[], 1, None),
        ];
        for (free, k, expected) in cases {
            let mut p = pool(free);
            let before = p.total();
            let got = p.take(*k);
            match expected {
                None => {
                    assert!(got.is_none(), "free {free:?} k {k}");
                    assert_eq!(p.total(), before, "a failed gang placement takes nothing");
                }
                Some(nodes) => {
                    let slots = got.unwrap_or_else(|| panic!("free {free:?} k {k}: not placed"));
                    assert_eq!(slots.len(), *k as usize);
                    assert_eq!(nodes_of(&slots), *nodes, "free {free:?} k {k}");
                    assert_eq!(p.total(), before - u64::from(*k));
                }
            }
        }
    }

    #[test]
    fn devices_are_handed_out_once_lowest_index_first() {
        let mut p = pool(&[4]);
        assert_eq!(p.take(2), Some(vec![(0, 0), (0, 1)]));
        assert_eq!(p.take(2), Some(vec![(0, 2), (0, 3)]));
        assert_eq!(p.take(1), None);
    }
}
