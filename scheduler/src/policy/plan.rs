//! One pass of the policy: [`plan`].
//!
//! Each device kind is a separate pool and is planned on its own, in two walks over its queue:
//!
//! 1. **Guarantees.** Teams below their guarantee, most underserved first, start the jobs that fit in what is
//!    left of their guarantee (priority order, skipping larger ones). A job that does not fit on the free
//!    devices reclaims: devices of jobs already being preempted, then borrowed devices of other teams
//!    (preempting a minimal set of victims), then free devices make up its k; they are reserved for it and it
//!    starts in a later pass, once the victims have checkpointed and stopped.
//! 2. **Fair share.** Every team's remaining jobs, in [`ShareKey`](crate::policy::fairness::ShareKey) order
//!    re-ranked after each start, may use any free device: beyond a guarantee this is borrowing. The first job
//!    that cannot start gets the head-of-line reservation; later jobs only backfill around it.
//!
//! Over 450 lines: the two walks share one pass's state (free devices, reservations, victims being
//! stopped) and read as one algorithm; split, that state would be threaded through every call.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use crate::policy::fairness::{job_order_key, kind_index, ShareKey, TeamBook};
use crate::policy::index::ClusterIndex;
use crate::policy::placement::Slot;
use crate::policy::preemption::Victims;
use crate::policy::reservation::reserve_head_of_line;
use crate::policy::types::{
    ClusterView, DeviceKind, JobId, NodeId, Plan, Preempt, PreemptReason, QueuedJob, Reservation, ReservationKind,
    Start,
};
use crate::policy::waiting::{NodeList, Victim, WaitReason, Waiting};

/// Decides which queued jobs start where, which running jobs are preempted, and which devices are reserved.
/// Pure and deterministic: the same view (in any list order) gives the same plan.
pub fn plan(view: &ClusterView) -> Plan {
    let mut index = ClusterIndex::new(view);
    let mut book = TeamBook::new(&view.teams, &view.queued, &view.running);
    let mut plan = Plan::default();
    // every queued job but those that start gets a Waiting: one allocation instead of a chain of doublings
    // (with their copies and page faults), which cost a tenth of a pass over 100k jobs
    plan.waiting.reserve(view.queued.len());
    for kind in [DeviceKind::Gpu, DeviceKind::Cpu] {
        KindPass::new(kind, view, &mut index, &mut book, &mut plan).run();
    }
    plan.too_large.sort_unstable();
    plan
}

/// Free devices held in this pass for another job, which a later job's reason names.
#[derive(Debug, Clone)]
struct Held {
    job: JobId,
    devices: u32,
    nodes: NodeList,
}

/// A queued job as the walks read it: what they need of it side by side in the team's queue, so that a walk
/// over 100k jobs reads memory in order instead of missing the cache once per job on a pointer into the view
/// (those misses were the largest cost of a large pass).
#[derive(Debug, Clone, Copy)]
struct Entry<'a> {
    id: JobId,
    devices: u32,
    /// Listed sizes beyond `devices` (an elastic job).
    elastic: bool,
    priority: i32,
    submit_seq: u64,
    job: &'a QueuedJob,
}

impl<'a> Entry<'a> {
    fn of(job: &'a QueuedJob) -> Self {
        let (id, devices, elastic) = (job.id, job.devices, !job.larger.is_empty());
        Entry { id, devices, elastic, priority: job.priority, submit_seq: job.submit_seq, job }
    }
}

/// A team's queue of one kind, in `job_order_key` order.
#[derive(Debug)]
struct TeamQueue<'a> {
    jobs: Vec<Entry<'a>>,
    /// Started or reserved in this pass.
    done: Vec<bool>,
}

