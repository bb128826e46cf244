//! One test per rule of the placement policy, each a small table of cluster views and expected decisions.

mod support;

use ringtrain_scheduler::{DeviceKind, PreemptReason, ReservationKind};
use support::*;

#[test]
fn gang_starts_all_k_devices_at_once_or_nothing() {
    // (free GPUs per node, k, starts?)
    let cases: &[(&[u32], u32, bool)] = &[
        (&[4], 4, true),
        (&[4], 5, false),
        (&[2, 2], 4, true), // across nodes when no single node has k
        (&[2, 2], 5, false),
        (&[3, 3, 3], 9, true),
    ];
    for &(free, k, starts) in cases {
        let mut cluster = Cluster::new().team(1, 0, 0, 1).queue(1, 1, k);
        for (n, &gpus) in free.iter().enumerate() {
            cluster = cluster.node(n as u128, gpus, 0);
        }
        let plan = cluster.plan();
        assert_eq!(!plan.starts.is_empty(), starts, "free {free:?} k {k}: {plan:?}");
        if starts {
            assert_eq!(plan.starts[0].devices.len(), k as usize);
        }
        assert!(plan.too_large.is_empty() == starts, "a job larger than the pool is reported: {plan:?}");
    }
}

#[test]
fn a_job_gets_only_devices_of_its_kind() {
    // node 1 has 4 GPUs and 4 CPU slots, node 2 only 4 CPU slots
    let cluster = Cluster::new()
        .team(1, 0, 0, 1)
        .node(1, 4, 4)
        .node(2, 0, 4)
        .queue_full(1, 1, 6, DeviceKind::Cpu, 0)
        .queue_full(2, 1, 4, DeviceKind::Gpu, 0)
        .queue_full(3, 1, 1, DeviceKind::Gpu, 0); // no GPU left, and CPU slots are free: must still wait
    let plan = cluster.plan();
    assert_eq!(started(&plan), vec![job(2), job(1)], "GPUs are planned first: {plan:?}");
    let cpu_job = plan.starts.iter().find(|s| s.job == job(1)).unwrap();
    assert!(cpu_job.devices.iter().all(|d| d == &slot(2, d.index) || (d.node == node(1) && d.index >= 4)));
    let gpu_job = plan.starts.iter().find(|s| s.job == job(2)).unwrap();
    assert_eq!(gpu_job.devices, (0..4).map(|i| slot(1, i)).collect::<Vec<_>>());
    // a CPU job larger than all CPU slots is too large even though GPUs are idle
    let plan = Cluster::new().team(1, 0, 0, 1).node(1, 8, 2).queue_full(9, 1, 3, DeviceKind::Cpu, 0).plan();
    assert!(plan.starts.is_empty());
    assert_eq!(plan.too_large, vec![job(9)]);
}

#[test]
fn placement_prefers_one_node_then_best_fit_then_fewest_nodes() {
    // nodes 1..=3 with 4, 8 and 6 free GPUs; (k, expected nodes)
    let cases: &[(u32, &[u128])] = &[
        (8, &[2]),     // the only node that holds it whole
        (6, &[3]),     // best fit: the 6, keeping the 8 whole
        (3, &[1]),     // best fit: the 4
        (12, &[2, 1]), // two nodes: the 8 whole and the rest on the smallest that holds 4
        (14, &[2, 3]),
        (18, &[1, 2, 3]),
    ];
    for &(k, expected) in cases {
        let plan = Cluster::new().team(1, 0, 0, 1).node(1, 4, 0).node(2, 8, 0).node(3, 6, 0).queue(1, 1, k).plan();
        let mut expected: Vec<_> = expected.iter().map(|&n| node(n)).collect();
        expected.sort();
        assert_eq!(nodes_of(&plan, 1), expected, "k {k}");
    }
    // ranks are ordered by node then index, so a node's ranks are neighbours in the ring
    let plan = Cluster::new().team(1, 0, 0, 1).node(1, 2, 0).node(2, 2, 0).queue(1, 1, 4).plan();
    assert_eq!(plan.starts[0].devices, vec![slot(1, 0), slot(1, 1), slot(2, 0), slot(2, 1)]);
}

