//! Properties every plan must have, on random clusters: devices are never double-booked and never exceed
//! what is free, reclaims stay within guarantees and take only borrowed devices, nothing that fits is left
//! waiting outside a reservation, and the plan does not depend on the order of the input.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use ringtrain_core::JobId;
use ringtrain_scheduler::{
    ClusterView, DeviceKind, DeviceSlot, Node, NodeDevice, Plan, QueuedJob, ReservationKind, RunningJob, Team, TeamId,
};
use support::{job, node, team};

type NodeSpec = (u32, u32); // gpus, cpus
type TeamSpec = (u32, u32, u32); // gpu guarantee, cpu guarantee, weight
type RunningSpec = (u128, i32, bool, u8); // team, priority, preemptible, preempting when 0
type QueuedSpec = (u128, bool, u32, i32); // team, gpu?, k, priority

/// Builds a consistent view: `owners[d]` picks, for the d-th device of the pool, a running job (0..8 of
/// `running`) or none (8, 9), cycling through `owners`; busy pools make reclaims and reservations likely.
fn build(
    nodes: &[NodeSpec],
    teams: &[TeamSpec],
    owners: &[usize],
    running: &[RunningSpec],
    queued: &[QueuedSpec],
) -> ClusterView {
    let mut view = ClusterView::default();
    for (t, &(gpu, cpu, weight)) in teams.iter().enumerate() {
        view.teams.push(Team { id: team(t as u128), guarantee: ringtrain_scheduler::PerKind { gpu, cpu }, weight });
    }
    let team_of = |t: u128| team(t % teams.len() as u128);
    // (running spec, kind) -> devices: a spec owning devices of both kinds becomes two jobs
    let mut held: BTreeMap<(usize, bool), Vec<DeviceSlot>> = BTreeMap::new();
    let mut d = 0;
    for (n, &(gpus, cpus)) in nodes.iter().enumerate() {
        let mut devices = Vec::new();
        for index in 0..gpus + cpus {
            let kind = if index < gpus { DeviceKind::Gpu } else { DeviceKind::Cpu };
            devices.push(NodeDevice { index, kind });
            let owner = owners.get(d % owners.len().max(1)).copied().unwrap_or(usize::MAX);
            d += 1;
            if owner < running.len() {
                held.entry((owner, kind == DeviceKind::Gpu))
                    .or_default()
                    .push(DeviceSlot { node: node(n as u128), index });
            }
        }
        view.nodes.push(Node { id: node(n as u128), devices });
    }
    for ((owner, gpu), devices) in held {
        let (t, priority, preemptible, preempting) = running[owner];
        view.running.push(RunningJob {
            id: job(1000 + 2 * owner as u128 + u128::from(gpu)),
            team: team_of(t),
            priority,
            kind: if gpu { DeviceKind::Gpu } else { DeviceKind::Cpu },
            devices,
            started: owner as u64,
            preemptible,
            preempting: preempting == 0,
        });
    }
    for (j, &(t, gpu, k, priority)) in queued.iter().enumerate() {
        view.queued.push(QueuedJob {
            id: job(j as u128),
            team: team_of(t),
            priority,
            kind: if gpu { DeviceKind::Gpu } else { DeviceKind::Cpu },
            devices: k,
            submit_seq: j as u64,
        });
    }
    view
}

const KINDS: [DeviceKind; 2] = [DeviceKind::Gpu, DeviceKind::Cpu];

/// `DeviceKind` is not `Ord`; maps key on its position in `KINDS`.
fn ki(kind: DeviceKind) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap_or(0)
}

fn guarantee(view: &ClusterView, t: TeamId, kind: DeviceKind) -> u32 {
    view.teams.iter().find(|x| x.id == t).map_or(0, |x| x.guarantee.get(kind))
}

/// Devices a team holds at the start of the pass, not counting jobs already being preempted.
fn usage(view: &ClusterView, t: TeamId, kind: DeviceKind) -> u32 {
    view.running.iter().filter(|r| r.team == t && r.kind == kind && !r.preempting).map(|r| r.devices.len() as u32).sum()
}