#[derive(Debug)]
struct KindPass<'v, 'i> {
    kind: DeviceKind,
    index: &'i mut ClusterIndex<'v>,
    book: &'i mut TeamBook,
    plan: &'i mut Plan,
    /// Per team (by `TeamBook` position).
    queues: Vec<TeamQueue<'v>>,
    /// Devices of jobs being preempted, not yet promised to a reclaim in this pass.
    pending: Vec<Slot>,
    /// Busy devices promised to reclaims in this pass.
    claimed: BTreeSet<Slot>,
    victims: Victims,
    /// The smallest k a reclaim failed for: resources only shrink during a pass, so any k at least this large
    /// fails too (this bounds the work of a pass when many teams are below their guarantee).
    reclaim_fails_from: u32,
    /// Jobs that reclaim their team's guarantee, in the order the pass decided them (they come first in the
    /// queue), and every other job that did not start, in fair-share order.
    reclaiming: Vec<Waiting>,
    waiting: Vec<Waiting>,
    /// Devices held for the head-of-line job, and for reclaims (the first reclaim names them all).
    head_of_line: Option<Held>,
    reclaim_held: Option<Held>,
    /// Reclaims that failed only because their victims have not run the minimum time: job -> those victims.
    deferred: BTreeMap<JobId, Vec<JobId>>,
    /// Elastic jobs started in the guarantee walk on what their guarantee left (by position in
    /// `plan.starts`), each with its larger counts: they take more once nobody else wants the rest.
    capped: Vec<(usize, Vec<u32>)>,
}

impl<'v, 'i> KindPass<'v, 'i> {
    fn new(
        kind: DeviceKind,
        view: &'v ClusterView,
        index: &'i mut ClusterIndex<'v>,
        book: &'i mut TeamBook,
        plan: &'i mut Plan,
    ) -> Self {
        let capacity = index.kinds[kind_index(kind)].capacity;
        let mut queues: Vec<TeamQueue<'v>> =
            book.accounts.iter().map(|_| TeamQueue { jobs: Vec::new(), done: Vec::new() }).collect();
        let mut unplaceable = Vec::new();
        let mut sizes = vec![0usize; queues.len()];
        for job in view.queued.iter().filter(|j| j.kind == kind) {
            sizes[book.index(job.team)] += 1;
        }
        for (queue, size) in queues.iter_mut().zip(&sizes) {
            queue.jobs.reserve_exact(*size);
        }
        let queued_of_kind: usize = sizes.iter().sum();
        for job in view.queued.iter().filter(|j| j.kind == kind && j.devices > 0) {
            let group = job.node_group.max(1);
            if group > 1 && u64::from(job.devices) <= capacity {
                let per_node = index.kinds[kind_index(kind)].node_capacities();
                let workers_fit: u64 = per_node.iter().map(|&c| u64::from(c / group)).sum();
                if workers_fit < u64::from(job.devices / group) {
                    plan.too_large.push(job.id);
                    let largest_node = per_node.iter().copied().max().unwrap_or(0);
                    let reason = WaitReason::WorkerLargerThanNodes {
                        kind,
                        needed: job.devices,
                        per_worker: group,
                        largest_node,
                        workers_fit,
                    };
                    unplaceable.push(Waiting { job: job.id, position: None, reason });
                    continue;
                }
            }
            if u64::from(job.devices) > capacity {
                plan.too_large.push(job.id);
                let (needed, pool_size) = (job.devices, capacity);
                let reason = if capacity == 0 {
                    WaitReason::NoDevicesOfKind { kind, needed }
                } else {
                    WaitReason::TooLarge { kind, needed, pool_size }
                };
                unplaceable.push(Waiting { job: job.id, position: None, reason });
            } else {
                queues[book.index(job.team)].jobs.push(Entry::of(job));
            }
        }
        unplaceable.sort_unstable_by_key(|w| w.job);
        plan.waiting.extend(unplaceable);
        for queue in &mut queues {
            queue.jobs.sort_unstable_by_key(|e| job_order_key(e.priority, e.submit_seq, e.id));
            queue.done = vec![false; queue.jobs.len()];
        }
        let busy = &index.kinds[kind_index(kind)].busy;
        let mut pending: Vec<Slot> = Vec::new();
        for (node, devices) in busy.iter().enumerate() {
            for &(device, job) in devices {
                if index.running[job].preempting {
                    pending.push((node as u32, device));
                }
            }
        }
        // taken from the back: keep the lowest slots last so they are promised first
        pending.reverse();
        let victims = Victims::new(kind, index, book);
        KindPass {
            kind,
            index,
            book,
            plan,
            queues,
            pending,
            claimed: BTreeSet::new(),
            victims,
            reclaim_fails_from: u32::MAX,
            reclaiming: Vec::new(),
            waiting: Vec::with_capacity(queued_of_kind),
            head_of_line: None,
            reclaim_held: None,
            deferred: BTreeMap::new(),
            capped: Vec::new(),
        }
    }