#[test]
fn idle_capacity_is_borrowed_beyond_the_guarantee_and_counted() {
    // team 1 is guaranteed 4 of 8 GPUs; team 2 (guarantee 4) has nothing queued, so team 1 borrows
    let plan = Cluster::new()
        .team(1, 4, 0, 1)
        .team(2, 4, 0, 1)
        .node(1, 8, 0)
        .run(10, 1, &[(1, 0)])
        .queue(1, 1, 2)
        .queue(2, 1, 2)
        .queue(3, 1, 2)
        .queue(4, 1, 2) // only 1 device left
        .plan();
    assert_eq!(started(&plan), vec![job(1), job(2), job(3)]);
    let borrowed: Vec<u32> = plan.starts.iter().map(|s| s.borrowed).collect();
    assert_eq!(borrowed, vec![0, 1, 2], "usage 1 → 3 → 5 → 7 against a guarantee of 4");
    assert!(plan.preemptions.is_empty(), "team 2 has no waiting job, so nothing is reclaimed");
}

#[test]
fn teams_are_served_by_weighted_fair_share_and_guarantees_first() {
    // no guarantees: idle capacity divides by weight (team 2 has three times team 1's weight)
    let mut cluster = Cluster::new().team(1, 0, 0, 1).team(2, 0, 0, 3).node(1, 8, 0);
    for j in 0..8 {
        cluster = cluster.queue(j, 1, 1).queue(100 + j, 2, 1);
    }
    let plan = cluster.plan();
    let by_team = |t| plan.starts.iter().filter(|s| s.team == team(t)).count();
    assert_eq!((by_team(1), by_team(2)), (2, 6), "{plan:?}");

    // a team below its guarantee is served before borrowers, whatever the submission order
    let plan = Cluster::new()
        .team(1, 0, 0, 1)
        .team(2, 2, 0, 1)
        .node(1, 2, 0)
        .queue(1, 1, 1)
        .queue(2, 1, 1)
        .queue(3, 2, 1)
        .queue(4, 2, 1)
        .plan();
    assert_eq!(started(&plan), vec![job(3), job(4)]);

    // among teams below their guarantees, the one holding the smallest fraction of it first
    let plan = Cluster::new()
        .team(1, 4, 0, 1)
        .team(2, 4, 0, 1)
        .node(1, 8, 0)
        .run(10, 1, &[(1, 0), (1, 1), (1, 2)])
        .run(11, 2, &[(1, 3)])
        .queue(1, 1, 1)
        .queue(2, 2, 1)
        .queue(3, 2, 1)
        .plan();
    assert_eq!(started(&plan), vec![job(2), job(3), job(1)], "team 2 at 1/4 then 2/4, team 1 at 3/4");
}

#[test]
fn priority_orders_jobs_within_a_team_then_submission() {
    // (jobs as (id, priority), expected first start) on one free GPU
    let cases: &[(&[(u128, i32)], u128)] = &[
        (&[(1, 0), (2, 5)], 2), // higher priority first though submitted later
        (&[(1, 3), (2, 3)], 1), // equal priority: earlier submission
        (&[(1, -1), (2, 0), (3, -5)], 2),
    ];
    for &(jobs, first) in cases {
        let mut cluster = Cluster::new().team(1, 0, 0, 1).node(1, 1, 0);
        for &(j, priority) in jobs {
            cluster = cluster.queue_full(j, 1, 1, DeviceKind::Gpu, priority);
        }
        assert_eq!(started(&cluster.plan()), vec![job(first)], "{jobs:?}");
    }
    // priority does not cross teams: team 2's urgent job waits for its team's turn
    let plan = Cluster::new()
        .team(1, 1, 0, 1)
        .team(2, 0, 0, 1)
        .node(1, 1, 0)
        .queue_full(1, 1, 1, DeviceKind::Gpu, 0)
        .queue_full(2, 2, 1, DeviceKind::Gpu, 100)
        .plan();
    assert_eq!(started(&plan), vec![job(1)]);
}

/// 8 GPUs on one node; team 2 (guarantee 4) holds all of them as four 2-GPU jobs (ids 21..=24, started in
/// that order, priorities given), so it borrows 4; team 1 (guarantee 4) waits with a job of `k`.
fn borrowed_pool(k: u32, priorities: [i32; 4]) -> Cluster {
    let mut cluster = Cluster::new().team(1, 4, 0, 1).team(2, 4, 0, 1).node(1, 8, 0).queue(1, 1, k);
    for (i, priority) in priorities.into_iter().enumerate() {
        let index = 2 * i as u32;
        cluster = cluster.run_full(21 + i as u128, 2, &[(1, index), (1, index + 1)], priority, true, false);
    }
    cluster
}

