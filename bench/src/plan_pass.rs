//! `ringtrain-bench scheduler` (and `cargo run --release -p ringtrain-bench --example bench_scheduler`, which
//! needs no libtorch): the time of one [`plan`] pass on a synthetic cluster (by default 10k queued
//! jobs, 1k nodes × 8 devices, 20 teams), seeded so every run measures the same input.
//!
//! The cluster is built to exercise every rule, not only placement: half the devices are busy, held by ten
//! of the teams (several beyond their guarantees), so the other ten are below theirs and reclaim; job sizes
//! run from 1 to 64 devices, so some cannot start and get the head-of-line reservation.

use std::collections::BTreeMap;
use std::time::Instant;

use ringtrain_core::JobId;
use serde::Serialize;
use uuid::Uuid;

use ringtrain_scheduler::{
    plan, ClusterView, DeviceKind, DeviceSlot, Node, NodeDevice, NodeId, PerKind, QueuedJob, RunningJob, Team, TeamId,
};

#[derive(Debug, Clone, Serialize)]
pub struct BenchConfig {
    pub queued: usize,
    pub nodes: usize,
    pub devices_per_node: u32,
    pub teams: usize,
    /// Timed passes (after one untimed warm-up pass).
    pub passes: usize,
    /// Fraction of the devices held by running jobs.
    pub busy_fraction: f64,
    pub seed: u64,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            queued: 10_000,
            nodes: 1_000,
            devices_per_node: 8,
            teams: 20,
            passes: 10,
            busy_fraction: 0.5,
            seed: 7,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub config: BenchConfig,
    /// Running jobs in the generated cluster.
    pub running: usize,
    pub min_ms: f64,
    pub median_ms: f64,
    pub max_ms: f64,
    /// What one pass decided.
    pub starts: usize,
    pub preemptions: usize,
    pub reservations: usize,
    /// Jobs left waiting, each with its reason and place recorded by the pass, and how many per reason.
    pub waiting: usize,
    pub reasons: BTreeMap<&'static str, usize>,
}

/// SplitMix64: a few lines, no dependency, the same numbers everywhere.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn uuid(&mut self) -> Uuid {
        Uuid::from_u128((u128::from(self.next()) << 64) | u128::from(self.next()))
    }

    /// A job size: mostly small, a few large (1, 2, 4, 8, 16, 64).
    fn job_size(&mut self) -> u32 {
        match self.below(100) {
            0..=39 => 1,
            40..=59 => 2,
            60..=79 => 4,
            80..=94 => 8,
            95..=98 => 16,
            _ => 64,
        }
    }
}

/// The synthetic cluster: every eighth node has CPU slots, the rest GPUs; guarantees add up to 80% of each
/// pool, unevenly; running jobs belong to the first half of the teams only.
pub fn generate(config: &BenchConfig) -> ClusterView {
    let mut rng = Rng(config.seed);
    let per_node = config.devices_per_node.max(1);
    let nodes: Vec<Node> = (0..config.nodes)
        .map(|i| {
            let kind = if i % 8 == 7 { DeviceKind::Cpu } else { DeviceKind::Gpu };
            Node { id: NodeId(rng.uuid()), devices: (0..per_node).map(|index| NodeDevice { index, kind }).collect() }
        })
        .collect();
    let pool = |kind| nodes.iter().filter(|n| n.devices[0].kind == kind).count() as u64 * u64::from(per_node);
    let (gpus, cpus) = (pool(DeviceKind::Gpu), pool(DeviceKind::Cpu));

    let team_count = config.teams.max(1);
    // shares 1, 2, 3, ... of 80% of each pool
    let share_total: u64 = (1..=team_count as u64).sum();
    let teams: Vec<Team> = (0..team_count)
        .map(|t| {
            let share = t as u64 + 1;
            Team {
                id: TeamId(rng.uuid()),
                guarantee: PerKind {
                    gpu: (gpus * 8 / 10 * share / share_total) as u32,
                    cpu: (cpus * 8 / 10 * share / share_total) as u32,
                },
                weight: 1 + (t % 4) as u32,
            }
        })
        .collect();

    let holders = team_count.div_ceil(2);
    let mut running = Vec::new();
    for node in &nodes {
        let mut index = 0;
        while index < per_node {
            let size = [1, 2, 4, 8][rng.below(4) as usize].min(per_node - index);
            if (rng.below(1000) as f64) < config.busy_fraction * 1000.0 {
                running.push(RunningJob {
                    id: JobId(rng.uuid()),
                    team: teams[rng.below(holders as u64) as usize].id,
                    priority: rng.below(3) as i32,
                    kind: node.devices[0].kind,
                    devices: (index..index + size).map(|i| DeviceSlot { node: node.id, index: i }).collect(),
                    started: rng.below(1_000_000),
                    preemptible: true,
                    preempting: false,
                    grow_to: Vec::new(),
                });
            }
            index += size;
        }
    }

    let queued = (0..config.queued)
        .map(|seq| QueuedJob {
            id: JobId(rng.uuid()),
            team: teams[rng.below(team_count as u64) as usize].id,
            priority: rng.below(4) as i32 - 1,
            kind: if rng.below(100) < 85 { DeviceKind::Gpu } else { DeviceKind::Cpu },
            devices: rng.job_size(),
            submit_seq: seq as u64,
            larger: Vec::new(),
            node_group: 1,
        })
        .collect();
    ClusterView { teams, nodes, queued, running }
}

/// Generates the cluster and times `config.passes` passes over it.
pub fn run(config: &BenchConfig) -> BenchReport {
    let view = generate(config);
    let first = plan(&view); // warm-up, and the decisions to report
    let mut times: Vec<f64> = (0..config.passes.max(1))
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(plan(std::hint::black_box(&view)));
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    BenchReport {
        config: config.clone(),
        running: view.running.len(),
        min_ms: times[0],
        median_ms: times[times.len() / 2],
        max_ms: times[times.len() - 1],
        starts: first.starts.len(),
        preemptions: first.preemptions.len(),
        reservations: first.reservations.len(),
        waiting: first.waiting.len(),
        reasons: first.waiting.iter().fold(BTreeMap::new(), |mut counts, w| {
            *counts.entry(w.reason.code()).or_default() += 1;
            counts
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_bench_runs_and_decides_every_kind_of_thing() {
        let config = BenchConfig { queued: 2_000, nodes: 100, passes: 2, ..BenchConfig::default() };
        let report = run(&config);
        assert!(report.running > 0);
        assert!(report.starts > 0, "{report:?}");
        assert!(report.preemptions > 0, "teams below their guarantee reclaim: {report:?}");
        assert!(report.reservations > 0, "{report:?}");
        assert_eq!(report.waiting + report.starts, config.queued, "every job starts or has a reason: {report:?}");
        assert!(report.reasons.len() >= 4, "{report:?}");
        assert!(report.min_ms <= report.median_ms && report.median_ms <= report.max_ms);
    }
}
