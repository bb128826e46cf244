//! The pass's view of the pool: nodes sorted by id, and per device kind which devices are free and which are
//! held by which running job. Free is derived (listed and held by no running job), so the caller cannot hand
//! the policy a device that is both free and busy.

use crate::policy::fairness::kind_index;
use crate::policy::id_hash::UuidMap;
use crate::policy::placement::{Pool, Slot};
use crate::policy::types::{ClusterView, DeviceKind, DeviceSlot, Node, NodeId, RunningJob};

#[derive(Debug, Clone)]
pub(crate) struct KindIndex {
    /// The free devices, for placement.
    pub pool: Pool,
    /// Per node, its busy devices of this kind and the running job (index into `ClusterIndex::running`)
    /// holding each, sorted by device index.
    pub busy: Vec<Vec<(u32, usize)>>,
    /// All listed devices of this kind, free or busy.
    pub capacity: u64,
}

impl KindIndex {
    /// Each node's devices of this kind, free or busy.
    pub(crate) fn node_capacities(&self) -> Vec<u32> {
        (0..self.busy.len() as u32)
            .map(|node| self.busy[node as usize].len() as u32 + self.pool.free_on(node))
            .collect()
    }

    /// Whether running job `job` holds device `index` of `node` in this pool.
    pub(crate) fn is_held_by(&self, node: u32, index: u32, job: usize) -> bool {
        let busy = &self.busy[node as usize];
        busy.binary_search_by_key(&index, |&(i, _)| i).is_ok_and(|at| busy[at].1 == job)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ClusterIndex<'a> {
    pub nodes: Vec<NodeId>,
    /// Each node's position in `nodes`: one probe, where a binary search over 10k ids was a chain of cache
    /// misses for every device of every running job.
    positions: UuidMap<NodeId, u32>,
    /// Running jobs sorted by id; `busy` refers to them by position.
    pub running: Vec<&'a RunningJob>,
    pub kinds: [KindIndex; 2],
}

impl<'a> ClusterIndex<'a> {
    pub(crate) fn new(view: &'a ClusterView) -> Self {
        let mut running: Vec<&RunningJob> = view.running.iter().collect();
        running.sort_by_key(|j| j.id);

        // Sorted vectors rather than maps, and flat ones rather than one per node: at 10k nodes and 100k
        // devices the allocations were the largest part of a pass.
        let mut listed: Vec<&Node> = view.nodes.iter().collect();
        listed.sort_unstable_by_key(|n| n.id);
        let mut nodes: Vec<NodeId> = listed.iter().map(|n| n.id).collect();
        nodes.dedup();
        let positions: UuidMap<NodeId, u32> = nodes.iter().enumerate().map(|(p, &id)| (id, p as u32)).collect();

        // (node, device, holder) for every device of a running job on a listed node, sorted, with the first
        // holder in `running`'s order kept; a device on an unlisted node (a lost one) holds nothing here, but
        // still counts for its team's usage (see `TeamBook`).
        let mut held: Vec<(u32, u32, usize)> = Vec::with_capacity(running.iter().map(|j| j.devices.len()).sum());
        for (position, job) in running.iter().enumerate() {
            for slot in &job.devices {
                if let Some(&node) = positions.get(&slot.node) {
                    held.push((node, slot.index, position));
                }
            }
        }
        held.sort_unstable();
        held.dedup_by_key(|&mut (node, index, _)| (node, index));
        let mut held = held.into_iter().peekable();

        let mut free: [Vec<Vec<u32>>; 2] = [vec![Vec::new(); nodes.len()], vec![Vec::new(); nodes.len()]];
        let mut busy: [Vec<Vec<(u32, usize)>>; 2] = [vec![Vec::new(); nodes.len()], vec![Vec::new(); nodes.len()]];
        let mut capacity = [0u64; 2];
        let mut devices: Vec<(u32, DeviceKind)> = Vec::new();
        let mut listed = listed.into_iter().peekable();
        for (n, &id) in nodes.iter().enumerate() {
            // a node listed twice (bad input) has the devices of both rows
            devices.clear();
            while let Some(node) = listed.next_if(|node| node.id == id) {
                devices.extend(node.devices.iter().map(|d| (d.index, d.kind)));
            }
            // a device listed twice with two kinds (bad input) is a GPU, whatever the order: GPUs sort first
            devices.sort_unstable_by_key(|&(index, kind)| (index, kind != DeviceKind::Gpu));
            devices.dedup_by_key(|&mut (index, _)| index);
            let node = n as u32;
            for &(index, kind) in &devices {
                let k = kind_index(kind);
                capacity[k] += 1;
                while held.next_if(|&(on, i, _)| (on, i) < (node, index)).is_some() {}
                match held.next_if(|&(on, i, _)| (on, i) == (node, index)) {
                    Some((_, _, job)) => busy[k][n].push((index, job)),
                    None => free[k][n].push(index),
                }
            }
        }
        let [free_gpu, free_cpu] = free;
        let [busy_gpu, busy_cpu] = busy;
        ClusterIndex {
            nodes,
            positions,
            running,
            kinds: [
                KindIndex { pool: Pool::new(free_gpu), busy: busy_gpu, capacity: capacity[0] },
                KindIndex { pool: Pool::new(free_cpu), busy: busy_cpu, capacity: capacity[1] },
            ],
        }
    }

    /// Node position of a listed node.
    pub(crate) fn node_position(&self, node: NodeId) -> Option<u32> {
        self.positions.get(&node).copied()
    }

    pub(crate) fn slots(&self, slots: &[Slot]) -> Vec<DeviceSlot> {
        let mut out: Vec<DeviceSlot> =
            slots.iter().map(|&(node, index)| DeviceSlot { node: self.nodes[node as usize], index }).collect();
        out.sort_unstable();
        out
    }
}
