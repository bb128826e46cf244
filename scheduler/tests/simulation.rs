//! The policy over many passes: a small discrete-time cluster where each tick finishes jobs, requeues the ones
//! preempted in the previous tick (they have checkpointed) and applies a fresh plan. The policy keeps no state
//! between passes, so these check that its rules hold over time: a large job is not starved by a stream of
//! small ones, and a reclaim settles instead of preempting back and forth.

mod support;

use std::collections::BTreeMap;

use proptest::prelude::*;
use ringtrain_core::JobId;
use ringtrain_scheduler::{ClusterView, DeviceKind, Plan, QueuedJob, RunningJob, TeamId};
use support::check::check;
use support::{job, team, Cluster};

#[derive(Debug)]
struct Sim {
    view: ClusterView,
    specs: BTreeMap<JobId, QueuedJob>,
    /// Ticks of work each job still has.
    work_left: BTreeMap<JobId, u64>,
    /// Running jobs' end ticks.
    ends: BTreeMap<JobId, u64>,
    first_start: BTreeMap<JobId, u64>,
    finished: BTreeMap<JobId, u64>,
    preemptions: usize,
    tick: u64,
}

impl Sim {
    fn new(cluster: Cluster) -> Self {
        Sim {
            view: cluster.view,
            specs: BTreeMap::new(),
            work_left: BTreeMap::new(),
            ends: BTreeMap::new(),
            first_start: BTreeMap::new(),
            finished: BTreeMap::new(),
            preemptions: 0,
            tick: 0,
        }
    }

    fn submit(&mut self, j: u128, t: u128, k: u32, work: u64) {
        self.submit_with_priority(j, t, k, work, 0);
    }

    fn submit_with_priority(&mut self, j: u128, t: u128, k: u32, work: u64, priority: i32) {
        let spec = QueuedJob {
            id: job(j),
            team: team(t),
            priority,
            kind: DeviceKind::Gpu,
            devices: k,
            submit_seq: j as u64,
            larger: Vec::new(),
            node_group: 1,
        };
        self.specs.insert(spec.id, spec.clone());
        self.work_left.insert(spec.id, work);
        self.view.queued.push(spec);
    }

    fn step(&mut self) -> Plan {
        let now = self.tick;
        // preempted last tick: checkpointed now, back in the queue with the same seq and the work left
        let (stopped, running): (Vec<RunningJob>, Vec<RunningJob>) =
            std::mem::take(&mut self.view.running).into_iter().partition(|r| r.preempting);
        for r in stopped {
            self.view.queued.push(self.specs[&r.id].clone());
        }
        // finished
        for r in running {
            if self.ends[&r.id] <= now {
                self.finished.insert(r.id, now);
            } else {
                self.view.running.push(r);
            }
        }
        let plan = ringtrain_scheduler::plan(&self.view);
        if let Err(e) = check(&self.view, &plan) {
            panic!("tick {now}: {e}\nview {:?}\nplan {plan:?}", self.view);
        }
        for start in &plan.starts {
            self.view.queued.retain(|q| q.id != start.job);
            let spec = &self.specs[&start.job];
            self.ends.insert(start.job, now + self.work_left[&start.job]);
            self.first_start.entry(start.job).or_insert(now);
            self.view.running.push(RunningJob {
                id: start.job,
                team: spec.team,
                priority: spec.priority,
                kind: spec.kind,
                devices: start.devices.clone(),
                started: now,
                preemptible: true,
                preempting: false,
                grow_to: Vec::new(),
            });
        }
        for p in &plan.preemptions {
            let r = self.view.running.iter_mut().find(|r| r.id == p.job).expect("victim is running");
            r.preempting = true;
            self.work_left.insert(p.job, self.ends[&p.job] - now);
            self.preemptions += 1;
        }
        self.tick += 1;
        plan
    }

    fn usage(&self, t: TeamId) -> u32 {
        self.view.running.iter().filter(|r| r.team == t).map(|r| r.devices.len() as u32).sum()
    }
}

