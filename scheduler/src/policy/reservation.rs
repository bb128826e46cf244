//! The head-of-line reservation: devices set aside for the first job of a kind, in fair-share order, that
//! could not start, so that a stream of smaller jobs cannot starve it.
//!
//! Durations are not modelled (a training job's run time is not known in advance), so backfill is by
//! *place*, not by time: the reservation picks nodes on which the job will fit once their running jobs end,
//! keeps their free devices idle (up to k), and smaller jobs may start only on devices outside it. Nothing
//! new starts on the reserved devices, so the job waits at most until the jobs already on them finish. The
//! policy is stateless, so the reservation is chosen again each pass; it prefers the nodes with the most free
//! devices, which are the ones it kept idle last time, so it only moves to nodes that are closer to fitting.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use crate::policy::index::KindIndex;
use crate::policy::placement::Slot;

/// Sets aside `k` devices for one job: `held` (free now, taken out of the pool) and `awaiting` (busy now,
/// not in `claimed`). `None`, and nothing taken, when fewer than `k` devices are left to reserve.
///
/// With a `group` above 1 (a job whose workers' pipeline stages must each share a node) a node counts only
/// for the whole groups it can hold, and gives that many devices.
pub(crate) fn reserve_head_of_line(
    k: u32,
    group: u32,
    kind: &mut KindIndex,
    claimed: &BTreeSet<Slot>,
) -> Option<(Vec<Slot>, Vec<Slot>)> {
    if group > 1 {
        return reserve_groups(k, group, kind, claimed);
    }
    let unclaimed_busy = |node: u32, kind: &KindIndex| {
        kind.busy[node as usize].iter().filter(|(index, _)| !claimed.contains(&(node, *index))).count() as u32
    };
    // (free, reservable, node) for every node that has any
    let mut nodes: Vec<(u32, u32, u32)> = (0..kind.busy.len() as u32)
        .map(|node| {
            let free = kind.pool.free_on(node);
            (free, free + unclaimed_busy(node, kind), node)
        })
        .filter(|&(_, reservable, _)| reservable > 0)
        .collect();
    nodes.sort_unstable_by_key(|&(free, reservable, node)| (Reverse(free), Reverse(reservable), node));

    let mut covered = 0u32;
    let mut chosen = Vec::new();
    for &(_, reservable, node) in &nodes {
        if covered >= k {
            break;
        }
        covered += reservable;
        chosen.push(node);
    }
    if covered < k {
        return None;
    }
    let mut held = Vec::new();
    let mut need = k;
    for &node in &chosen {
        need -= kind.pool.take_on_node(node, need, &mut held);
    }
    let mut awaiting = Vec::new();
    for &node in &chosen {
        for &(index, _) in &kind.busy[node as usize] {
            if need == 0 {
                break;
            }
            if !claimed.contains(&(node, index)) {
                awaiting.push((node, index));
                need -= 1;
            }
        }
    }
    held.sort_unstable();
    Some((held, awaiting))
}

/// [`reserve_head_of_line`] for groups of `group` devices that each lie on one node: the nodes with the
/// most free devices first, each giving its whole groups (free devices first, then busy ones).
fn reserve_groups(
    k: u32,
    group: u32,
    kind: &mut KindIndex,
    claimed: &BTreeSet<Slot>,
) -> Option<(Vec<Slot>, Vec<Slot>)> {
    let unclaimed_busy: Vec<Vec<u32>> = (0..kind.busy.len() as u32)
        .map(|node| {
            let busy = kind.busy[node as usize].iter().map(|&(index, _)| index);
            busy.filter(|index| !claimed.contains(&(node, *index))).collect()
        })
        .collect();
    // (free, whole groups it can hold, node)
    let mut nodes: Vec<(u32, u32, u32)> = (0..kind.busy.len() as u32)
        .map(|node| {
            let free = kind.pool.free_on(node);
            (free, (free + unclaimed_busy[node as usize].len() as u32) / group, node)
        })
        .filter(|&(_, groups, _)| groups > 0)
        .collect();
    nodes.sort_unstable_by_key(|&(free, groups, node)| (Reverse(free), Reverse(groups), node));
    let groups_needed = k / group;
    if nodes.iter().map(|&(_, groups, _)| u64::from(groups)).sum::<u64>() < u64::from(groups_needed) {
        return None;
    }
    let (mut held, mut awaiting) = (Vec::new(), Vec::new());
    let mut left = groups_needed;
    for &(_, groups, node) in &nodes {
        if left == 0 {
            break;
        }
        let mut need = groups.min(left) * group;
        left -= groups.min(left);
        need -= kind.pool.take_on_node(node, need, &mut held);
        awaiting.extend(unclaimed_busy[node as usize].iter().take(need as usize).map(|&index| (node, index)));
    }
    held.sort_unstable();
    Some((held, awaiting))
}
