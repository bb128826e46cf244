//! Why a job waits: one cluster per reason the policy gives, with the job's place in the queue and the
//! reason's numbers, and the thrash protection (a reclaim waits for its victims' minimum run time).

mod support;

use ringtrain_core::JobId;
use ringtrain_scheduler::{DeviceKind, Plan, Victim, WaitReason, Waiting};
use support::*;

const GPU: DeviceKind = DeviceKind::Gpu;

fn waiting(plan: &Plan, j: u128) -> Waiting {
    plan.waiting.iter().find(|w| w.job == job(j)).cloned().unwrap_or_else(|| panic!("job {j} not waiting: {plan:?}"))
}

/// (job, expected position, expected reason) for every job of a plan that did not start.
type Expected = (u128, Option<u32>, WaitReason);

fn assert_waiting(plan: &Plan, expected: &[Expected]) {
    for (j, position, reason) in expected {
        let got = waiting(plan, *j);
        assert_eq!((got.position, &got.reason), (*position, reason), "job {j}: {plan:#?}");
        assert!(!reason.to_string().is_empty());
    }
    assert_eq!(plan.waiting.len(), expected.len(), "{plan:#?}");
}

#[test]
fn the_first_job_in_line_holds_devices_and_the_ones_behind_say_why() {
    // 4 GPUs, job 10 holds 3 of them: 1 free
    let plan = Cluster::new()
        .team(1, 0, 0, 1)
        .node(1, 4, 0)
        .run(10, 1, &[(1, 0), (1, 1), (1, 2)])
        .queue(1, 1, 2) // does not fit: first in line, holds the free device, awaits job 10
        .queue(2, 1, 2) // would not fit even on the held device
        .queue(3, 1, 1) // would fit on the held device
        .plan();
    assert_waiting(
        &plan,
        &[
            (1, Some(1), WaitReason::HeadOfLine { kind: GPU, needed: 2, held: 1, awaiting_jobs: vec![job(10)] }),
            (
                2,
                Some(2),
                WaitReason::WaitingForDevices { kind: GPU, needed: 2, free_now: 0, free_within_team_guarantee: 0 },
            ),
            (3, Some(3), WaitReason::HeadOfLineReserved { kind: GPU, needed: 1, free_now: 0, for_job: job(1) }),
        ],
    );
}

#[test]
fn a_team_at_its_guarantee_on_a_full_pool_may_only_borrow_what_is_idle() {
    let plan = Cluster::new()
        .team(1, 2, 0, 1)
        .team(2, 2, 0, 1)
        .node(1, 4, 0)
        .run(10, 1, &[(1, 0), (1, 1)])
        .run(11, 2, &[(1, 2), (1, 3)])
        .queue(1, 1, 1) // first in line: awaits the lowest busy device (job 10's)
        .queue(2, 1, 1)
        .plan();
    assert_waiting(
        &plan,
        &[
            (1, Some(1), WaitReason::HeadOfLine { kind: GPU, needed: 1, held: 0, awaiting_jobs: vec![job(10)] }),
            (
                2,
                Some(2),
                WaitReason::TeamAtGuaranteePoolFull { kind: GPU, needed: 1, used: 2, guarantee: 2, free_now: 0 },
            ),
        ],
    );
}