#[test]
fn a_large_job_starts_within_a_small_jobs_lifetime_despite_a_stream_of_small_jobs() {
    // 16 GPUs; six 1-GPU jobs of 3 ticks arrive every tick: demand (18) exceeds the pool, so without a
    // reservation the 16-GPU job submitted at tick 5 would never find 16 free at once
    let mut sim = Sim::new(Cluster::new().team(1, 0, 0, 1).node(1, 4, 0).node(2, 4, 0).node(3, 4, 0).node(4, 4, 0));
    let mut next = 100;
    for tick in 0..40 {
        if tick == 5 {
            sim.submit(1, 1, 16, 2);
        }
        for _ in 0..6 {
            sim.submit(next, 1, 1, 3);
            next += 1;
        }
        sim.step();
    }
    let started = sim.first_start.get(&job(1)).copied().expect("the large job started");
    assert!(started <= 5 + 3, "it waits at most for the running small jobs to end (started at tick {started})");
    assert!(sim.finished.contains_key(&job(1)));
    assert!(sim.finished.len() > 150, "small jobs kept running around it: {}", sim.finished.len());
}

#[test]
fn a_reclaim_preempts_exactly_the_borrowed_jobs_once_and_they_resume() {
    // 16 GPUs, teams 1 and 2 guaranteed 8 each; team 2 fills the pool with 1-GPU jobs of 20 ticks
    let mut sim = Sim::new(Cluster::new().team(1, 8, 0, 1).team(2, 8, 0, 1).node(1, 8, 0).node(2, 8, 0));
    for j in 0..16 {
        sim.submit(200 + j, 2, 1, 20);
    }
    sim.step();
    assert_eq!(sim.usage(team(2)), 16, "idle capacity is borrowed");
    // team 1 arrives with two 4-GPU jobs
    sim.submit(1, 1, 4, 5);
    sim.submit(2, 1, 4, 5);
    for _ in 0..60 {
        sim.step();
        if sim.tick == 3 {
            // tick 1 preempted four of team 2's jobs per 4-GPU job; at tick 2 they had checkpointed
            assert_eq!(sim.first_start.get(&job(1)), Some(&2));
            assert_eq!(sim.first_start.get(&job(2)), Some(&2));
            assert_eq!(sim.usage(team(1)), 8);
            assert_eq!(sim.usage(team(2)), 8, "team 2 keeps its guarantee");
        }
    }
    assert_eq!(sim.preemptions, 8, "exactly the 8 borrowed devices, each preempted once");
    for j in 0..16 {
        assert!(sim.finished.contains_key(&job(200 + j)), "preempted job {j} resumed and finished");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the guarantees (even oversubscribed), weights, sizes and arrivals, every job that fits the
    /// pool finishes: no starvation, and no reclaim livelock.
    #[test]
    fn every_job_finishes(
        nodes in prop::collection::vec(1u32..9, 1..4),
        teams in prop::collection::vec((0u32..7, 0u32..4), 1..4),
        jobs in prop::collection::vec((0u64..20, 0u128..4, 0u32..64, 1u64..6, -1i32..2), 1..40),
    ) {
        let mut cluster = Cluster::new();
        for (t, &(guarantee, weight)) in teams.iter().enumerate() {
            cluster = cluster.team(t as u128, guarantee, 0, weight);
        }
        for (n, &gpus) in nodes.iter().enumerate() {
            cluster = cluster.node(n as u128, gpus, 0);
        }
        let pool: u32 = nodes.iter().sum();
        let mut sim = Sim::new(cluster);
        let mut arrivals: Vec<_> = jobs.iter().enumerate().collect();
        arrivals.sort_by_key(|(j, (tick, ..))| (*tick, *j));
        let mut next = 0;
        while sim.finished.len() < jobs.len() && sim.tick < 2_000 {
            while next < arrivals.len() && arrivals[next].1 .0 <= sim.tick {
                let (j, &(_, t, k, work, priority)) = arrivals[next];
                sim.submit_with_priority(j as u128, t % teams.len() as u128, 1 + k % pool, work, priority);
                next += 1;
            }
            sim.step();
        }
        prop_assert_eq!(sim.finished.len(), jobs.len(), "after {} ticks, {} preemptions", sim.tick, sim.preemptions);
    }
}
