//! Choosing whom to preempt when a team below its guarantee reclaims devices other teams borrowed.
//!
//! Only borrowed devices are reclaimed: a candidate's team must hold more than its guarantee when the
//! candidate is chosen, and candidates that leave their team at or above its guarantee are preferred over ones
//! that would cut into it (a gang job straddling its team's guarantee is all or nothing, so sometimes the
//! only way to reclaim is to take a job partly within its team's share; that team is then below its
//! guarantee itself and is served first, but never reclaims from the team that took the devices, which is at
//! or below its own guarantee).
//!
//! Among allowed candidates: lowest priority first, then the most recently started (least work to redo since
//! its checkpoint), then job id. They are taken in that order until enough devices are freed, and then every
//! chosen victim whose devices turn out not to be needed is spared again, most expensive first, so the set is
//! minimal: no victim can be dropped and still free enough.

use std::cmp::Reverse;

use crate::policy::fairness::{kind_index, TeamBook};
use crate::policy::index::ClusterIndex;
use crate::policy::types::{DeviceKind, JobId, RunningJob};

#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// Position in `ClusterIndex::running`.
    pub running: usize,
    pub team: usize,
    /// Devices it holds (all count for its team's usage).
    pub holds: u32,
    /// Devices it holds on listed nodes: what preempting it frees for placement.
    pub frees: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Victims {
    kind: DeviceKind,
    /// In preference order.
    candidates: Vec<Candidate>,
    /// Chosen, or out of the running for the rest of the pass (its team no longer borrows).
    taken: Vec<bool>,
    /// Every candidate before this one is taken: each attempt starts here, so a pass costs O(candidates +
    /// victims) however many reclaims it makes.
    first_untaken: usize,
    /// Devices the untaken candidates would free: an upper bound for a quick "cannot reclaim".
    untaken_frees: u64,
    /// Borrowers that may not be preempted yet (they have not run the platform's minimum time), by id, and
    /// the devices they would free: what a failed reclaim waits for.
    protected: Vec<JobId>,
    protected_frees: u64,
}

impl Victims {
    pub(crate) fn new(kind: DeviceKind, index: &ClusterIndex<'_>, book: &TeamBook) -> Self {
        let mut frees = vec![0u32; index.running.len()];
        for node_busy in &index.kinds[kind_index(kind)].busy {
            for &(_, job) in node_busy {
                frees[job] += 1;
            }
        }
        let borrowing = |job: &RunningJob, position: usize| {
            job.kind == kind
                && !job.preempting
                && frees[position] > 0
                && book.accounts[book.index(job.team)].borrowed(kind) > 0
        };
        let protected: Vec<(JobId, u32)> = index
            .running
            .iter()
            .enumerate()
            .filter(|(position, job)| !job.preemptible && borrowing(job, *position))
            .map(|(position, job)| (job.id, frees[position]))
            .collect();
        let protected_frees = protected.iter().map(|&(_, n)| u64::from(n)).sum();
        let protected = protected.into_iter().map(|(id, _)| id).collect();
        let mut candidates: Vec<Candidate> = index
            .running
            .iter()
            .enumerate()
            .filter(|(position, job)| job.kind == kind && job.preemptible && !job.preempting && frees[*position] > 0)
            .map(|(position, job)| Candidate {
                running: position,
                team: book.index(job.team),
                holds: job.devices.len() as u32,
                frees: frees[position],
            })
            .filter(|c| book.accounts[c.team].borrowed(kind) > 0)
            .collect();
        candidates.sort_by_key(|c| {
            let job = index.running[c.running];
            let cuts_into_guarantee = c.holds > book.accounts[c.team].borrowed(kind);
            (cuts_into_guarantee, job.priority, Reverse(job.started), job.id)
        });
        let untaken_frees = candidates.iter().map(|c| u64::from(c.frees)).sum();
        let taken = vec![false; candidates.len()];
        Victims { kind, candidates, taken, first_untaken: 0, untaken_frees, protected, protected_frees }
    }

    pub(crate) fn untaken_frees(&self) -> u64 {
        self.untaken_frees
    }

    pub(crate) fn protected_frees(&self) -> u64 {
        self.protected_frees
    }

    /// The borrowers not preemptible yet, sorted by id.
    pub(crate) fn protected_jobs(&self) -> Vec<JobId> {
        self.protected.clone()
    }

    /// A minimal set of candidates freeing at least `need` devices, marked taken; `None` (nothing marked)
    /// when the borrowed devices cannot cover `need`. The caller lowers the victims' teams' usage.
    pub(crate) fn choose(&mut self, need: u32, book: &TeamBook) -> Option<Vec<Candidate>> {
        if need == 0 || self.untaken_frees < u64::from(need) {
            return None;
        }
        let k = kind_index(self.kind);
        // devices already chosen in this attempt, per team, so each choice sees its team's borrowing left
        let mut chosen_from: Vec<(usize, u32)> = Vec::new();
        let mut chosen: Vec<usize> = Vec::new();
        let mut freed = 0u32;
        while self.first_untaken < self.candidates.len() && self.taken[self.first_untaken] {
            self.first_untaken += 1;
        }
        for position in self.first_untaken..self.candidates.len() {
            if self.taken[position] {
                continue;
            }
            let candidate = &self.candidates[position];
            let account = &book.accounts[candidate.team];
            if account.usage[k] <= account.guarantee(self.kind) {
                // its team is back within its guarantee, and in this walk a victim's team only shrinks
                self.taken[position] = true;
                self.untaken_frees -= u64::from(candidate.frees);
                continue;
            }
            let already = chosen_from.iter().find(|(t, _)| *t == candidate.team).map_or(0, |(_, n)| *n);
            let still_borrowing = account.usage[k].saturating_sub(already) > account.guarantee(self.kind);
            if !still_borrowing {
                continue;
            }
            match chosen_from.iter_mut().find(|(t, _)| *t == candidate.team) {
                Some((_, n)) => *n += candidate.holds,
                None => chosen_from.push((candidate.team, candidate.holds)),
            }
            chosen.push(position);
            freed += candidate.frees;
            if freed >= need {
                break;
            }
        }
        if freed < need {
            return None;
        }
        // spare whoever is not needed, the most expensive (last chosen) first; sparing only raises the other
        // teams' borrowing left, so everyone kept was still allowed
        let mut kept = Vec::with_capacity(chosen.len());
        for &position in chosen.iter().rev() {
            let frees = self.candidates[position].frees;
            if freed - frees >= need {
                freed -= frees;
            } else {
                kept.push(position);
            }
        }
        kept.reverse();
        Some(
            kept.into_iter()
                .map(|position| {
                    self.taken[position] = true;
                    self.untaken_frees -= u64::from(self.candidates[position].frees);
                    self.candidates[position].clone()
                })
                .collect(),
        )
    }
}
