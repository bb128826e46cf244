//! The all-reduce for ranks on one machine: through one shared memory segment instead of
//! sockets. The buffer goes in rounds of at most a slot; in each round every rank
//!
//! 1. copies the parts of its round that other ranks sum (k−1 of k chunks) into its own slot,
//! 2. waits for all (a barrier on counters in the segment),
//! 3. sums its own chunk in place, reading the others' slots, and writes the sum into its slot,
//! 4. waits for all again, and copies the other chunks' sums out of their owners' slots.
//!
//! That is a reduce-scatter then an all-gather, like the ring's, with every byte crossing memory once
//! instead of the kernel's socket buffers twice. Two sets of slots alternate between rounds, so a round
//! may start writing while slower ranks still read the round before it (they have passed the barrier that
//! makes that safe; see [`ShmCollective::all_reduce_sum`]).
//!
//! Waiting spins briefly, then sleeps on a futex on the awaited rank's counter (woken by that rank when it
//! enters the barrier): a rank waiting for a slower one, as the all-reduce overlapped with backward does
//! while the other rank's backward runs, must not take a core from its own backward. It never waits past
//! the I/O timeout, and the TCP ring links the rendezvous made stay open as a probe, so a rank that died is
//! named (its sockets close with it) rather than waited for.
//!
//! The segment is a `memfd` the launcher creates and hands to every rank of the machine (inherited by a
//! rank process, shared by threads in tests and benchmarks); the ranks map it, they never open a path.

#![allow(unsafe_code)] // mmap, and the shared counters and slots inside the mapping

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::ring::RingCollective;
use super::{Collective, CommError, CommResult, RendezvousConfig};

/// Floats per slot: 256 Ki (1 MiB), half a core's L2 here. A 64 MB all-reduce is 64 rounds of two
/// barriers each. Measured on the 2-core development machine (`ringtrain bench allreduce --slot-elems`,
/// busbw at 64 MB): 64 KiB slots 3.7 GB/s, 256 KiB 5.9, 1 MiB 6.4–6.6, 4 MiB 4.2–4.3, 16 MiB 3.6.
pub const DEFAULT_SLOT_ELEMS: usize = 1 << 18;
/// One counter per rank, each on its own cache line, at the start of the segment; after it on the same line,
/// how many ranks sleep waiting for it to move.
const COUNTER_STRIDE: usize = 64;
const SLEEPERS_OFFSET: usize = 8;
/// Spins before a wait sleeps: a few microseconds, enough for ranks arriving together.
const SPINS_BEFORE_SLEEP: u32 = 4096;
/// The counters' page(s): the slots start page-aligned.
const PAGE: usize = 4096;
/// How often a wait looks at the ring links for a dead neighbour.
const PROBE_EVERY: Duration = Duration::from_millis(50);

