//! NCCL for GPU ranks: gradient buckets are summed in place in GPU memory, on the default stream (tch's),
//! by a non-blocking communicator, so a dead or stalled peer is an error within the comm timeout, never a
//! hang. Host-side collectives (the start-up broadcast, evaluation counts, BatchNorm tables) stay on the TCP
//! ring, which also carries NCCL's unique id from rank 0 and, when NCCL fails, names a neighbour that died.
//!
//! The watchdog PyTorch runs on a thread (ProcessGroupNCCL) is inline here: the trainer's thread is the
//! only NCCL caller and waits for every collective by polling a CUDA event and `ncclCommGetAsyncError`
//! against a deadline. On failure the communicator is aborted on a helper thread with a bound (abort itself
//! can hang), and a guard aborts the process if it is still alive long after (CUDA teardown behind a dead
//! kernel must not become a hang either).
//!
//! Over 450 lines only with its tests (407 of code).

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};

use super::{Collective, CommError, CommResult, RendezvousConfig, RingCollective};
use crate::cuda::nccl::{version_text, Comm, CommState, Nccl, UniqueId, MIN_VERSION_CODE, UNIQUE_ID_BYTES};
use crate::cuda::runtime::{Runtime, SideStream};

/// How long an abort or a finalize may take before it is given up on.
const TEARDOWN_BOUND: Duration = Duration::from_secs(10);
/// How long a failed rank may linger before the guard aborts the process.
const EXIT_GUARD: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct NcclCollective {
    ring: RingCollective,
    runtime: Arc<Runtime>,
    /// None once aborted.
    comm: Option<Comm>,
    /// The first collective connects NCCL's peers lazily, so it gets the join timeout.
    first_op_timeout: Duration,
    io_timeout: Duration,
    first_op_done: bool,
    /// Set by the first failure: every later call fails at once with it.
    failure: Option<String>,
    /// 2(k-1)/k of every all-reduced byte: what a ring algorithm sends (NCCL may choose a tree).
    nominal_bytes: u64,
    last_device_time: Option<Duration>,
    /// The stream the overlapped reducer's sums go on (made at its first), and how many sums were started
    /// there since the last wait for them.
    side: Option<SideStream>,
    started_sums: usize,
}

impl NcclCollective {
    /// Joins the TCP ring, then creates the NCCL communicator on this rank's GPU (`device`, the only one
    /// CUDA_VISIBLE_DEVICES shows it). Both within the join timeout.
    pub fn connect(config: &RendezvousConfig, device: Device) -> CommResult<NcclCollective> {
        if !device.is_cuda() {
            return Err(CommError::Unsupported(
                "the NCCL collective needs a GPU rank; CPU ranks use the TCP ring (--collective ring)".into(),
            ));
        }
        let nccl = Nccl::load().map_err(|e| CommError::Device(e.to_string()))?;
        let runtime = Runtime::load().map_err(|e| CommError::Device(e.to_string()))?;
        let version = nccl.version_code().map_err(device_error)?;
        if version < MIN_VERSION_CODE {
            return Err(CommError::Device(format!(
                "NCCL {} is too old: ringtrain needs 2.28 or newer (torch 2.11.0 ships 2.28.9)",
                version_text(version)
            )));
        }
        // CUDA's context for this thread's device must exist before NCCL looks for it.
        let _ = Tensor::zeros([1], (Kind::Float, device));
        let mut ring = RingCollective::connect(config)?;
        let id = share_unique_id(&mut ring, || nccl.unique_id().map(UniqueId::to_bytes).map_err(device_error))?;
        let comm = nccl.start_comm(config.world, UniqueId::from_bytes(id), config.rank).map_err(device_error)?;
        let deadline = Instant::now() + config.join_timeout;
        let created = wait_until(deadline, || match comm.state("init") {
            CommState::Ready => Ok(true),
            CommState::InProgress => Ok(false),
            CommState::Failed(e) => Err(device_error(e)),
        });
        let collective = NcclCollective {
            ring,
            runtime,
            comm: Some(comm),
            first_op_timeout: config.join_timeout,
            io_timeout: config.io_timeout,
            first_op_done: false,
            failure: None,
            nominal_bytes: 0,
            last_device_time: None,
            side: None,
            started_sums: 0,
        };
        match created {
            Ok(true) => Ok(collective),
            Ok(false) => Err(collective.fail(CommError::DeviceTimedOut { op: "init", timeout: config.join_timeout })),
            Err(e) => Err(collective.fail(e)),
        }
    }