    fn run(&mut self) {
        self.guarantee_walk();
        self.fair_share_walk();
        self.grow_elastic_jobs();
        let mut position = 0;
        for mut waiting in self.reclaiming.drain(..).chain(self.waiting.drain(..)) {
            position += 1;
            waiting.position = Some(position);
            self.plan.waiting.push(waiting);
        }
    }

    fn key(&self, team: usize) -> ShareKey {
        self.book.accounts[team].key(self.kind)
    }

    fn kind_slot(&self) -> usize {
        kind_index(self.kind)
    }

    /// Walk 1: jobs within their team's unused guarantee, placed or reclaimed.
    fn guarantee_walk(&mut self) {
        let mut cursor = vec![0usize; self.queues.len()];
        let mut heap: BinaryHeap<Reverse<(ShareKey, usize)>> = (0..self.queues.len())
            .filter(|&t| !self.queues[t].jobs.is_empty() && self.book.accounts[t].unused_guarantee(self.kind) > 0)
            .map(|t| Reverse((self.key(t), t)))
            .collect();
        while let Some(Reverse((_, team))) = heap.pop() {
            // (protected borrowers count: a reclaim that must wait for them says so)
            let nothing_to_gain = self.index.kinds[self.kind_slot()].pool.total() == 0
                && self.pending.is_empty()
                && self.victims.untaken_frees() + self.victims.protected_frees() == 0;
            if nothing_to_gain {
                break;
            }
            // what is left of the guarantee only shrinks, so a job skipped as too large stays skipped
            let room = self.book.accounts[team].unused_guarantee(self.kind);
            let queue = &self.queues[team];
            while cursor[team] < queue.jobs.len() && queue.jobs[cursor[team]].devices > room {
                cursor[team] += 1;
            }
            let Some(&job) = queue.jobs.get(cursor[team]) else { continue };
            let position = cursor[team];
            cursor[team] += 1;

            // an elastic job starts within what is left of the guarantee here; it may grow beyond it later
            let placed = self.try_start(team, position, room);
            // a job whose workers each need one node does not reclaim: preempting borrowers frees devices
            // wherever they ran, which need not make whole groups on nodes (it waits for free nodes)
            if !placed && job.job.node_group <= 1 && job.devices < self.reclaim_fails_from {
                if self.try_reclaim(team, job.job) {
                    self.queues[team].done[position] = true;
                } else {
                    self.reclaim_fails_from = job.devices;
                }
            }
            if cursor[team] < self.queues[team].jobs.len() && self.book.accounts[team].unused_guarantee(self.kind) > 0 {
                heap.push(Reverse((self.key(team), team)));
            }
        }
    }