/// A shared memory segment, mapped: the counters, then two sets of one slot per rank.
#[derive(Debug)]
pub struct ShmSegment {
    base: *mut u8,
    len: usize,
    world: usize,
    slot_elems: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through the protocol above (atomic
// counters, slots written only by their owner between barriers), so moving the handle to another thread is
// as safe as using it from this one.
unsafe impl Send for ShmSegment {}

impl ShmSegment {
    /// The segment's size for `world` ranks of `slot_elems` floats each.
    pub fn size_for(world: usize, slot_elems: usize) -> usize {
        counters_len(world) + 2 * world * slot_elems * std::mem::size_of::<f32>()
    }

    /// A new anonymous segment (a `memfd`, zeroed) for `world` ranks.
    pub fn create(world: usize, slot_elems: usize) -> std::io::Result<ShmSegment> {
        let len = ShmSegment::size_for(world, slot_elems);
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor or -1.
        let raw = unsafe { libc::memfd_create(c"ringtrain-allreduce".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor memfd_create just returned and nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on a descriptor this function owns.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        ShmSegment::map(fd, world)
    }

    /// Maps a segment made by [`ShmSegment::create`] (`fd`: its descriptor, or a duplicate of it) for
    /// `world` ranks; the slot size follows from the segment's size.
    pub fn map(fd: OwnedFd, world: usize) -> std::io::Result<ShmSegment> {
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
        // SAFETY: fstat writes one `stat` into the zeroed struct it is given.
        let len = unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut stat) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            stat.st_size as usize
        };
        let data = len.checked_sub(counters_len(world)).ok_or_else(|| invalid(format!("{len} bytes is too small")))?;
        let slot_bytes = 2 * world * std::mem::size_of::<f32>();
        if world == 0 || data == 0 || data % slot_bytes != 0 {
            return Err(invalid(format!("{len} bytes is not a segment for {world} ranks")));
        }
        // SAFETY: a fresh shared mapping of the whole file; checked for failure below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ShmSegment { base: base.cast(), len, world, slot_elems: data / slot_bytes, fd })
    }

    /// The segment a launcher handed this rank as an empty `memfd` (so the launcher needs no knowledge of
    /// the layout): the first rank to get here sizes it for `world` ranks of [`DEFAULT_SLOT_ELEMS`], the
    /// others find it sized (all size it alike, so a race between two of them changes nothing), and each
    /// maps it. Every rank adopts before the rendezvous, and none touches the memory before
    /// [`ShmCollective::connect`]'s barrier, so no rank writes into a segment another is still sizing.
    pub fn adopt(fd: OwnedFd, world: usize) -> std::io::Result<ShmSegment> {
        // SAFETY: fstat writes one `stat` into the zeroed struct it is given.
        let empty = unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut stat) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            stat.st_size == 0
        };
        let len = ShmSegment::size_for(world, DEFAULT_SLOT_ELEMS);
        // SAFETY: ftruncate on a descriptor this function owns.
        if empty && unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        ShmSegment::map(fd, world)
    }

    /// Another handle on the same memory (a duplicated descriptor, mapped again): for another rank.
    pub fn share(&self) -> std::io::Result<ShmSegment> {
        ShmSegment::map(self.fd.try_clone()?, self.world)
    }

    /// The descriptor, to hand to a rank process.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn slot_elems(&self) -> usize {
        self.slot_elems
    }

    /// Rank `rank`'s barrier counter.
    fn counter(&self, rank: usize) -> &AtomicU64 {
        assert!(rank < self.world);
        // SAFETY: in bounds (rank < world, one 64-byte line each, inside the counters' pages), 8-aligned
        // (the mapping is page-aligned), and only ever accessed atomically.
        unsafe { &*self.base.add(rank * COUNTER_STRIDE).cast::<AtomicU64>() }
    }

    /// How many ranks sleep waiting for `rank`'s counter (see [`ShmCollective::barrier_wait`]).
    fn sleepers(&self, rank: usize) -> &AtomicU32 {
        assert!(rank < self.world);
        // SAFETY: as in `counter`: the same line, 8 bytes further, 4-aligned, only accessed atomically.
        unsafe { &*self.base.add(rank * COUNTER_STRIDE + SLEEPERS_OFFSET).cast::<AtomicU32>() }
    }

    /// Sleeps until `rank`'s counter is no longer `seen`, it is woken, or `timeout` passes, whichever comes
    /// first (any of them returns: the caller looks again).
    fn sleep_while(&self, rank: usize, seen: u64, timeout: Duration) {
        let sleepers = self.sleepers(rank);
        // SeqCst with the waker's store-then-load: either it sees this sleeper, or the futex sees its new value
        sleepers.fetch_add(1, Ordering::SeqCst);
        let timeout = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // the futex word is the counter's low half (x86-64 is little-endian); it changes with every barrier
        let word = self.counter(rank) as *const AtomicU64 as *const u32;
        // SAFETY: FUTEX_WAIT reads the aligned u32 at `word` (inside the mapping, see `counter`) and compares
        // it with `seen`'s low half before sleeping; shared (not private) because other processes map it.
        unsafe { libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAIT, seen as u32, &timeout, 0usize, 0u32) };
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes the ranks sleeping on `rank`'s counter, if any.
    fn wake(&self, rank: usize) {
        if self.sleepers(rank).load(Ordering::SeqCst) == 0 {
            return;
        }
        let word = self.counter(rank) as *const AtomicU64 as *const u32;
        // SAFETY: FUTEX_WAKE only uses the address as a key (the counter's low half, inside the mapping).
        unsafe { libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32) };
    }

    /// The first float of `rank`'s slot in set `set`.
    fn slot(&self, set: usize, rank: usize) -> *mut f32 {
        assert!(set < 2 && rank < self.world);
        let offset =
            counters_len(self.world) + (set * self.world + rank) * self.slot_elems * std::mem::size_of::<f32>();
        // SAFETY: in bounds of the mapping by the layout above.
        unsafe { self.base.add(offset).cast::<f32>() }
    }
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; nothing borrows it past this handle.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn counters_len(world: usize) -> usize {
    (world * COUNTER_STRIDE).div_ceil(PAGE).max(1) * PAGE
}