#[test]
fn a_reclaim_names_its_victims_and_jobs_behind_its_held_devices_say_so() {
    // team 1 is guaranteed 2 and holds nothing; team 2 (no guarantee) borrows 3 GPUs in two jobs: the
    // reclaim takes job 11 (1 device, the lower priority) and holds the free device
    let plan = Cluster::new()
        .team(1, 2, 0, 1)
        .team(2, 0, 0, 1)
        .node(1, 4, 0)
        .run(11, 2, &[(1, 0)])
        .run_full(12, 2, &[(1, 1), (1, 2)], 5, true, false)
        .queue(1, 1, 2)
        .queue(2, 2, 1) // first in line of the rest: awaits job 12
        .queue(3, 2, 1) // would fit on the device held for the reclaim
        .plan();
    assert_eq!(preempted(&plan), vec![job(11)]);
    assert_waiting(
        &plan,
        &[
            (
                1,
                Some(1),
                WaitReason::Reclaiming {
                    kind: GPU,
                    needed: 2,
                    victims: vec![Victim { job: job(11), team: team(2) }],
                    stopping_devices: 0,
                },
            ),
            (2, Some(2), WaitReason::HeadOfLine { kind: GPU, needed: 1, held: 0, awaiting_jobs: vec![job(12)] }),
            (
                3,
                Some(3),
                WaitReason::BehindReservation {
                    kind: GPU,
                    needed: 1,
                    free_now: 0,
                    job: job(1),
                    nodes: vec![node(1)].into(),
                },
            ),
        ],
    );
}

#[test]
fn a_reclaim_waits_for_the_minimum_run_time_and_then_preempts() {
    let cluster = |protected: bool| {
        Cluster::new()
            .team(1, 2, 0, 1)
            .team(2, 0, 0, 1)
            .node(1, 4, 0)
            .run_full(11, 2, &[(1, 0), (1, 1), (1, 2), (1, 3)], 0, !protected, false)
            .queue(1, 1, 2)
    };
    let plan = cluster(true).plan();
    assert!(plan.preemptions.is_empty(), "a job within its minimum run time is not preempted: {plan:?}");
    assert_waiting(
        &plan,
        &[(1, Some(1), WaitReason::ReclaimAfterMinRunTime { kind: GPU, needed: 2, protected_jobs: vec![job(11)] })],
    );
    let plan = cluster(false).plan();
    assert_eq!(preempted(&plan), vec![job(11)], "once it has run long enough, the reclaim goes ahead");
}

#[test]
fn jobs_the_pool_cannot_place_have_no_place_in_the_queue() {
    let plan = Cluster::new()
        .team(1, 0, 0, 1)
        .node(1, 4, 0)
        .queue(1, 1, 5)
        .queue_full(2, 1, 1, DeviceKind::Cpu, 0)
        .queue(3, 1, 4)
        .plan();
    assert_eq!(started(&plan), vec![job(3)]);
    assert_waiting(
        &plan,
        &[
            (1, None, WaitReason::TooLarge { kind: GPU, needed: 5, pool_size: 4 }),
            (2, None, WaitReason::NoDevicesOfKind { kind: DeviceKind::Cpu, needed: 1 }),
        ],
    );
}

#[test]
fn every_reason_has_a_code_and_a_sentence() {
    let id = JobId(uuid::Uuid::nil());
    let reasons = [
        WaitReason::WaitingForDevices { kind: GPU, needed: 2, free_now: 1, free_within_team_guarantee: 0 },
        WaitReason::HeadOfLine { kind: GPU, needed: 2, held: 1, awaiting_jobs: vec![id] },
        WaitReason::HeadOfLineReserved { kind: GPU, needed: 1, free_now: 0, for_job: id },
        WaitReason::BehindReservation { kind: GPU, needed: 1, free_now: 0, job: id, nodes: vec![].into() },
        WaitReason::TeamAtGuaranteePoolFull { kind: GPU, needed: 1, used: 2, guarantee: 2, free_now: 0 },
        WaitReason::Reclaiming { kind: GPU, needed: 2, victims: vec![], stopping_devices: 2 },
        WaitReason::ReclaimAfterMinRunTime { kind: GPU, needed: 2, protected_jobs: vec![id] },
        WaitReason::TooLarge { kind: GPU, needed: 5, pool_size: 4 },
        WaitReason::WorkerLargerThanNodes { kind: GPU, needed: 4, per_worker: 2, largest_node: 1, workers_fit: 0 },
        WaitReason::WaitingForNodeRoom { kind: GPU, needed: 4, per_worker: 2, free_now: 4, workers_fit: 1 },
        WaitReason::NoDevicesOfKind { kind: GPU, needed: 1 },
        WaitReason::PreviousPlacementStopping,
        WaitReason::BeyondQueueWindow { window: 1000 },
        WaitReason::StartingNextPass,
        WaitReason::BudgetExhausted {
            used_device_seconds: 40_000,
            budget_device_seconds: 36_000,
            period: "week".into(),
            resets_at: chrono::DateTime::UNIX_EPOCH,
        },
    ];
    let codes: Vec<&str> = reasons.iter().map(WaitReason::code).collect();
    assert_eq!(codes, WaitReason::CODES);
    for reason in &reasons {
        let json = serde_json::to_value(reason).unwrap();
        assert_eq!(json["code"], reason.code(), "the serialized code is the code");
        assert!(reason.to_string().len() > 20, "{reason:?} has a sentence");
    }
}

