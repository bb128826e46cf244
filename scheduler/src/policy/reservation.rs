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
pub(crate) fn reserve_head_of_line(
    k: u32,
    kind: &mut KindIndex,
    claimed: &BTreeSet<Slot>,
) -> Option<(Vec<Slot>, Vec<Slot>)> {
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