/// The all-reduce over a shared segment, for ranks on one machine.
#[derive(Debug)]
pub struct ShmCollective {
    rank: usize,
    world: usize,
    segment: ShmSegment,
    /// The rendezvous's ring: its links are the liveness probe while waiting.
    ring: RingCollective,
    /// Barriers this rank has entered (its counter's value).
    barriers: u64,
    /// Rounds so far: which set of slots the next one uses.
    rounds: u64,
    io_timeout: Duration,
    bytes_sent: u64,
}

impl ShmCollective {
    /// Joins the ranks through the rendezvous (which proves the placement's secret and opens the ring
    /// links), then works through `segment`, which every rank of the job must have mapped.
    pub fn connect(config: &RendezvousConfig, segment: ShmSegment) -> CommResult<ShmCollective> {
        if segment.world != config.world {
            return Err(CommError::Rendezvous(format!(
                "the shared segment is for {} ranks, the job has {}",
                segment.world, config.world
            )));
        }
        let ring = RingCollective::connect(config)?;
        let mut shm = ShmCollective {
            rank: config.rank,
            world: config.world,
            segment,
            ring,
            barriers: 0,
            rounds: 0,
            io_timeout: config.io_timeout,
            bytes_sent: 0,
        };
        // a segment may be reused by a later attempt of the same ranks: every counter starts where this
        // rank's does, so begin from the highest anyone reached
        shm.barriers = (0..shm.world).map(|r| shm.segment.counter(r).load(Ordering::Acquire)).max().unwrap_or(0);
        shm.ring.barrier()?;
        Ok(shm)
    }

    /// Chunk `i` of `len` elements: balanced, as the ring's.
    fn chunk(&self, len: usize, i: usize) -> std::ops::Range<usize> {
        i * len / self.world..(i + 1) * len / self.world
    }

