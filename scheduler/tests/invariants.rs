//! Properties every plan must have, on random clusters: devices are never double-booked and never exceed
//! what is free, reclaims stay within guarantees and take only borrowed devices, nothing that fits is left
//! waiting outside a reservation, and the plan does not depend on the order of the input.

mod support;

use std::collections::BTreeMap;

use proptest::prelude::*;
use ringtrain_scheduler::{
    ClusterView, DeviceKind, DeviceSlot, Node, NodeDevice, QueuedJob, ReservationKind, RunningJob, Team,
};
use support::check::{check, usage};
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
            grow_to: Vec::new(),
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
            larger: Vec::new(),
            node_group: 1,
        });
    }
    view
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

    /// A dry run (the job added with a sequence number after every other) gives the verdict the next pass
    /// gives once the job is really queued (with the next sequence number the store hands out, the input
    /// in another order), and the jobs it says are delayed are exactly those the submission keeps from
    /// starting.
    #[test]
    fn a_dry_run_answers_what_the_next_pass_does(
        nodes in prop::collection::vec((0u32..7, 0u32..4), 1..5),
        teams in prop::collection::vec((0u32..9, 0u32..5, 0u32..4), 1..4),
        owners in prop::collection::vec(0usize..10, 1..40),
        running in prop::collection::vec((0u128..4, -1i32..3, any::<bool>(), 0u8..6), 8),
        queued in prop::collection::vec((0u128..4, any::<bool>(), 1u32..7, -1i32..3), 0..16),
        submitted in (0u128..4, any::<bool>(), 1u32..9, -1i32..3),
        rotate in 0usize..7,
    ) {
        let view = build(&nodes, &teams, &owners, &running, &queued);
        let (t, gpu, k, priority) = submitted;
        let kind = if gpu { DeviceKind::Gpu } else { DeviceKind::Cpu };
        let new_job = |submit_seq| QueuedJob { id: job(999), team: team(t % teams.len() as u128), priority, kind, devices: k, submit_seq, larger: Vec::new(), node_group: 1 };
        let dry = ringtrain_scheduler::dry_run(&view, new_job(u64::MAX)).expect("planned");

        let mut submitted_view = view.clone();
        submitted_view.queued.push(new_job(queued.len() as u64));
        let next_pass = ringtrain_scheduler::plan(&reordered(&submitted_view, rotate));
        check(&submitted_view, &next_pass)?;
        prop_assert_eq!(Some(dry.verdict.clone()), next_pass.verdict(job(999)));
        let before = ringtrain_scheduler::plan(&view);
        for start in &before.starts {
            let still = next_pass.starts.iter().any(|s| s.job == start.job);
            prop_assert_eq!(dry.delays.contains(&start.job), !still);
        }
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

    /// Weighted max-min with whole devices: when a team gets a device in a pass, it was the team with the
    /// least usage per weight at that moment, so afterwards no team that got one is more than one device
    /// ahead of any other: (u_a − 1) / w_a ≤ u_b / w_b.
    #[test]
    fn idle_capacity_is_divided_by_weighted_max_min(
        weights in prop::collection::vec(0u32..5, 2..6),
        held in prop::collection::vec(0u32..6, 2..6),
        free in 1u32..40,
    ) {
        let mut view = ClusterView::default();
        let busy: u32 = held.iter().take(weights.len()).sum();
        view.nodes.push(Node {
            id: node(0),
            devices: (0..free + busy).map(|index| NodeDevice { index, kind: DeviceKind::Gpu }).collect(),
        });
        let mut next_busy = 0;
        for (t, &weight) in weights.iter().enumerate() {
            view.teams.push(Team { id: team(t as u128), guarantee: Default::default(), weight });
            let h = held.get(t).copied().unwrap_or(0);
            if h > 0 {
                view.running.push(RunningJob {
                    id: job(1000 + t as u128),
                    team: team(t as u128),
                    priority: 0,
                    kind: DeviceKind::Gpu,
                    devices: (next_busy..next_busy + h).map(|index| DeviceSlot { node: node(0), index }).collect(),
                    started: 0,
                    preemptible: true,
                    preempting: false,
    grow_to: Vec::new(),
                });
                next_busy += h;
            }
            for j in 0..40 {
                view.queued.push(QueuedJob {
                    id: job(100 * t as u128 + j),
                    team: team(t as u128),
                    priority: 0,
                    kind: DeviceKind::Gpu,
                    devices: 1,
                    submit_seq: j as u64,
    larger: Vec::new(),
    node_group: 1,
                });
            }
        }
        let plan = ringtrain_scheduler::plan(&view);
        prop_assert_eq!(plan.starts.len() as u32, free, "every idle device is given out");
        let usage_after = |t: usize| {
            usage(&view, team(t as u128), DeviceKind::Gpu)
                + plan.starts.iter().filter(|s| s.team == team(t as u128)).count() as u32
        };
        for a in 0..weights.len() {
            let got = plan.starts.iter().any(|s| s.team == team(a as u128));
            for b in 0..weights.len() {
                let (wa, wb) = (u64::from(weights[a].max(1)), u64::from(weights[b].max(1)));
                let (ua, ub) = (u64::from(usage_after(a)), u64::from(usage_after(b)));
                if got {
                    prop_assert!((ua - 1) * wb <= ub * wa, "team {} ({}/{}) vs team {} ({}/{})", a, ua, wa, b, ub, wb);
                }
            }
        }
    }
}