    /// Runs `enqueue` (NCCL calls on the default stream), then waits until the GPU is past them, an
    /// asynchronous error shows, or the deadline passes.
    fn run(&mut self, op: &'static str, enqueue: impl FnOnce(&mut Comm) -> CommResult<()>) -> CommResult<()> {
        self.not_failed_before()?;
        let outcome = self.run_within(op, self.timeout(), enqueue);
        match outcome {
            Ok(()) => {
                self.first_op_done = true;
                Ok(())
            }
            Err(e) => Err(self.fail_in_place(e)),
        }
    }

    fn run_within(
        &mut self,
        op: &'static str,
        timeout: Duration,
        enqueue: impl FnOnce(&mut Comm) -> CommResult<()>,
    ) -> CommResult<()> {
        let deadline = Instant::now() + timeout;
        let start = self.runtime.record(true).map_err(|e| CommError::Device(e.to_string()))?;
        let comm = self.comm.as_mut().ok_or_else(|| CommError::Device("the NCCL communicator is gone".into()))?;
        enqueue(comm)?;
        // a non-blocking group may still be enqueueing: NCCL wants no other call (and the event must come
        // after its kernels) until its state is ready
        let enqueued = wait_until(deadline, || comm_ready(comm, op))?;
        if !enqueued {
            return Err(CommError::DeviceTimedOut { op, timeout });
        }
        let done = self.runtime.record(true).map_err(|e| CommError::Device(e.to_string()))?;
        let finished = wait_until(deadline, || {
            if done.is_complete().map_err(|e| CommError::Device(e.to_string()))? {
                return Ok(true);
            }
            comm_ready(comm, op).map(|_| false)
        })?;
        if !finished {
            return Err(CommError::DeviceTimedOut { op, timeout });
        }
        self.last_device_time = done.elapsed_since(&start).ok();
        Ok(())
    }

    /// Every call after the first failure fails at once with it.
    fn not_failed_before(&self) -> CommResult<()> {
        match &self.failure {
            Some(failure) => Err(CommError::Device(format!("NCCL failed earlier: {failure}"))),
            None => Ok(()),
        }
    }

    /// The timeout of the next operation: the first connects NCCL's peers, so it gets the join timeout.
    fn timeout(&self) -> Duration {
        if self.first_op_done {
            self.io_timeout
        } else {
            self.first_op_timeout
        }
    }

    /// Enqueues an in-place sum of `tensor` on the side stream, after everything the default stream holds so
    /// far (the bucket's flattening), and returns once NCCL has taken the call, not when the sum is done.
    #[allow(unsafe_code)] // `all_reduce_sum_on`'s contract, kept by the collective's
    fn start_on_side_stream(&mut self, tensor: &Tensor) -> CommResult<()> {
        self.not_failed_before()?;
        let timeout = self.timeout();
        let deadline = Instant::now() + timeout;
        let enqueued = (|| {
            if self.side.is_none() {
                self.side = Some(self.runtime.side_stream().map_err(cuda_error)?);
            }
            let side = self.side.as_ref().ok_or_else(|| CommError::Device("no side stream".into()))?;
            side.after_default().map_err(cuda_error)?;
            let comm = self.comm.as_mut().ok_or_else(|| CommError::Device("the NCCL communicator is gone".into()))?;
            // SAFETY: `side` is live (this collective owns it). The tensor is left alone by the caller until
            // `finish_started_sums` (the trait's contract), which makes the default stream wait for the side
            // stream and sees that wait's event complete before returning.
            unsafe { comm.all_reduce_sum_on(std::slice::from_ref(tensor), side.raw()) }.map_err(device_error)?;
            // a non-blocking group may still be enqueueing: no other NCCL call until it is ready
            match wait_until(deadline, || comm_ready(comm, "all-reduce"))? {
                true => Ok(()),
                false => Err(CommError::DeviceTimedOut { op: "all-reduce", timeout }),
            }
        })();
        match enqueued {
            Ok(()) => {
                self.started_sums += 1;
                let k = self.world_size() as u64;
                self.nominal_bytes += 2 * (k - 1) * tensor.numel() as u64 * 4 / k;
                Ok(())
            }
            Err(e) => Err(self.fail_in_place(e)),
        }
    }

