//! The pass's view of the pool: nodes sorted by id, and per device kind which devices are free and which are
//! held by which running job. Free is derived (listed and held by no running job), so the caller cannot hand
//! the policy a device that is both free and busy.

use std::collections::BTreeMap;

use crate::policy::fairness::kind_index;
use crate::policy::placement::{Pool, Slot};
use crate::policy::types::{ClusterView, DeviceKind, DeviceSlot, NodeId, RunningJob};

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
    /// Whether running job `job` holds device `index` of `node` in this pool.
    pub(crate) fn is_held_by(&self, node: u32, index: u32, job: usize) -> bool {
        let busy = &self.busy[node as usize];
        busy.binary_search_by_key(&index, |&(i, _)| i).is_ok_and(|at| busy[at].1 == job)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ClusterIndex<'a> {
    pub nodes: Vec<NodeId>,
    /// Running jobs sorted by id; `busy` refers to them by position.
    pub running: Vec<&'a RunningJob>,
    pub kinds: [KindIndex; 2],
}

impl<'a> ClusterIndex<'a> {
    pub(crate) fn new(view: &'a ClusterView) -> Self {
        let mut running: Vec<&RunningJob> = view.running.iter().collect();
        running.sort_by_key(|j| j.id);

        let mut listed: BTreeMap<NodeId, BTreeMap<u32, DeviceKind>> = BTreeMap::new();
        for node in &view.nodes {
            let devices = listed.entry(node.id).or_default();
            for device in &node.devices {
                // a device listed twice with two kinds (bad input) is a GPU, whatever the order
                let kind = devices.entry(device.index).or_insert(device.kind);
                if device.kind == DeviceKind::Gpu {
                    *kind = DeviceKind::Gpu;
                }
            }
        }
        let nodes: Vec<NodeId> = listed.keys().copied().collect();

        // device -> holder; a device on an unlisted node (a lost one) holds nothing here, but still counts
        // for its team's usage (see `TeamBook`).
        let mut holder: BTreeMap<DeviceSlot, usize> = BTreeMap::new();
        for (position, job) in running.iter().enumerate() {
            for &slot in &job.devices {
                holder.entry(slot).or_insert(position);
            }
        }

        let mut free: [Vec<Vec<u32>>; 2] = [vec![Vec::new(); nodes.len()], vec![Vec::new(); nodes.len()]];
        let mut busy: [Vec<Vec<(u32, usize)>>; 2] = [vec![Vec::new(); nodes.len()], vec![Vec::new(); nodes.len()]];
        let mut capacity = [0u64; 2];
        for (n, (node, devices)) in listed.iter().enumerate() {
            for (&index, &kind) in devices {
                let k = kind_index(kind);
                capacity[k] += 1;
                match holder.get(&DeviceSlot { node: *node, index }) {
                    Some(&job) => busy[k][n].push((index, job)),
                    None => free[k][n].push(index),
                }
            }
        }
        let [free_gpu, free_cpu] = free;
        let [busy_gpu, busy_cpu] = busy;
        ClusterIndex {
            nodes,
            running,
            kinds: [
                KindIndex { pool: Pool::new(free_gpu), busy: busy_gpu, capacity: capacity[0] },
                KindIndex { pool: Pool::new(free_cpu), busy: busy_cpu, capacity: capacity[1] },
            ],
        }
    }

    /// Node position of a listed node.
    pub(crate) fn node_position(&self, node: NodeId) -> Option<u32> {
        self.nodes.binary_search(&node).ok().map(|p| p as u32)
    }

    pub(crate) fn slots(&self, slots: &[Slot]) -> Vec<DeviceSlot> {
        let mut out: Vec<DeviceSlot> =
            slots.iter().map(|&(node, index)| DeviceSlot { node: self.nodes[node as usize], index }).collect();
        out.sort_unstable();
        out
    }
}
