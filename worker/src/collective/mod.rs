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
    let n = tensor.numel();
    staging.resize(n, 0.0);
    let host = tensor.to_kind(Kind::Float).to_device(tch::Device::Cpu).contiguous();
    host.copy_data(&mut staging[..], n);
    op(&mut staging[..])?;
    let reduced = Tensor::from_slice(&staging[..]).view(tensor.size().as_slice());
    tch::no_grad(|| tensor.copy_(&reduced));
    Ok(())
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