#[test]
fn reclaim_preempts_a_minimal_set_of_borrowers() {
    // (k, victims' priorities, expected victims)
    let cases: &[(u32, [i32; 4], &[u128])] = &[
        (2, [0, 0, 0, 0], &[24]), // equal priority: the most recent start
        (4, [0, 0, 0, 0], &[23, 24]),
        (2, [0, -1, 0, 0], &[22]), // lowest priority first
        (4, [5, 0, 5, -2], &[22, 24]),
        (1, [0, 0, 0, 0], &[24]), // a whole gang job goes even when one device is needed
    ];
    for &(k, priorities, expected) in cases {
        let plan = borrowed_pool(k, priorities).plan();
        let expected: Vec<_> = expected.iter().map(|&j| job(j)).collect();
        assert_eq!(preempted(&plan), expected, "k {k} priorities {priorities:?}");
        assert!(plan.starts.is_empty(), "the devices free only after the victims checkpoint");
        for p in &plan.preemptions {
            assert_eq!(p.reason, PreemptReason::Reclaim { team: team(1), for_job: job(1) });
        }
        let reservation = &plan.reservations[0];
        assert_eq!((reservation.job, reservation.kind), (job(1), ReservationKind::Reclaim));
        assert_eq!(reservation.held.len() + reservation.awaiting.len(), k as usize);
    }
}

#[test]
fn reclaim_takes_only_borrowed_devices() {
    // a job beyond team 1's guarantee may not preempt anyone: it waits like any borrower
    assert!(borrowed_pool(6, [0; 4]).plan().preemptions.is_empty());
    // team 2 at exactly its guarantee is not a victim
    let plan = Cluster::new()
        .team(1, 4, 0, 1)
        .team(2, 4, 0, 1)
        .node(1, 4, 0)
        .run(21, 2, &[(1, 0), (1, 1), (1, 2), (1, 3)])
        .queue(1, 1, 2)
        .plan();
    assert!(plan.preemptions.is_empty(), "{plan:?}");
    // only team 3 borrows; team 2 (within its guarantee) is spared even though its job is more recent
    let plan = Cluster::new()
        .team(1, 2, 0, 1)
        .team(2, 4, 0, 1)
        .team(3, 0, 0, 1)
        .node(1, 6, 0)
        .run(31, 3, &[(1, 0), (1, 1)])
        .run(21, 2, &[(1, 2), (1, 3), (1, 4), (1, 5)])
        .queue(1, 1, 2)
        .plan();
    assert_eq!(preempted(&plan), vec![job(31)]);
    // a job that fits in its own guarantee does not preempt when free devices suffice
    let plan = borrowed_pool(2, [0; 4]).node(2, 2, 0).plan();
    assert!(plan.preemptions.is_empty());
    assert_eq!(nodes_of(&plan, 1), vec![node(2)]);
    // non-preemptible borrowers are never chosen: the other borrower goes
    let plan = Cluster::new()
        .team(1, 2, 0, 1)
        .team(2, 0, 0, 1)
        .node(1, 4, 0)
        .run_full(21, 2, &[(1, 0), (1, 1)], 0, false, false)
        .run_full(22, 2, &[(1, 2), (1, 3)], 0, true, false)
        .queue(1, 1, 2)
        .plan();
    assert_eq!(preempted(&plan), vec![job(22)]);
}

#[test]
fn a_borrower_partly_within_its_guarantee_goes_only_when_nothing_smaller_frees_enough() {
    // team 2 (guarantee 3) runs a 4-GPU job and two 1-GPU jobs: usage 6, 3 borrowed
    let cluster = Cluster::new()
        .team(1, 3, 0, 1)
        .team(2, 3, 0, 1)
        .node(1, 6, 0)
        .run(21, 2, &[(1, 0), (1, 1), (1, 2), (1, 3)])
        .run(22, 2, &[(1, 4)])
        .run(23, 2, &[(1, 5)]);
    // 2 devices: the two small jobs, leaving team 2 within its guarantee; the big one would cut into it
    assert_eq!(preempted(&cluster.clone().queue(1, 1, 2).plan()), vec![job(22), job(23)]);
    // 3 devices: the small ones are not enough, and once the big one is taken they are not needed
    assert_eq!(preempted(&cluster.queue(1, 1, 3).plan()), vec![job(21)]);
}