fn check(view: &ClusterView, plan: &Plan) -> Result<(), TestCaseError> {
    let kinds: BTreeMap<DeviceSlot, DeviceKind> = view
        .nodes
        .iter()
        .flat_map(|n| n.devices.iter().map(move |d| (DeviceSlot { node: n.id, index: d.index }, d.kind)))
        .collect();
    let busy: BTreeMap<DeviceSlot, &RunningJob> =
        view.running.iter().flat_map(|r| r.devices.iter().map(move |&d| (d, r))).collect();
    let free_at_start = |kind| kinds.iter().filter(|(s, k)| **k == kind && !busy.contains_key(s)).count() as u32;
    let capacity = |kind| kinds.values().filter(|k| **k == kind).count() as u32;
    let queued: BTreeMap<JobId, &QueuedJob> = view.queued.iter().map(|q| (q.id, q)).collect();

    // starts and held reservations: distinct devices, free at the start, of the job's kind, exactly k
    let mut booked: BTreeSet<DeviceSlot> = BTreeSet::new();
    let mut decided: BTreeSet<JobId> = BTreeSet::new();
    let mut started_by: BTreeMap<(TeamId, usize), u32> = BTreeMap::new();
    for start in &plan.starts {
        let q = queued.get(&start.job).ok_or_else(|| TestCaseError::fail("started an unknown job"))?;
        prop_assert!(decided.insert(start.job), "job decided twice");
        prop_assert_eq!(start.devices.len(), q.devices as usize);
        prop_assert!(start.borrowed <= q.devices);
        for d in &start.devices {
            prop_assert_eq!(kinds.get(d), Some(&q.kind), "a listed device of the job's kind");
            prop_assert!(!busy.contains_key(d), "device held by a running job");
            prop_assert!(booked.insert(*d), "device assigned twice");
        }
        *started_by.entry((q.team, ki(q.kind))).or_default() += q.devices;
    }
    let mut held_count = [0u32; 2];
    let mut reclaimed: BTreeMap<(TeamId, usize), u32> = BTreeMap::new();
    let mut awaited: BTreeSet<DeviceSlot> = BTreeSet::new();
    for r in &plan.reservations {
        let q = queued.get(&r.job).ok_or_else(|| TestCaseError::fail("reserved for an unknown job"))?;
        prop_assert!(decided.insert(r.job), "job both started and reserved, or reserved twice");
        prop_assert_eq!(r.held.len() + r.awaiting.len(), q.devices as usize);
        for d in &r.held {
            prop_assert_eq!(kinds.get(d), Some(&q.kind));
            prop_assert!(!busy.contains_key(d));
            prop_assert!(booked.insert(*d), "held device also started or held twice");
            held_count[ki(q.kind)] += 1;
        }
        for d in &r.awaiting {
            prop_assert_eq!(kinds.get(d), Some(&q.kind));
            prop_assert!(busy.contains_key(d), "awaited devices are busy");
            prop_assert!(awaited.insert(*d), "awaited by two reservations");
        }
        if r.kind == ReservationKind::Reclaim {
            *reclaimed.entry((q.team, ki(q.kind))).or_default() += q.devices;
        }
    }

    // reclaims stay within the reclaiming team's guarantee
    for (&(t, k_index), &k) in &reclaimed {
        let kind = KINDS[k_index];
        prop_assert!(usage(view, t, kind) + k <= guarantee(view, t, kind), "reclaim beyond the guarantee");
    }
    // victims: preemptible, not already preempting, of a team beyond its guarantee, each once
    let mut victims = BTreeSet::new();
    let mut taken_from: BTreeMap<(TeamId, usize), (u32, u32)> = BTreeMap::new();
    for p in &plan.preemptions {
        let r = view.running.iter().find(|r| r.id == p.job).ok_or_else(|| TestCaseError::fail("unknown victim"))?;
        prop_assert!(victims.insert(p.job));
        prop_assert!(r.preemptible && !r.preempting);
        prop_assert!(usage(view, r.team, r.kind) > guarantee(view, r.team, r.kind), "victim's team was not borrowing");
        let sizes = taken_from.entry((r.team, ki(r.kind))).or_insert((0u32, 0u32));
        sizes.0 += r.devices.len() as u32;
        sizes.1 = sizes.1.max(r.devices.len() as u32);
    }
    // each victim was chosen while its team still borrowed: all but the last fit in what it borrowed
    for (&(t, k_index), &(sum, largest)) in &taken_from {
        let kind = KINDS[k_index];
        prop_assert!(sum - largest < usage(view, t, kind) - guarantee(view, t, kind), "took more than borrowed");
    }

    for kind in KINDS {
        let started: u32 = started_by.iter().filter(|((_, k), _)| *k == ki(kind)).map(|(_, n)| n).sum();
        let idle = free_at_start(kind);
        prop_assert!(started + held_count[ki(kind)] <= idle, "more than the free devices");
        // a team never exceeds its guarantee plus what was idle and not taken by other teams
        for t in view.teams.iter().map(|t| t.id) {
            let mine = started_by.get(&(t, ki(kind))).copied().unwrap_or(0);
            let before = usage(view, t, kind);
            prop_assert!(before + mine <= before.max(guarantee(view, t, kind)) + (idle - (started - mine)));
        }
        // nothing left waiting fits in the free devices outside reservations
        let left = idle - started - held_count[ki(kind)];
        for q in view.queued.iter().filter(|q| q.kind == kind && !decided.contains(&q.id)) {
            if q.devices > capacity(kind) {
                prop_assert!(plan.too_large.contains(&q.id));
            } else {
                prop_assert!(q.devices > left, "job {} of {} waits with {} unreserved free", q.id, q.devices, left);
            }
        }
    }
    Ok(())
}

