//! Collective communication between the ranks of a job.
//!
//! The trait works on host `f32` slices; [`Collective::all_reduce_sum_tensors`] is the entry point the
//! gradient reducer uses, with a default that stages through host memory, which the device-native backend
//! ([`NcclCollective`]) overrides to sum GPU buffers in place. [`Backend`] picks one for a rank.

mod nccl;
mod rendezvous;
mod ring;
mod shm;

use std::time::Duration;

use tch::{Device, Kind, Tensor};

pub use nccl::NcclCollective;
pub use rendezvous::{connect_ring, connect_rings, listen_on, RendezvousConfig, RingLinks};
pub use ring::RingCollective;
pub use shm::{ShmCollective, ShmSegment, DEFAULT_SLOT_ELEMS};

/// Why a collective failed. Every variant names the rank that caused it, so a dead or stalled peer is
/// reported, never waited for forever.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    #[error("rank {peer} closed the connection (it probably died): {detail}")]
    PeerClosed { peer: usize, detail: String },
    #[error("rank {peer} sent nothing for {timeout:?} (stalled, or still busy past the timeout)")]
    PeerTimedOut { peer: usize, timeout: Duration },
    #[error("rendezvous failed: {0}")]
    Rendezvous(String),
    #[error("I/O error talking to rank {peer}: {source}")]
    Io { peer: usize, source: std::io::Error },
    /// NCCL or CUDA failed (the message says which call and why), and no neighbour was seen to die.
    #[error("{0}")]
    Device(String),
    #[error("the GPU {op} did not finish within {timeout:?}: a rank is stalled or gone (NCCL saw no error)")]
    DeviceTimedOut { op: &'static str, timeout: Duration },
    /// The backend cannot serve this rank at all (e.g. NCCL for a CPU rank).
    #[error("{0}")]
    Unsupported(String),
}

pub type CommResult<T> = Result<T, CommError>;

pub trait Collective {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;

    /// Sums `buf` element-wise over all ranks; every rank ends with the sum.
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> CommResult<()>;

    /// Copies `root`'s `buf` to every rank.
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> CommResult<()>;

    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> CommResult<()> {
        self.all_reduce_sum(&mut [0.0])
    }

    /// Bytes this rank has sent so far (to check the bandwidth-optimal bound).
    fn bytes_sent(&self) -> u64;

    /// What carries tensors: "ring", "shm", "nccl" or "none" (a world of one process).
    fn backend(&self) -> &'static str {
        "ring"
    }

    /// All-reduces a contiguous f32 tensor in place. Host backends stage through a reusable buffer;
    /// device backends override this.
    fn all_reduce_sum_tensor(&mut self, tensor: &mut Tensor, staging: &mut Vec<f32>) -> CommResult<()> {
        // a sum over one process is the tensor itself: no copies to the host and back (they were 13% of a
        // one-device step, shown as its "all-reduce share")
        if self.world_size() == 1 {
            return Ok(());
        }
        stage(tensor, staging, |buf| self.all_reduce_sum(buf))
    }

    /// All-reduces several contiguous f32 tensors in place, in order, and returns when all are done (a
    /// device backend enqueues them all and waits once).
    fn all_reduce_sum_tensors(&mut self, tensors: &mut [Tensor], staging: &mut Vec<f32>) -> CommResult<()> {
        tensors.iter_mut().try_for_each(|t| self.all_reduce_sum_tensor(t, staging))
    }

    /// Starts summing a contiguous f32 tensor in place and may return before the sum is done; every rank
    /// starts the same sums in the same order, and [`Collective::finish_started_sums`] waits for them all.
    /// The tensor must be left alone (unread, unwritten, not freed) until then. NCCL enqueues the sum on a
    /// stream of its own, after what the default stream holds so far, so that backward's kernels go on
    /// beside it (the overlapped reducer); the host backends sum at once.
    fn start_all_reduce_sum_tensor(&mut self, tensor: &mut Tensor, staging: &mut Vec<f32>) -> CommResult<()> {
        self.all_reduce_sum_tensor(tensor, staging)
    }

    /// Waits for every sum [`Collective::start_all_reduce_sum_tensor`] started; on a GPU, also orders the
    /// default stream after them.
    fn finish_started_sums(&mut self) -> CommResult<()> {
        Ok(())
    }

    /// GPU time of the last tensor collective, when the backend measures it (CUDA events): on a GPU the
    /// host's clock would count the wait for backward's kernels too.
    fn last_device_time(&self) -> Option<Duration> {
        None
    }

    /// Broadcasts a contiguous f32 tensor in place from `root`.
    fn broadcast_tensor(&mut self, tensor: &mut Tensor, root: usize, staging: &mut Vec<f32>) -> CommResult<()> {
        if self.world_size() == 1 {
            return Ok(());
        }
        stage(tensor, staging, |buf| self.broadcast(buf, root))
    }
}

pub(crate) fn stage(
    tensor: &mut Tensor,
    staging: &mut Vec<f32>,
    op: impl FnOnce(&mut [f32]) -> CommResult<()>,
) -> CommResult<()> {
    if let Some(memory) = host_f32_memory(tensor) {
        return op(memory);
    }
    to_host(std::iter::once(&*tensor), staging);
    op(&mut staging[..])?;
    from_host(staging, std::iter::once(&*tensor));
    Ok(())
}

