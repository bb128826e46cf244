//! The properties every plan must have, checked against the view it was made from (used by the proptests
//! and the simulation).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use ringtrain_core::JobId;
use ringtrain_scheduler::{ClusterView, DeviceKind, DeviceSlot, Plan, QueuedJob, ReservationKind, RunningJob, TeamId};

const KINDS: [DeviceKind; 2] = [DeviceKind::Gpu, DeviceKind::Cpu];

/// `DeviceKind` is not `Ord`; maps key on its position in `KINDS`.
fn ki(kind: DeviceKind) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap_or(0)
}

pub fn guarantee(view: &ClusterView, t: TeamId, kind: DeviceKind) -> u32 {
    view.teams.iter().find(|x| x.id == t).map_or(0, |x| x.guarantee.get(kind))
}

/// Devices a team holds at the start of the pass, not counting jobs already being preempted.
pub fn usage(view: &ClusterView, t: TeamId, kind: DeviceKind) -> u32 {
    view.running.iter().filter(|r| r.team == t && r.kind == kind && !r.preempting).map(|r| r.devices.len() as u32).sum()
}

pub fn check(view: &ClusterView, plan: &Plan) -> Result<(), TestCaseError> {
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
        // every queued job not started waits exactly once, with its place: 1..n in order, none for jobs the
        // pool cannot place
        let mut positions: Vec<u32> = Vec::new();
        for q in
            view.queued.iter().filter(|q| q.kind == kind && q.devices > 0 && !plan.starts.iter().any(|s| s.job == q.id))
        {
            let waits: Vec<_> = plan.waiting.iter().filter(|w| w.job == q.id).collect();
            prop_assert_eq!(waits.len(), 1, "job {} waits once", q.id);
            prop_assert_eq!(waits[0].position.is_none(), plan.too_large.contains(&q.id));
            positions.extend(waits[0].position);
        }
        positions.sort_unstable();
        prop_assert_eq!(positions.clone(), (1..=positions.len() as u32).collect::<Vec<_>>());
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