    /// Orders the default stream after the side stream's sums and waits, against the timeout, until the GPU
    /// is past them (or NCCL reports an error).
    fn finish_side_stream(&mut self) -> CommResult<()> {
        if self.started_sums == 0 {
            return Ok(());
        }
        self.started_sums = 0;
        self.not_failed_before()?;
        let timeout = self.timeout();
        let deadline = Instant::now() + timeout;
        let finished = (|| {
            let side = self.side.as_ref().ok_or_else(|| CommError::Device("no side stream".into()))?;
            let done = side.before_default().map_err(cuda_error)?;
            let comm = self.comm.as_ref().ok_or_else(|| CommError::Device("the NCCL communicator is gone".into()))?;
            let finished = wait_until(deadline, || {
                if done.is_complete().map_err(cuda_error)? {
                    return Ok(true);
                }
                comm_ready(comm, "all-reduce").map(|_| false)
            })?;
            match finished {
                true => Ok(()),
                false => Err(CommError::DeviceTimedOut { op: "all-reduce", timeout }),
            }
        })();
        match finished {
            Ok(()) => {
                self.first_op_done = true;
                Ok(())
            }
            Err(e) => Err(self.fail_in_place(e)),
        }
    }

    fn fail_in_place(&mut self, error: CommError) -> CommError {
        self.failure = Some(error.to_string());
        abort_within(self.comm.take(), TEARDOWN_BOUND);
        arm_exit_guard(EXIT_GUARD);
        name_dead_neighbour(&self.ring, error)
    }

    fn fail(mut self, error: CommError) -> CommError {
        self.fail_in_place(error)
    }
}

/// The communicator's state as a poll result: ready (true), busy (false), or its error.
fn comm_ready(comm: &Comm, op: &'static str) -> CommResult<bool> {
    match comm.state(op) {
        CommState::Ready => Ok(true),
        CommState::InProgress => Ok(false),
        CommState::Failed(e) => Err(device_error(e)),
    }
}

fn device_error(e: crate::cuda::nccl::NcclError) -> CommError {
    CommError::Device(e.to_string())
}

fn cuda_error(e: crate::cuda::runtime::CudaError) -> CommError {
    CommError::Device(e.to_string())
}

/// A peer found dead on the TCP ring makes the better error: it names the rank.
fn name_dead_neighbour(ring: &RingCollective, error: CommError) -> CommError {
    match ring.closed_neighbour() {
        Some(peer) => CommError::PeerClosed { peer, detail: error.to_string() },
        None => error,
    }
}

/// Rank 0 makes NCCL's unique id (`make`); every rank gets it over the TCP ring. The 128 bytes travel as 32
/// f32 words through a broadcast, which copies bits and never computes, so any byte pattern arrives intact.
pub(crate) fn share_unique_id(
    comm: &mut dyn Collective,
    make: impl FnOnce() -> CommResult<[u8; UNIQUE_ID_BYTES]>,
) -> CommResult<[u8; UNIQUE_ID_BYTES]> {
    let mut words = [0f32; UNIQUE_ID_BYTES / 4];
    if comm.rank() == 0 {
        words = bytemuck::cast(make()?);
    }
    comm.broadcast(&mut words, 0)?;
    Ok(bytemuck::cast(words))
}

/// Polls `ready` until it says true (Ok(true)), fails, or `deadline` passes (Ok(false)). Spins briefly,
/// then sleeps in growing steps up to a millisecond: a step's all-reduce is usually done within a few
/// hundred microseconds of its enqueue on one node, and a stuck one should not burn a core.
pub(crate) fn wait_until(deadline: Instant, mut ready: impl FnMut() -> CommResult<bool>) -> CommResult<bool> {
    let mut pause = Duration::from_micros(10);
    let mut spins = 0u32;
    loop {
        if ready()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        if spins < 200 {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

/// Aborts the communicator on a helper thread and waits at most `bound` for it: `ncclCommAbort` can hang
/// when peers are gone (NVIDIA/nccl#829, #1777), and then this thread moves on without it.
fn abort_within(comm: Option<Comm>, bound: Duration) {
    let Some(comm) = comm else { return };
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = comm.abort();
        let _ = done.send(());
    });
    if finished.recv_timeout(bound).is_err() {
        eprintln!("NCCL abort did not return within {bound:?}; leaving it behind");
    }
}

/// After a failure the process must end: if it is still alive after `after` (stuck in CUDA or NCCL
/// teardown), abort it. Mirrors PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING tear-down and heartbeat monitor.
fn arm_exit_guard(after: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        eprintln!("still alive {after:?} after an NCCL failure: aborting the process");
        std::process::abort();
    });
}

impl Drop for NcclCollective {
    /// A healthy communicator is finalized (flushing anything in flight) and destroyed, within a bound;
    /// anything else is aborted.
    fn drop(&mut self) {
        let Some(mut comm) = self.comm.take() else { return };
        let flushed = comm.finalize().is_ok()
            && wait_until(Instant::now() + TEARDOWN_BOUND, || comm_ready(&comm, "finalize")).unwrap_or(false);
        if flushed {
            let _ = comm.destroy();
        } else {
            abort_within(Some(comm), TEARDOWN_BOUND);
        }
    }
}

