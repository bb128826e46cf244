//! Elastic jobs in the policy: an elastic job starts on the most of its allowed device counts that
//! fit; it grows onto idle devices nobody waits for; and when a team reclaims its guarantee, a borrowing
//! elastic job is stopped at a checkpoint and comes back on fewer devices: never below its smallest count,
//! and never on devices the reclaimer needs (a proptest over pools, guarantees and ranges).

mod support;

use proptest::prelude::*;
use ringtrain_scheduler::{ClusterView, DeviceKind, PreemptReason, QueuedJob, RunningJob};
use support::{job, slot, started, team, Cluster};

/// The counts of a `workers`-worker job within [min, max]: the divisors of workers there, ascending.
fn allowed(workers: u32, min: u32, max: u32) -> Vec<u32> {
    (min.max(1)..=max.min(workers)).filter(|c| workers % c == 0).collect()
}

fn elastic(j: u128, t: u128, counts: &[u32], submit_seq: u64) -> QueuedJob {
    QueuedJob {
        id: job(j),
        team: team(t),
        priority: 0,
        kind: DeviceKind::Gpu,
        devices: counts[0],
        submit_seq,
        larger: counts[1..].to_vec(),
        node_group: 1,
    }
}

#[test]
fn an_elastic_job_starts_on_the_most_of_its_counts_that_fit() {
    // 3 GPUs free; an 8-worker job may run on 1, 2, 4 or 8 of them: 2
    let mut cluster = Cluster::new().team(1, 0, 0, 1).node(1, 3, 0);
    cluster.view.queued.push(elastic(1, 1, &allowed(8, 1, 8), 1));
    let plan = cluster.plan();
    assert_eq!(started(&plan), [job(1)]);
    assert_eq!(plan.starts[0].devices.len(), 2, "{plan:?}");
    // below its smallest count it waits, like any job
    let mut small = Cluster::new().team(1, 0, 0, 1).node(1, 3, 0);
    small.view.queued.push(elastic(2, 1, &allowed(8, 4, 8), 1));
    assert!(small.plan().starts.is_empty());
}

#[test]
fn within_its_guarantee_an_elastic_job_starts_on_its_share_and_takes_what_nobody_else_wants() {
    // team 1 is guaranteed 2 of 4 GPUs, team 2 the other 2 and wants them: 2 each
    let shared = || {
        let mut cluster = Cluster::new().team(1, 2, 0, 1).team(2, 2, 0, 1).node(1, 4, 0);
        cluster.view.queued.push(elastic(1, 1, &allowed(4, 1, 4), 1));
        cluster
    };
    let plan = shared().queue(2, 2, 2).plan();
    let on =
        |plan: &ringtrain_scheduler::Plan, j| plan.starts.iter().find(|s| s.job == job(j)).map(|s| s.devices.len());
    assert_eq!((on(&plan, 1), on(&plan, 2)), (Some(2), Some(2)), "{plan:?}");
    // alone, it takes all 4, 2 of them borrowed
    let alone = shared().plan();
    assert_eq!(on(&alone, 1), Some(4), "{alone:?}");
    assert_eq!(alone.starts[0].borrowed, 2);
}

fn running_elastic(j: u128, t: u128, devices: &[(u128, u32)], grow_to: Vec<u32>) -> RunningJob {
    RunningJob {
        id: job(j),
        team: team(t),
        priority: 0,
        kind: DeviceKind::Gpu,
        devices: devices.iter().map(|&(n, i)| slot(n, i)).collect(),
        started: j as u64,
        preemptible: true,
        preempting: false,
        grow_to,
    }
}

