//! Weighted fair share among teams, per device kind, and the order of jobs within a team.
//!
//! GPUs and CPU slots are separate pools and every job uses exactly one of them, so each pool is divided on
//! its own (weighted max-min on the part beyond guarantees; docs/ARCHITECTURE.md says why not DRF). A team's
//! standing in a pool is its [`ShareKey`]; the walk always serves the team with the smallest key next and
//! re-ranks it after each decision, which is progressive filling.

use std::cmp::{Ordering, Reverse};

use crate::policy::id_hash::UuidMap;
use crate::policy::types::{DeviceKind, JobId, PerKind, QueuedJob, RunningJob, Team, TeamId};

pub(crate) fn kind_index(kind: DeviceKind) -> usize {
    match kind {
        DeviceKind::Gpu => 0,
        DeviceKind::Cpu => 1,
    }
}

/// A team's standing in one pool: smaller is served first.
///
/// Tier 0: teams below their guarantee, by the fraction of it they hold (`usage / guarantee`), so the team
/// furthest from its promise comes first. Tier 1: teams at or beyond it, by borrowed devices per unit of
/// weight (`(usage − guarantee) / weight`): idle capacity goes to whoever borrows least for its weight. Ties
/// break by team id. Ratios are compared by cross-multiplication in integers: exact and deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShareKey {
    tier: u8,
    numerator: u64,
    denominator: u64,
    team: TeamId,
}

impl ShareKey {
    pub(crate) fn new(team: TeamId, usage: u32, guarantee: u32, weight: u32) -> Self {
        if usage < guarantee {
            ShareKey { tier: 0, numerator: u64::from(usage), denominator: u64::from(guarantee), team }
        } else {
            ShareKey { tier: 1, numerator: u64::from(usage - guarantee), denominator: u64::from(weight.max(1)), team }
        }
    }
}

impl Ord for ShareKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.tier
            .cmp(&other.tier)
            .then_with(|| (self.numerator * other.denominator).cmp(&(other.numerator * self.denominator)))
            .then_with(|| self.team.cmp(&other.team))
    }
}

impl PartialOrd for ShareKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Within a team, jobs in ascending order of this key: higher priority first, then earlier submission, then
/// job id (so the order is total).
pub(crate) fn job_order_key(priority: i32, submit_seq: u64, id: JobId) -> (Reverse<i32>, u64, JobId) {
    (Reverse(priority), submit_seq, id)
}

/// One team's accounting during a pass.
#[derive(Debug, Clone)]
pub(crate) struct TeamAccount {
    pub id: TeamId,
    pub guarantee: PerKind,
    pub weight: u32,
    /// Devices held or promised, per kind: running jobs (less those being preempted), jobs started in this
    /// pass, and reclaim reservations made in this pass.
    pub usage: [u32; 2],
}

impl TeamAccount {
    pub(crate) fn guarantee(&self, kind: DeviceKind) -> u32 {
        self.guarantee.get(kind)
    }

    pub(crate) fn key(&self, kind: DeviceKind) -> ShareKey {
        ShareKey::new(self.id, self.usage[kind_index(kind)], self.guarantee(kind), self.weight)
    }

    /// Devices of `kind` it holds beyond its guarantee (0 when at or below it).
    pub(crate) fn borrowed(&self, kind: DeviceKind) -> u32 {
        self.usage[kind_index(kind)].saturating_sub(self.guarantee(kind))
    }

    /// Devices of `kind` still free of its guarantee.
    pub(crate) fn unused_guarantee(&self, kind: DeviceKind) -> u32 {
        self.guarantee(kind).saturating_sub(self.usage[kind_index(kind)])
    }
}

/// Every team of the pass, sorted by id. Teams that jobs name but the view does not list get no guarantee and
/// weight 1, so a stale or missing team row never makes the policy fail or favour the team.
#[derive(Debug, Clone)]
pub(crate) struct TeamBook {
    pub accounts: Vec<TeamAccount>,
    /// Looked up once per queued and running job of a pass.
    by_id: UuidMap<TeamId, usize>,
}

impl TeamBook {
    pub(crate) fn new(teams: &[Team], queued: &[QueuedJob], running: &[RunningJob]) -> Self {
        let mut listed: UuidMap<TeamId, (PerKind, u32)> = UuidMap::default();
        for team in teams {
            // ids are unique in the database; should one repeat anyway, the larger row wins, whatever the order
            let row = (team.guarantee, team.weight);
            let entry = listed.entry(team.id).or_insert(row);
            if (row.0.gpu, row.0.cpu, row.1) > (entry.0.gpu, entry.0.cpu, entry.1) {
                *entry = row;
            }
        }
        for id in queued.iter().map(|j| j.team).chain(running.iter().map(|j| j.team)) {
            listed.entry(id).or_insert((PerKind::default(), 1));
        }
        let mut accounts: Vec<TeamAccount> = listed
            .into_iter()
            .map(|(id, (guarantee, weight))| TeamAccount { id, guarantee, weight, usage: [0, 0] })
            .collect();
        accounts.sort_unstable_by_key(|a| a.id);
        let by_id = accounts.iter().enumerate().map(|(i, a)| (a.id, i)).collect();
        let mut book = TeamBook { accounts, by_id };
        for job in running.iter().filter(|j| !j.preempting) {
            let team = book.index(job.team);
            book.accounts[team].usage[kind_index(job.kind)] += job.devices.len() as u32;
        }
        book
    }

    pub(crate) fn index(&self, team: TeamId) -> usize {
        self.by_id[&team]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn team(n: u128) -> TeamId {
        TeamId(Uuid::from_u128(n))
    }

    #[test]
    fn share_keys_order_teams() {
        // pairs of standings: the first must be served before the second
        type Standing = (u32, u32, u32); // usage, guarantee, weight
        let before: &[(Standing, Standing)] = &[
            ((3, 4, 1), (0, 0, 1)),  // below its guarantee beats any borrower, even one holding nothing
            ((1, 4, 1), (2, 4, 1)),  // further below its guarantee first
            ((2, 8, 1), (1, 2, 1)),  // 2/8 of its guarantee before 1/2
            ((5, 4, 1), (6, 4, 1)),  // borrows 1 before borrows 2
            ((6, 4, 2), (5, 4, 1)),  // 2 borrowed at weight 2 ties with 1 at weight 1: team id
            ((10, 4, 3), (7, 4, 1)), // 6/3 = 2 before 3/1 = 3
            ((4, 4, 0), (5, 4, 1)),  // weight 0 counts as 1
        ];
        for &((u1, g1, w1), (u2, g2, w2)) in before {
            let a = ShareKey::new(team(1), u1, g1, w1);
            let b = ShareKey::new(team(2), u2, g2, w2);
            assert!(a < b, "{:?} should come before {:?}", (u1, g1, w1), (u2, g2, w2));
        }
        // exact ties fall to the team id, whichever way the ratio is written
        assert!(ShareKey::new(team(1), 2, 4, 1) < ShareKey::new(team(2), 4, 8, 1));
        assert!(ShareKey::new(team(2), 6, 4, 2) > ShareKey::new(team(1), 5, 4, 1));
    }
}