/// A contiguous f32 CPU tensor's memory, to sum in place: no copy to a staging buffer and back (two
/// passes over every gradient byte of a CPU step).
#[allow(unsafe_code)]
fn host_f32_memory(tensor: &mut Tensor) -> Option<&mut [f32]> {
    let eligible = tensor.device() == Device::Cpu && tensor.kind() == Kind::Float && tensor.is_contiguous();
    if !eligible || tensor.numel() == 0 {
        return None;
    }
    // SAFETY: the tensor is a contiguous f32 CPU tensor of `numel` elements, so its data pointer addresses
    // that many initialised, aligned f32. The slice borrows the tensor mutably for its lifetime, so no other
    // handle of this thread reaches the tensor meanwhile; the callers pass tensors made for the collective
    // (gradient buckets, the elastic reducer's table, the benchmarks' buffers), which nothing else reads while
    // it runs.
    Some(unsafe { std::slice::from_raw_parts_mut(tensor.data_ptr() as *mut f32, tensor.numel()) })
}

/// Copies `tensors` (any device, any float kind), one after the other, into `host` as f32: the one way tensors
/// become the flat host buffers the collectives work on.
pub(crate) fn to_host<'a>(tensors: impl IntoIterator<Item = &'a Tensor>, host: &mut Vec<f32>) {
    host.clear();
    for t in tensors {
        let staged = t.to_kind(Kind::Float).to_device(tch::Device::Cpu).contiguous();
        let n = staged.numel();
        let start = host.len();
        host.resize(start + n, 0.0);
        staged.copy_data(&mut host[start..], n);
    }
}

/// The inverse of [`to_host`]: copies consecutive pieces of `host` back into `tensors`, in place, on their
/// own device and kind.
pub(crate) fn from_host<'a>(host: &[f32], tensors: impl IntoIterator<Item = &'a Tensor>) {
    let mut offset = 0;
    tch::no_grad(|| {
        for t in tensors {
            let n = t.numel();
            let piece = Tensor::from_slice(&host[offset..offset + n]).view(t.size().as_slice());
            t.shallow_clone().copy_(&piece);
            offset += n;
        }
    });
}

/// Which collective a rank's gradients travel on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// NCCL when the rank is on a GPU and libnccl loads; shared memory for a CPU rank given a segment (its
    /// machine holds every rank); the TCP ring otherwise.
    #[default]
    Auto,
    Ring,
    /// Shared memory: every rank on this machine, each given the same segment.
    Shm,
    Nccl,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(text: &str) -> Result<Backend, String> {
        match text {
            "auto" => Ok(Backend::Auto),
            "ring" | "tcp" => Ok(Backend::Ring),
            "shm" => Ok(Backend::Shm),
            "nccl" => Ok(Backend::Nccl),
            other => Err(format!("{other:?} is not a collective: use auto, ring, shm or nccl")),
        }
    }
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Ring => "ring",
            Backend::Shm => "shm",
            Backend::Nccl => "nccl",
        }
    }

    /// Connects this rank (`device` is where its tensors live) with the chosen backend; `segment` is the
    /// shared memory its launcher gave every rank of this machine, if it did. `auto` on a GPU falls back to
    /// the ring, with a note on stderr, only when NCCL cannot be loaded at all.
    pub fn connect(
        self,
        config: &RendezvousConfig,
        device: Device,
        segment: Option<ShmSegment>,
    ) -> CommResult<Box<dyn Collective>> {
        match (self, segment) {
            (Backend::Shm, Some(segment)) => Ok(Box::new(ShmCollective::connect(config, segment)?)),
            (Backend::Auto, Some(segment)) if !device.is_cuda() => {
                Ok(Box::new(ShmCollective::connect(config, segment)?))
            }
            (Backend::Shm, None) => Err(CommError::Rendezvous(
                "the shared-memory all-reduce needs the segment every rank of the machine was given \
                 (--shared-memory)"
                    .into(),
            )),
            (Backend::Ring, _) => Ok(Box::new(RingCollective::connect(config)?)),
            (Backend::Nccl, _) => Ok(Box::new(NcclCollective::connect(config, device)?)),
            (Backend::Auto, _) if !device.is_cuda() => Ok(Box::new(RingCollective::connect(config)?)),
            (Backend::Auto, _) => match crate::cuda::nccl::Nccl::load() {
                Ok(_) => Ok(Box::new(NcclCollective::connect(config, device)?)),
                Err(why) => {
                    eprintln!("rank {}: NCCL unavailable ({why}); gradients go over the TCP ring", config.rank);
                    Ok(Box::new(RingCollective::connect(config)?))
                }
            },
        }
    }
}

/// The world of one process: every collective is the identity.
#[derive(Debug, Default)]
pub struct SoloCollective;

impl Collective for SoloCollective {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&mut self, _buf: &mut [f32]) -> CommResult<()> {
        Ok(())
    }
    fn broadcast(&mut self, _buf: &mut [f32], _root: usize) -> CommResult<()> {
        Ok(())
    }
    fn bytes_sent(&self) -> u64 {
        0
    }
    fn backend(&self) -> &'static str {
        "none"
    }
}

/// Runs `body` on `world` ranks of one test process (threads), joined in a real TCP ring on loopback, and
/// returns what each returned, in rank order.
#[cfg(test)]
pub(crate) fn on_test_ring<T: Send + 'static>(
    world: usize,
    body: impl Fn(RingCollective) -> T + Send + Clone + 'static,
) -> Vec<T> {
    let address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            let body = body.clone();
            std::thread::spawn(move || {
                let config = RendezvousConfig {
                    address,
                    rank,
                    world,
                    join_timeout: Duration::from_secs(20),
                    io_timeout: Duration::from_secs(20),
                    secret: None,
                };
                body(RingCollective::connect(&config).unwrap())
            })
        })
        .collect();
    ranks.into_iter().map(|r| r.join().unwrap()).collect()
}