    /// Walk 2: everything left, in fair-share order; the first job that cannot start is reserved for.
    fn fair_share_walk(&mut self) {
        let mut cursor = vec![0usize; self.queues.len()];
        let mut heap: BinaryHeap<Reverse<(ShareKey, usize)>> = (0..self.queues.len())
            .filter(|&t| self.queues[t].done.iter().any(|d| !d))
            .map(|t| Reverse((self.key(t), t)))
            .collect();
        let mut head_of_line_decided = false;
        // Once the pool is empty nothing starts any more, but the walk goes on (cheaply: a failed start is
        // O(1)) so that every job gets its place in the queue and its reason.
        while let Some(Reverse((_, team))) = heap.pop() {
            let queue = &self.queues[team];
            while cursor[team] < queue.jobs.len() && queue.done[cursor[team]] {
                cursor[team] += 1;
            }
            let Some(&job) = queue.jobs.get(cursor[team]) else { continue };
            let position = cursor[team];
            cursor[team] += 1;

            if !self.try_start(team, position, u32::MAX) {
                let reserved = if head_of_line_decided { None } else { self.reserve_head_of_line(&job) };
                head_of_line_decided = true;
                // a reclaim held back by the minimum run time starts sooner than any reservation's wait
                let reason = match self.deferred.get(&job.id) {
                    Some(protected) => WaitReason::ReclaimAfterMinRunTime {
                        kind: self.kind,
                        needed: job.devices,
                        protected_jobs: protected.clone(),
                    },
                    None => reserved.unwrap_or_else(|| self.wait_reason(team, &job)),
                };
                self.waiting.push(Waiting { job: job.id, position: None, reason });
            }
            if cursor[team] < self.queues[team].jobs.len() {
                heap.push(Reverse((self.key(team), team)));
            }
        }
    }

    /// Elastic jobs below their most grow onto devices that stay idle after both walks, when no job of this
    /// kind waits for them (nothing reclaims, nothing is reserved or waiting): each to the largest of its
    /// counts that its own devices and the idle ones make, the most recently started last. The idle devices
    /// are taken from the pool here, so two jobs never count the same ones; the job stops at a checkpoint
    /// and starts on them (and its own) in a later pass.
    fn grow_elastic_jobs(&mut self) {
        if !self.waiting.is_empty() || !self.reclaiming.is_empty() {
            return;
        }
        let slot = self.kind_slot();
        // jobs started in this pass on less than they may hold take what is left first: no stop needed
        for (start, larger) in std::mem::take(&mut self.capped) {
            let held = self.plan.starts[start].devices.len() as u32;
            let free = self.index.kinds[slot].pool.total();
            let Some(to) = larger.iter().rev().copied().find(|&to| to > held && u64::from(to - held) <= free) else {
                continue;
            };
            let Some(more) = self.index.kinds[slot].pool.take(to - held) else { continue };
            let team = self.book.index(self.plan.starts[start].team);
            let account = &mut self.book.accounts[team];
            let (usage, guarantee) = (account.usage[slot], account.guarantee(self.kind));
            account.usage[slot] += to - held;
            let started = &mut self.plan.starts[start];
            started.devices.extend(self.index.slots(&more));
            started.devices.sort_unstable();
            started.borrowed += (usage + to - held).saturating_sub(guarantee) - usage.saturating_sub(guarantee);
        }
        let mut growing: Vec<usize> = (0..self.index.running.len())
            .filter(|&r| {
                let job = self.index.running[r];
                job.kind == self.kind && job.preemptible && !job.preempting && !job.grow_to.is_empty()
            })
            .collect();
        growing.sort_by_key(|&r| (self.index.running[r].started, self.index.running[r].id));
        for r in growing {
            let job = self.index.running[r];
            let held = job.devices.len() as u32;
            let free = self.index.kinds[slot].pool.total();
            let Some(to) = job.grow_to.iter().rev().copied().find(|&to| to > held && u64::from(to - held) <= free)
            else {
                continue;
            };
            let Some(_) = self.index.kinds[slot].pool.take(to - held) else { continue };
            let team = self.book.index(job.team);
            self.book.accounts[team].usage[slot] += to - held;
            self.plan.preemptions.push(Preempt { job: job.id, reason: PreemptReason::Grow { from: held, to } });
        }
    }