    /// Enters the next barrier and waits until every rank has: spinning a little, then sleeping on the
    /// counter of a rank still behind, looking at the ring links for a dead neighbour every [`PROBE_EVERY`],
    /// and giving up after the I/O timeout.
    fn barrier_wait(&mut self) -> CommResult<()> {
        self.barriers += 1;
        let target = self.barriers;
        self.segment.counter(self.rank).store(target, Ordering::SeqCst);
        self.segment.wake(self.rank);
        let started = Instant::now();
        let mut next_probe = started + PROBE_EVERY;
        let mut spins = 0u32;
        loop {
            let behind = (0..self.world)
                .map(|r| (r, self.segment.counter(r).load(Ordering::Acquire)))
                .find(|&(_, reached)| reached < target);
            let Some((peer, reached)) = behind else { return Ok(()) };
            if spins < SPINS_BEFORE_SLEEP {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if now >= next_probe {
                if let Some(dead) = self.ring.closed_neighbour() {
                    return Err(CommError::PeerClosed {
                        peer: dead,
                        detail: "its link closed while the others waited at a shared-memory barrier".into(),
                    });
                }
                next_probe = now + PROBE_EVERY;
            }
            if now - started > self.io_timeout {
                return Err(CommError::PeerTimedOut { peer, timeout: self.io_timeout });
            }
            self.segment.sleep_while(peer, reached, next_probe.saturating_duration_since(now));
        }
    }

    /// The set of slots the next round uses.
    fn next_set(&mut self) -> usize {
        let set = (self.rounds % 2) as usize;
        self.rounds += 1;
        set
    }
}

impl Collective for ShmCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    /// Why two sets suffice: round t+2 reuses round t's set. A rank starts round t+2 only after the first
    /// barrier of round t+1, which no rank enters before it has finished reading round t.
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> CommResult<()> {
        if self.world == 1 || buf.is_empty() {
            return Ok(());
        }
        let (r, k) = (self.rank, self.world);
        for piece in buf.chunks_mut(self.segment.slot_elems) {
            let n = piece.len();
            let set = self.next_set();
            let mine = self.slot(set, r);
            // 1. publish the chunks the others sum
            for j in (0..k).filter(|&j| j != r) {
                let c = self.chunk(n, j);
                // SAFETY: this rank's own slot, which no one reads until the barrier below; in bounds (c is
                // within the round, n ≤ slot_elems).
                unsafe { std::ptr::copy_nonoverlapping(piece[c.clone()].as_ptr(), mine.add(c.start), c.len()) };
                self.bytes_sent += (c.len() * 4) as u64;
            }
            self.barrier_wait()?;
            // 2. sum this rank's chunk, adding the others' slots in rank order, and publish the sum (written
            // with the last addition: one pass fewer over the chunk)
            let c = self.chunk(n, r);
            let own = &mut piece[c.clone()];
            // SAFETY: this rank's own slot at its own chunk: written only by this rank, read by the others
            // only after the barrier below; in bounds as above.
            let published = unsafe { std::slice::from_raw_parts_mut(mine.add(c.start), c.len()) };
            let last = if r == k - 1 { k - 2 } else { k - 1 };
            for j in (0..k).filter(|&j| j != r) {
                // SAFETY: rank j wrote this chunk of its slot before the barrier and writes nothing there
                // until the barrier after next; in bounds as above.
                let theirs = unsafe { std::slice::from_raw_parts(self.slot(set, j).add(c.start), c.len()) };
                if j == last {
                    for ((o, t), p) in own.iter_mut().zip(theirs).zip(published.iter_mut()) {
                        *o += t;
                        *p = *o;
                    }
                } else {
                    own.iter_mut().zip(theirs).for_each(|(o, t)| *o += t);
                }
            }
            self.bytes_sent += (c.len() * 4) as u64;
            self.barrier_wait()?;
            // 3. collect the other chunks' sums from their owners
            for j in (0..k).filter(|&j| j != r) {
                let c = self.chunk(n, j);
                // SAFETY: rank j's slot at its own chunk, written before the barrier; as above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.slot(set, j).add(c.start),
                        piece[c.clone()].as_mut_ptr(),
                        c.len(),
                    )
                };
            }
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> CommResult<()> {
        if self.world == 1 || buf.is_empty() {
            return Ok(());
        }
        for piece in buf.chunks_mut(self.segment.slot_elems) {
            let set = self.next_set();
            let slot = self.slot(set, root);
            if self.rank == root {
                // SAFETY: the root's own slot, read by the others only after the barrier.
                unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), slot, piece.len()) };
                self.bytes_sent += (piece.len() * 4) as u64;
            }
            self.barrier_wait()?;
            if self.rank != root {
                // SAFETY: written by the root before the barrier, not again before the barrier after next.
                unsafe { std::ptr::copy_nonoverlapping(slot, piece.as_mut_ptr(), piece.len()) };
            }
        }
        Ok(())
    }

    fn barrier(&mut self) -> CommResult<()> {
        self.barrier_wait()
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    fn backend(&self) -> &'static str {
        "shm"
    }
}

impl ShmCollective {
    fn slot(&self, set: usize, rank: usize) -> *mut f32 {
        self.segment.slot(set, rank)
    }
}