fn all_cuda(tensors: &[Tensor]) -> bool {
    !tensors.is_empty() && tensors.iter().all(|t| t.device().is_cuda())
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.ring.rank()
    }

    fn world_size(&self) -> usize {
        self.ring.world_size()
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> CommResult<()> {
        self.ring.all_reduce_sum(buf)
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> CommResult<()> {
        self.ring.broadcast(buf, root)
    }

    fn bytes_sent(&self) -> u64 {
        self.ring.bytes_sent() + self.nominal_bytes
    }

    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn all_reduce_sum_tensor(&mut self, tensor: &mut Tensor, staging: &mut Vec<f32>) -> CommResult<()> {
        self.all_reduce_sum_tensors(std::slice::from_mut(tensor), staging)
    }

    fn all_reduce_sum_tensors(&mut self, tensors: &mut [Tensor], staging: &mut Vec<f32>) -> CommResult<()> {
        if !all_cuda(tensors) {
            return tensors.iter_mut().try_for_each(|t| super::stage(t, staging, |buf| self.ring.all_reduce_sum(buf)));
        }
        let k = self.world_size() as u64;
        let bytes: u64 = tensors.iter().map(|t| t.numel() as u64 * 4).sum();
        self.run("all-reduce", |comm| comm.all_reduce_sum(tensors).map_err(device_error))?;
        self.nominal_bytes += 2 * (k - 1) * bytes / k;
        Ok(())
    }

    fn start_all_reduce_sum_tensor(&mut self, tensor: &mut Tensor, staging: &mut Vec<f32>) -> CommResult<()> {
        if !all_cuda(std::slice::from_ref(tensor)) {
            return super::stage(tensor, staging, |buf| self.ring.all_reduce_sum(buf));
        }
        self.start_on_side_stream(tensor)
    }

    fn finish_started_sums(&mut self) -> CommResult<()> {
        self.finish_side_stream()
    }

    fn broadcast_tensor(&mut self, tensor: &mut Tensor, root: usize, staging: &mut Vec<f32>) -> CommResult<()> {
        if !tensor.device().is_cuda() {
            return super::stage(tensor, staging, |buf| self.ring.broadcast(buf, root));
        }
        let tensors = std::slice::from_ref(&*tensor);
        self.run("broadcast", |comm| comm.broadcast(tensors, root).map_err(device_error))
    }

    fn last_device_time(&self) -> Option<Duration> {
        self.last_device_time
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{on_test_ring, SoloCollective};

    #[test]
    fn waiting_returns_when_ready_fails_with_the_error_and_times_out() {
        let mut polls = 0;
        assert!(wait_until(Instant::now() + Duration::from_secs(5), || {
            polls += 1;
            Ok(polls == 300)
        })
        .unwrap());
        assert_eq!(polls, 300);
        let failed = wait_until(Instant::now() + Duration::from_secs(5), || Err(CommError::Device("boom".into())));
        assert!(matches!(failed, Err(CommError::Device(m)) if m == "boom"));
        let started = Instant::now();
        assert!(!wait_until(started + Duration::from_millis(50), || Ok(false)).unwrap());
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(50) && waited < Duration::from_secs(2), "{waited:?}");
    }

    #[test]
    fn a_cpu_rank_is_refused_with_the_reason() {
        let config = RendezvousConfig {
            address: "127.0.0.1:1".parse().unwrap(),
            rank: 0,
            world: 1,
            join_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(1),
            secret: None,
        };
        let err = NcclCollective::connect(&config, Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("needs a GPU rank"), "{err}");
    }

    /// Over a real two-rank TCP ring, every byte value arrives intact, including the patterns that make
    /// signalling and quiet NaNs when the id is viewed as f32 words.
    #[test]
    fn the_unique_id_crosses_the_ring_bit_for_bit() {
        let mut id = [0u8; UNIQUE_ID_BYTES];
        id.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 2 + 1) as u8);
        // f32 words 0x7f800001 (signalling NaN) and 0xffc00000 (quiet NaN), little-endian
        id[..4].copy_from_slice(&0x7f80_0001u32.to_le_bytes());
        id[4..8].copy_from_slice(&0xffc0_0000u32.to_le_bytes());
        let received = on_test_ring(2, move |mut ring| share_unique_id(&mut ring, || Ok(id)).unwrap());
        assert_eq!(received, [id, id]);
    }

    #[test]
    fn a_world_of_one_keeps_the_id_it_made() {
        let id: [u8; UNIQUE_ID_BYTES] = std::array::from_fn(|i| i as u8);
        assert_eq!(share_unique_id(&mut SoloCollective, || Ok(id)).unwrap(), id);
    }
}