#[test]
fn jobs_already_being_preempted_are_counted_not_preempted_again() {
    // the previous pass preempted jobs 23 and 24 for team 1's job; they are still checkpointing
    let mut cluster = borrowed_pool(4, [0; 4]);
    for r in &mut cluster.view.running {
        if r.id == job(23) || r.id == job(24) {
            r.preempting = true;
        }
    }
    let plan = cluster.plan();
    assert!(plan.preemptions.is_empty(), "{plan:?}");
    assert_eq!(plan.reservations.len(), 1);
    let mut awaiting = plan.reservations[0].awaiting.clone();
    awaiting.sort();
    assert_eq!(awaiting, (4..8).map(|i| slot(1, i)).collect::<Vec<_>>());
}

#[test]
fn a_large_job_is_not_starved_by_small_ones() {
    // node 1: 8 GPUs, 6 busy; node 2: 2 free GPUs. The 8-GPU job waits for node 1; small jobs backfill node 2.
    let cluster = Cluster::new()
        .team(1, 0, 0, 1)
        .node(1, 8, 0)
        .node(2, 2, 0)
        .run(20, 1, &[(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)])
        .queue(1, 1, 8)
        .queue(2, 1, 1)
        .queue(3, 1, 1)
        .queue(4, 1, 1);
    let plan = cluster.plan();
    assert_eq!(plan.reservations.len(), 1);
    let reservation = &plan.reservations[0];
    assert_eq!((reservation.job, reservation.kind), (job(1), ReservationKind::HeadOfLine));
    assert_eq!(reservation.held, vec![slot(1, 6), slot(1, 7)], "node 1's free GPUs stay idle");
    assert_eq!(reservation.awaiting.len(), 6);
    assert_eq!(started(&plan), vec![job(2), job(3)], "backfill only outside the reservation");
    assert!(plan.starts.iter().all(|s| s.devices.iter().all(|d| d.node == node(2))));

    // once the running job ends, the large job starts whole on node 1, ahead of the small ones
    let mut later = cluster.clone();
    later.view.running.clear();
    let plan = later.plan();
    assert_eq!(plan.starts[0].job, job(1));
    assert_eq!(nodes_of(&plan, 1), vec![node(1)]);

    // without a reservation there would be nothing to stop this: every free device is held for the head job
    let plan = Cluster::new()
        .team(1, 0, 0, 1)
        .node(1, 4, 0)
        .run(20, 1, &[(1, 0), (1, 1)])
        .queue(1, 1, 4)
        .queue(2, 1, 1)
        .plan();
    assert!(plan.starts.is_empty(), "{plan:?}");
    assert_eq!(plan.reservations[0].held, vec![slot(1, 2), slot(1, 3)]);
}

#[test]
fn the_reservation_goes_to_the_first_blocked_job_in_fair_order_only() {
    // team 1 borrows 5 GPUs and team 2 none, so team 2's 4-GPU job is the head of line although team 1's
    // came first; team 1's 1-GPU job backfills outside the reservation
    let plan = Cluster::new()
        .team(1, 0, 0, 1)
        .team(2, 0, 0, 1)
        .node(1, 4, 0)
        .node(2, 4, 0)
        .run(20, 1, &[(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)])
        .queue(1, 1, 4)
        .queue(2, 2, 4)
        .queue(3, 1, 1)
        .plan();
    assert_eq!(plan.reservations.len(), 1, "one head-of-line reservation per kind: {plan:?}");
    assert_eq!(plan.reservations[0].job, job(2));
    assert_eq!(plan.reservations[0].held, vec![slot(1, 2), slot(1, 3)]);
    assert_eq!(started(&plan), vec![job(3)]);
    assert_eq!(nodes_of(&plan, 3), vec![node(2)]);
}

#[test]
fn the_same_view_in_any_order_gives_the_same_plan() {
    let cluster = borrowed_pool(2, [0, 1, 0, 1])
        .team(3, 0, 0, 2)
        .node(2, 4, 4)
        .node(3, 2, 0)
        .queue(5, 3, 3)
        .queue(6, 3, 1)
        .queue_full(7, 2, 2, DeviceKind::Cpu, 0)
        .queue(8, 2, 9);
    let plan = cluster.plan();
    let mut reversed = cluster.clone();
    reversed.view.teams.reverse();
    reversed.view.nodes.reverse();
    reversed.view.queued.reverse();
    reversed.view.running.reverse();
    for node in &mut reversed.view.nodes {
        node.devices.reverse();
    }
    assert_eq!(reversed.plan(), plan);
    assert_eq!(cluster.plan(), plan);
}