    /// Holds devices for the first job in line that could not start; its reason, or None when too few
    /// devices are left to reserve.
    fn reserve_head_of_line(&mut self, job: &Entry) -> Option<WaitReason> {
        let kind = &mut self.index.kinds[kind_index(self.kind)];
        let (held, awaiting) = reserve_head_of_line(job.devices, job.job.node_group, kind, &self.claimed)?;
        let mut awaiting_jobs: Vec<JobId> = awaiting
            .iter()
            .filter_map(|&(node, index)| {
                let busy = &kind.busy[node as usize];
                let at = busy.binary_search_by_key(&index, |&(i, _)| i).ok()?;
                let running = self.index.running[busy[at].1];
                // a placement still stopping is a stand-in, not a job the user could look up
                (!running.preempting).then_some(running.id)
            })
            .collect();
        awaiting_jobs.sort_unstable();
        awaiting_jobs.dedup();
        let held_slots = self.index.slots(&held);
        self.head_of_line = Some(Held { job: job.id, devices: held.len() as u32, nodes: nodes_of(&held_slots) });
        self.plan.reservations.push(Reservation {
            job: job.id,
            kind: ReservationKind::HeadOfLine,
            held: held_slots,
            awaiting: self.index.slots(&awaiting),
        });
        Some(WaitReason::HeadOfLine { kind: self.kind, needed: job.devices, held: held.len() as u32, awaiting_jobs })
    }

    /// Why `job` could not start when the walk reached it (the pool as it is at that moment).
    fn wait_reason(&self, team: usize, job: &Entry) -> WaitReason {
        let (kind, needed) = (self.kind, job.devices);
        let pool = &self.index.kinds[self.kind_slot()].pool;
        let free_now = pool.total();
        let per_worker = job.job.node_group;
        if per_worker > 1 && free_now >= u64::from(needed) {
            let workers_fit = pool.free_groups(per_worker);
            return WaitReason::WaitingForNodeRoom { kind, needed, per_worker, free_now, workers_fit };
        }
        let fits_with = |held: &Held| free_now + u64::from(held.devices) >= u64::from(needed);
        if let Some(held) = self.head_of_line.as_ref().filter(|h| fits_with(h)) {
            return WaitReason::HeadOfLineReserved { kind, needed, free_now, for_job: held.job };
        }
        if let Some(held) = self.reclaim_held.as_ref().filter(|h| fits_with(h)) {
            return WaitReason::BehindReservation { kind, needed, free_now, job: held.job, nodes: held.nodes.clone() };
        }
        let account = &self.book.accounts[team];
        let (used, guarantee) = (account.usage[self.kind_slot()], account.guarantee(kind));
        if guarantee > 0 && used >= guarantee {
            WaitReason::TeamAtGuaranteePoolFull { kind, needed, used, guarantee, free_now }
        } else {
            WaitReason::WaitingForDevices {
                kind,
                needed,
                free_now,
                free_within_team_guarantee: guarantee - used.min(guarantee),
            }
        }
    }

    /// Starts the job if enough free devices exist (an elastic job on the most of its counts that fit, at
    /// most `cap`); records the start and the team's usage.
    fn try_start(&mut self, team: usize, position: usize, cap: u32) -> bool {
        let job = self.queues[team].jobs[position];
        let k = self.kind_slot();
        let free = self.index.kinds[k].pool.total();
        let larger: &[u32] = if job.elastic { &job.job.larger } else { &[] };
        let size =
            larger.iter().rev().copied().find(|&count| count <= cap && u64::from(count) <= free).unwrap_or(job.devices);
        let Some(slots) = self.index.kinds[k].pool.take_grouped(size, job.job.node_group) else { return false };
        let account = &mut self.book.accounts[team];
        let guarantee = account.guarantee(self.kind);
        let usage = account.usage[k];
        let borrowed = (usage + size).saturating_sub(guarantee) - usage.saturating_sub(guarantee);
        account.usage[k] += size;
        self.queues[team].done[position] = true;
        if larger.last().is_some_and(|&most| most > size) {
            self.capped.push((self.plan.starts.len(), larger.to_vec()));
        }
        self.plan.starts.push(Start { job: job.id, team: job.job.team, devices: self.index.slots(&slots), borrowed });
        true
    }