#[test]
fn an_elastic_job_grows_onto_idle_devices_only_when_nobody_waits_for_them() {
    let idle = || {
        let mut cluster = Cluster::new().team(1, 0, 0, 1).team(2, 0, 0, 1).node(1, 4, 0);
        cluster.view.running.push(running_elastic(1, 1, &[(1, 0), (1, 1)], vec![4, 8]));
        cluster
    };
    // 2 idle GPUs: from 2 to 4 (8 would need 6 more)
    let plan = idle().plan();
    assert_eq!(plan.preemptions.len(), 1, "{plan:?}");
    assert_eq!(plan.preemptions[0].reason, PreemptReason::Grow { from: 2, to: 4 });
    assert_eq!(
        plan.preemptions[0].reason.to_string(),
        "growing from 2 to 4 devices onto idle ones (a stop at a checkpoint, then a start)"
    );
    // a job that starts on them takes them first
    let taken = idle().queue(2, 2, 2).plan();
    assert_eq!(started(&taken), [job(2)]);
    assert!(taken.preemptions.is_empty(), "{taken:?}");
    // and one that waits (for 3) keeps the job from growing onto devices it may soon need
    let waiting = idle().queue(3, 2, 3).plan();
    assert!(waiting.preemptions.is_empty() && waiting.starts.is_empty(), "{waiting:?}");
    // not before the grow interval (the loop leaves grow_to empty)
    let mut young = Cluster::new().team(1, 0, 0, 1).node(1, 4, 0);
    young.view.running.push(running_elastic(1, 1, &[(1, 0), (1, 1)], Vec::new()));
    assert!(young.plan().preemptions.is_empty());
}

/// After a pass's preemptions have stopped: the preempted jobs queued again (ahead of others, with their
/// seq), their devices free.
fn after_stops(view: &ClusterView, plan: &ringtrain_scheduler::Plan, requeued: &[QueuedJob]) -> ClusterView {
    let stopped: Vec<_> = plan.preemptions.iter().map(|p| p.job).collect();
    let mut next = view.clone();
    next.running.retain(|r| !stopped.contains(&r.id));
    next.queued.extend(requeued.iter().filter(|q| stopped.contains(&q.id)).cloned());
    next
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A team below its guarantee reclaims GPUs a borrowing elastic job holds. The claimer starts on all it
    /// asked for once the borrower has stopped; the borrower comes back on the most of its counts that the
    /// rest of the pool holds, never below its smallest (it waits instead), never on the claimer's devices.
    #[test]
    fn a_reclaim_shrinks_an_elastic_borrower_but_never_below_its_min(
        pool in 1u32..=16,
        workers_pow in 0u32..=4,
        min_pick in 0usize..8,
        claim_pick in 0u32..16,
        guarantee_pick in 0u32..16,
    ) {
        let workers = 1u32 << workers_pow; // 1 to 16: every power of two below divides it
        let divisors = allowed(workers, 1, workers);
        let counts = allowed(workers, divisors[min_pick % divisors.len()], workers);
        let pool = pool.max(counts[0]);
        // the borrower (team 1, no guarantee) holds as many as it may of the pool
        let held = counts.iter().rev().copied().find(|&c| c <= pool).unwrap();
        // the owner (team 2) claims more than the pool has free, within its guarantee
        let claim = pool - held + 1 + claim_pick % held;
        let owner_guarantee = claim + guarantee_pick % (pool - claim + 1);
        let mut cluster = Cluster::new().team(1, 0, 0, 1).team(2, owner_guarantee, 0, 1).node(1, pool, 0);
        let devices: Vec<(u128, u32)> = (0..held).map(|i| (1, i)).collect();
        cluster.view.running.push(running_elastic(1, 1, &devices, Vec::new()));
        cluster = cluster.queue(2, 2, claim);
        let first = cluster.plan();
        prop_assert_eq!(first.preemptions.len(), 1, "the borrower is stopped: {:?}", first);
        prop_assert!(first.starts.is_empty());

        let requeued = elastic(1, 1, &counts, 0);
        let second = ringtrain_scheduler::plan(&after_stops(&cluster.view, &first, &[requeued]));
        let claimer = second.starts.iter().find(|s| s.job == job(2));
        prop_assert!(claimer.is_some_and(|s| s.devices.len() as u32 == claim), "the claimer starts on {}: {:?}", claim, second);
        let left = pool - claim;
        let back = counts.iter().rev().copied().find(|&c| c <= left);
        match second.starts.iter().find(|s| s.job == job(1)) {
            Some(borrower) => {
                let on = borrower.devices.len() as u32;
                prop_assert!(counts.contains(&on) && on >= counts[0], "back on {} of {:?}", on, counts);
                prop_assert_eq!(Some(on), back, "on the most that the rest holds");
                let claimed = &claimer.unwrap().devices;
                prop_assert!(borrower.devices.iter().all(|d| !claimed.contains(d)));
            }
            None => prop_assert!(back.is_none(), "it waits only when no count fits in {}: {:?}", left, second),
        }
    }
}