fn reordered(view: &ClusterView, rotate: usize) -> ClusterView {
    let mut other = view.clone();
    let turn = |n: usize| if n == 0 { 0 } else { rotate % n };
    other.teams.reverse();
    let n = other.nodes.len();
    other.nodes.rotate_left(turn(n));
    for node in &mut other.nodes {
        node.devices.reverse();
    }
    let n = other.queued.len();
    other.queued.rotate_left(turn(n));
    other.running.reverse();
    other
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_respects_the_invariants(
        nodes in prop::collection::vec((0u32..7, 0u32..4), 1..5),
        teams in prop::collection::vec((0u32..9, 0u32..5, 0u32..4), 1..4),
        owners in prop::collection::vec(0usize..10, 1..40),
        running in prop::collection::vec((0u128..4, -1i32..3, any::<bool>(), 0u8..6), 8),
        queued in prop::collection::vec((0u128..4, any::<bool>(), 1u32..7, -1i32..3), 0..16),
        rotate in 0usize..7,
    ) {
        let view = build(&nodes, &teams, &owners, &running, &queued);
        let plan = ringtrain_scheduler::plan(&view);
        check(&view, &plan)?;
        prop_assert_eq!(&ringtrain_scheduler::plan(&reordered(&view, rotate)), &plan, "input order leaked into the plan");
    }

    /// Liveness of reclaim: on a full GPU pool, team 0 (below its guarantee, holding nothing) gets its job
    /// reserved by preemption whenever the other teams borrow at least k devices between them, and nobody
    /// is preempted unless that makes the job fit.
    #[test]
    fn a_team_below_its_guarantee_reclaims_whenever_enough_is_borrowed(
        nodes in prop::collection::vec((1u32..7, 0u32..1), 1..4),
        guarantees in prop::collection::vec(0u32..6, 1..4),
        owners in prop::collection::vec(0usize..8, 1..40),
        running in prop::collection::vec((1u128..4, -1i32..3, Just(true), Just(1u8)), 8),
        team0_guarantee in 1u32..9,
        k_choice in 0u32..8,
    ) {
        let k = 1 + k_choice % team0_guarantee; // within team 0's guarantee
        let mut teams: Vec<TeamSpec> = vec![(team0_guarantee, 0, 1)];
        teams.extend(guarantees.iter().map(|&g| (g, 0, 1)));
        // every device busy: owners only name running jobs
        let mut view = build(&nodes, &teams, &owners, &running, &[(0, true, k, 0)]);
        // team indices wrap over the teams built; team 0 must hold nothing
        let team0 = team(0);
        view.running.retain(|r| r.team != team0);
        let busy: u32 = view.running.iter().map(|r| r.devices.len() as u32).sum();
        let devices: u32 = view.nodes.iter().map(|n| n.devices.len() as u32).sum();
        let free = devices - busy;
        let borrowed: u32 = view
            .teams
            .iter()
            .map(|t| usage(&view, t.id, DeviceKind::Gpu).saturating_sub(t.guarantee.gpu))
            .sum();
        let plan = ringtrain_scheduler::plan(&view);
        check(&view, &plan)?;
        if free >= k {
            prop_assert_eq!(plan.starts.first().map(|s| s.job), Some(job(0)));
            prop_assert!(plan.preemptions.is_empty());
        } else if free + borrowed >= k {
            // the greedy takes from each borrowing team until it is back at its guarantee, so it always finds
            // at least what is borrowed (more when a gang job straddles a team's guarantee)
            prop_assert!(plan.reservations.iter().any(|r| r.job == job(0) && r.kind == ReservationKind::Reclaim), "{:?}", plan);
            prop_assert!(!plan.preemptions.is_empty());
        } else if !plan.preemptions.is_empty() {
            // never a preemption that does not make the job fit
            prop_assert!(plan.reservations.iter().any(|r| r.job == job(0) && r.kind == ReservationKind::Reclaim));
        }
    }
}
