//! Collective communication between the ranks of a job.
//!
//! The trait works on host `f32` slices; [`Collective::all_reduce_sum_tensor`] is the entry point the
//! trainer uses, with a default that stages through host memory, so a device-native backend (NCCL) can
//! override it to reduce GPU buffers in place without touching the trainer.

mod rendezvous;
mod ring;

use std::time::Duration;

use tch::{Kind, Tensor};

pub use rendezvous::RendezvousConfig;
pub use ring::RingCollective;

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

    /// All-reduces a contiguous f32 tensor in place. Host backends stage through a reusable buffer;
    /// device backends override this.
    fn all_reduce_sum_tensor(&mut self, tensor: &mut Tensor, staging: &mut Vec<f32>) -> CommResult<()> {
        stage(tensor, staging, |buf| self.all_reduce_sum(buf))
    }

    /// Broadcasts a contiguous f32 tensor in place from `root`.
    fn broadcast_tensor(&mut self, tensor: &mut Tensor, root: usize, staging: &mut Vec<f32>) -> CommResult<()> {
        stage(tensor, staging, |buf| self.broadcast(buf, root))
    }
}

fn stage(tensor: &mut Tensor, staging: &mut Vec<f32>, op: impl FnOnce(&mut [f32]) -> CommResult<()>) -> CommResult<()> {
    to_host(std::iter::once(&*tensor), staging);
    op(&mut staging[..])?;
    from_host(staging, std::iter::once(&*tensor));
    Ok(())
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
}
