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

impl Pool {
    /// The whole groups of `group` devices the free devices make, node by node.
    pub(crate) fn free_groups(&self, group: u32) -> u64 {
        let group = u64::from(group.max(1));
        self.free.iter().map(|devices| devices.len() as u64 / group).sum()
    }

    /// Takes `k` free devices in groups of `group` that each lie on one node (a worker's pipeline stages),
    /// on as few nodes as possible as [`Pool::take`] does, or nothing when the free devices do not make
    /// k / group such groups. Each node gives a whole number of groups, so the devices sorted by node hold
    /// each group in `group` consecutive places. A group of 1 is [`Pool::take`].
    pub(crate) fn take_grouped(&mut self, k: u32, group: u32) -> Option<Vec<Slot>> {
        if group <= 1 {
            return self.take(k);
        }
        let groups = k / group;
        if k % group != 0 || groups == 0 || self.free_groups(group) < u64::from(groups) {
            return None;
        }
        let mut out = Vec::with_capacity(k as usize);
        let mut remaining = groups;
        while remaining > 0 {
            // the smallest node that holds the rest, else the largest node's whole groups
            if let Some(&(_, node)) = self.by_free.range((remaining * group, 0)..).next() {
                self.take_on_node(node, remaining * group, &mut out);
                remaining = 0;
            } else {
                let &(count, _) = self.by_free.iter().next_back().expect("free groups remain");
                let &(_, node) = self.by_free.range((count, 0)..).next().expect("exists");
                let taken = (count / group).min(remaining);
                debug_assert!(taken > 0, "the largest node holds a group while free groups remain");
                self.take_on_node(node, taken * group, &mut out);
                remaining -= taken;
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

    #[test]
    fn grouped_devices_lie_on_one_node_each_or_none_are_taken() {
        // 4 devices free on 4 nodes make no group of 2: nothing is taken
        let mut p = pool(&[1, 1, 1, 1]);
        assert_eq!(p.take_grouped(4, 2), None);
        assert_eq!(p.total(), 4, "a failed placement takes nothing");
        // 3 + 3 free make 2 groups of 2; the third device of each node stays free
        let mut p = pool(&[3, 3]);
        let slots = p.take_grouped(4, 2).unwrap();
        assert_eq!(slots, vec![(0, 0), (0, 1), (1, 0), (1, 1)]);
        assert_eq!(p.take_grouped(2, 2), None, "1 + 1 left make no group");
        // the smallest node that holds every group is taken whole; groups never straddle nodes
        let mut p = pool(&[5, 4, 2]);
        assert_eq!(nodes_of(&p.take_grouped(4, 2).unwrap()), vec![1]);
        let mut p = pool(&[5, 4, 3]);
        let slots = p.take_grouped(6, 3).unwrap();
        assert_eq!(nodes_of(&slots), vec![0, 2], "a group from the largest, the rest from the best fit");
        for group in slots.chunks(3) {
            assert!(group.iter().all(|s| s.0 == group[0].0), "{slots:?}");
        }
        assert_eq!(pool(&[4]).take_grouped(3, 2), None, "a count that is no whole number of groups");
    }
}