    /// Reserves k devices for a job within its team's guarantee, preempting borrowers when the free and
    /// already-freeing devices are not enough. False, and nothing changed, when even that is not enough.
    fn try_reclaim(&mut self, team: usize, job: &QueuedJob) -> bool {
        let k = job.devices;
        let slot = self.kind_slot();
        let free = self.index.kinds[slot].pool.total();
        let pending = self.pending.len() as u64;
        let (victims, use_pending) = if free + pending >= u64::from(k) {
            (Vec::new(), k.min(pending as u32))
        } else {
            let need = (u64::from(k) - free - pending) as u32;
            match self.victims.choose(need, self.book) {
                Some(victims) => (victims, pending as u32),
                None => {
                    if self.victims.untaken_frees() + self.victims.protected_frees() >= u64::from(need) {
                        self.deferred.insert(job.id, self.victims.protected_jobs());
                    }
                    return false;
                }
            }
        };

        let mut preempted: Vec<Victim> = Vec::new();
        let mut awaiting: Vec<Slot> = Vec::new();
        for _ in 0..use_pending {
            awaiting.push(self.pending.pop().expect("counted"));
        }
        for victim in &victims {
            let running = self.index.running[victim.running];
            for device in &running.devices {
                let Some(node) = self.index.node_position(device.node) else { continue };
                // only what it holds in this pool; a victim's devices beyond k are left for anyone next pass
                let device = (node, device.index);
                if awaiting.len() < k as usize
                    && self.index.kinds[slot].is_held_by(device.0, device.1, victim.running)
                    && !awaiting.contains(&device)
                {
                    awaiting.push(device);
                }
            }
            self.book.accounts[victim.team].usage[slot] -= victim.holds;
            preempted.push(Victim { job: running.id, team: running.team });
            self.plan
                .preemptions
                .push(Preempt { job: running.id, reason: PreemptReason::Reclaim { team: job.team, for_job: job.id } });
        }
        self.claimed.extend(awaiting.iter().copied());

        // the rest from free devices, on the awaited nodes first so the job lands on few nodes
        let mut held_needed = k.saturating_sub(awaiting.len() as u32);
        let mut held: Vec<Slot> = Vec::new();
        let mut awaited_nodes: Vec<(u32, u32)> = Vec::new(); // (devices awaited there, node)
        for &(node, _) in &awaiting {
            match awaited_nodes.iter_mut().find(|(_, n)| *n == node) {
                Some((count, _)) => *count += 1,
                None => awaited_nodes.push((1, node)),
            }
        }
        awaited_nodes.sort_unstable_by_key(|&(count, node)| (Reverse(count), node));
        let pool = &mut self.index.kinds[slot].pool;
        for &(_, node) in &awaited_nodes {
            held_needed -= pool.take_on_node(node, held_needed, &mut held);
        }
        if held_needed > 0 {
            held.extend(pool.take(held_needed).expect("free + pending + victims >= k"));
        }

        self.book.accounts[team].usage[slot] += k;
        let held_slots = self.index.slots(&held);
        if !held.is_empty() {
            let reclaim_held =
                self.reclaim_held.get_or_insert_with(|| Held { job: job.id, devices: 0, nodes: NodeList::default() });
            reclaim_held.devices += held.len() as u32;
            reclaim_held.nodes = nodes_of_all(&reclaim_held.nodes, &held_slots);
        }
        self.plan.reservations.push(Reservation {
            job: job.id,
            kind: ReservationKind::Reclaim,
            held: held_slots,
            awaiting: self.index.slots(&awaiting),
        });
        self.reclaiming.push(Waiting {
            job: job.id,
            position: None,
            reason: WaitReason::Reclaiming {
                kind: self.kind,
                needed: k,
                victims: preempted,
                stopping_devices: use_pending,
            },
        });
        true
    }
}

/// The distinct nodes of some devices, sorted.
fn nodes_of(slots: &[crate::policy::types::DeviceSlot]) -> NodeList {
    nodes_of_all(&[], slots)
}

fn nodes_of_all(known: &[NodeId], slots: &[crate::policy::types::DeviceSlot]) -> NodeList {
    let mut nodes: Vec<NodeId> = known.iter().copied().chain(slots.iter().map(|s| s.node)).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes.into()
}