/// A job whose workers span 2 devices each (pipeline stages) is placed with each worker's devices on one
/// node; when the free devices do not make whole workers it waits saying so, and when no node could ever
/// hold a worker it is unplaceable saying so.
#[test]
fn a_workers_pipeline_stages_share_a_node_or_the_job_says_why_it_waits() {
    let grouped = |cluster: Cluster, j: u128, k: u32| {
        let mut cluster = cluster.queue(j, 1, k);
        cluster.view.queued.last_mut().unwrap().node_group = 2;
        cluster
    };
    // two nodes of 3 GPUs: 2 workers of 2 stages, one worker per node, the ranks of a worker side by side
    let plan = grouped(Cluster::new().team(1, 0, 0, 1).node(1, 3, 0).node(2, 3, 0), 20, 4).plan();
    assert_eq!(started(&plan), vec![job(20)]);
    let devices = &plan.starts[0].devices;
    assert_eq!(devices.len(), 4);
    for worker in devices.chunks(2) {
        assert_eq!(worker[0].node, worker[1].node, "a worker's stages on one node: {devices:?}");
    }

    // 4 GPUs free, one on each node: no worker fits now. The first in line keeps two nodes' free devices for
    // its 2 workers (whole nodes, awaiting job 10 there); the next says the free devices make no worker
    let busy = Cluster::new().team(1, 0, 0, 1).node(1, 2, 0).node(2, 2, 0).node(3, 2, 0).node(4, 2, 0);
    let busy = busy.run(10, 1, &[(1, 0), (2, 0), (3, 0), (4, 0)]);
    let plan = grouped(grouped(busy, 20, 4), 21, 2).plan();
    assert!(started(&plan).is_empty(), "{plan:#?}");
    assert_eq!(
        waiting(&plan, 20).reason,
        WaitReason::HeadOfLine { kind: GPU, needed: 4, held: 2, awaiting_jobs: vec![job(10)] }
    );
    let held = &plan.reservations[0];
    let mut nodes: Vec<_> = held.held.iter().chain(&held.awaiting).map(|d| d.node).collect();
    nodes.sort();
    assert_eq!(nodes, vec![node(1), node(1), node(2), node(2)], "whole workers on nodes: {held:?}");
    let reason = waiting(&plan, 21).reason;
    assert_eq!(
        reason,
        WaitReason::WaitingForNodeRoom { kind: GPU, needed: 2, per_worker: 2, free_now: 2, workers_fit: 0 }
    );
    assert_eq!(
        reason.to_string(),
        "needs 2 gpu devices, as 1 worker of 2 devices on one node (each worker's pipeline stages); 2 are free, \
         but they make no such worker"
    );

    // nodes of one GPU each never hold a worker of 2: unplaceable, said at once
    let plan = grouped(Cluster::new().team(1, 0, 0, 1).node(1, 1, 0).node(2, 1, 0).node(3, 1, 0), 20, 2).plan();
    assert_waiting(
        &plan,
        &[(
            20,
            None,
            WaitReason::WorkerLargerThanNodes { kind: GPU, needed: 2, per_worker: 2, largest_node: 1, workers_fit: 0 },
        )],
    );
    assert_eq!(plan.too_large, vec![job(20)]);
}
