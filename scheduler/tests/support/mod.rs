//! A small builder for cluster views, with numbered ids so tests read like tables.
#![allow(dead_code)]

pub mod check;

use ringtrain_core::JobId;
use ringtrain_scheduler::{
    ClusterView, DeviceKind, DeviceSlot, Node, NodeDevice, NodeId, PerKind, Plan, QueuedJob, RunningJob, Team, TeamId,
};
use uuid::Uuid;

pub fn team(n: u128) -> TeamId {
    TeamId(Uuid::from_u128(0x7ea0_0000 + n))
}

pub fn node(n: u128) -> NodeId {
    NodeId(Uuid::from_u128(0x0de0_0000 + n))
}

pub fn job(n: u128) -> JobId {
    JobId(Uuid::from_u128(0x10b0_0000 + n))
}

pub fn slot(n: u128, index: u32) -> DeviceSlot {
    DeviceSlot { node: node(n), index }
}

#[derive(Debug, Default, Clone)]
pub struct Cluster {
    pub view: ClusterView,
}

impl Cluster {
    pub fn new() -> Self {
        Self::default()
    }

    /// A team with GPU and CPU guarantees and a weight.
    pub fn team(mut self, n: u128, gpu: u32, cpu: u32, weight: u32) -> Self {
        self.view.teams.push(Team { id: team(n), guarantee: PerKind { gpu, cpu }, weight });
        self
    }

    /// A node with `gpus` GPUs (indices 0..) and `cpus` CPU slots (indices after the GPUs).
    pub fn node(mut self, n: u128, gpus: u32, cpus: u32) -> Self {
        let mut devices: Vec<NodeDevice> = (0..gpus).map(|index| NodeDevice { index, kind: DeviceKind::Gpu }).collect();
        devices.extend((gpus..gpus + cpus).map(|index| NodeDevice { index, kind: DeviceKind::Cpu }));
        self.view.nodes.push(Node { id: node(n), devices });
        self
    }

    /// A queued GPU job of `k` devices, priority 0, submitted in id order.
    pub fn queue(self, j: u128, t: u128, k: u32) -> Self {
        self.queue_full(j, t, k, DeviceKind::Gpu, 0)
    }

    pub fn queue_full(mut self, j: u128, t: u128, k: u32, kind: DeviceKind, priority: i32) -> Self {
        self.view.queued.push(QueuedJob {
            id: job(j),
            team: team(t),
            priority,
            kind,
            devices: k,
            submit_seq: j as u64,
            larger: Vec::new(),
            node_group: 1,
        });
        self
    }

    /// A running GPU job of team `t` on `devices` ((node, index) pairs), priority 0, started at `j`.
    pub fn run(self, j: u128, t: u128, devices: &[(u128, u32)]) -> Self {
        self.run_full(j, t, devices, 0, true, false)
    }

    pub fn run_full(
        mut self,
        j: u128,
        t: u128,
        devices: &[(u128, u32)],
        priority: i32,
        preemptible: bool,
        preempting: bool,
    ) -> Self {
        self.view.running.push(RunningJob {
            id: job(j),
            team: team(t),
            priority,
            kind: DeviceKind::Gpu,
            devices: devices.iter().map(|&(n, i)| slot(n, i)).collect(),
            started: j as u64,
            preemptible,
            preempting,
            grow_to: Vec::new(),
        });
        self
    }

    pub fn plan(&self) -> Plan {
        ringtrain_scheduler::plan(&self.view)
    }
}

/// The jobs started, in decision order.
pub fn started(plan: &Plan) -> Vec<JobId> {
    plan.starts.iter().map(|s| s.job).collect()
}

pub fn preempted(plan: &Plan) -> Vec<JobId> {
    let mut jobs: Vec<JobId> = plan.preemptions.iter().map(|p| p.job).collect();
    jobs.sort();
    jobs
}

/// The nodes a started job landed on.
pub fn nodes_of(plan: &Plan, j: u128) -> Vec<NodeId> {
    let start = plan.starts.iter().find(|s| s.job == job(j)).unwrap_or_else(|| panic!("job {j} not started: {plan:?}"));
    let mut nodes: Vec<NodeId> = start.devices.iter().map(|d| d.node).collect();
    nodes.dedup();
    nodes
}
