//! The gradient all-reduce: after backward, gradients are flattened into buckets (default 25 MB, as PyTorch
//! DDP), each bucket is all-reduce-SUMMED and divided by k, and the result handed to the optimizer. With
//! per-rank mean losses this normalises the gradient by kn exactly once (Goyal §2.2); the loss is never
//! scaled instead.

use std::ops::Range;
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};

use crate::collective::{Collective, CommResult};
use crate::optim::{grad_or_zeros, Param};

pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

#[derive(Debug)]
pub struct GradientReducer {
    /// Parameter index ranges, one per bucket, in parameter order.
    buckets: Vec<Range<usize>>,
    staging: Vec<f32>,
}

impl GradientReducer {
    pub fn new(params: &[Param], bucket_bytes: usize) -> GradientReducer {
        let limit = (bucket_bytes / std::mem::size_of::<f32>()).max(1);
        let mut buckets = Vec::new();
        let (mut start, mut filled) = (0, 0);
        for (i, p) in params.iter().enumerate() {
            let n = p.tensor.numel();
            if filled > 0 && filled + n > limit {
                buckets.push(start..i);
                start = i;
                filled = 0;
            }
            filled += n;
        }
        if start < params.len() {
            buckets.push(start..params.len());
        }
        GradientReducer { buckets, staging: Vec::new() }
    }

    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// All-reduces the local gradients of `params`, divides them by `divisor` (the total number of ranks k,
    /// virtual ranks included) and returns them in parameter order. `extras` (e.g. loss and error counts)
    /// ride along in the last bucket and come back summed but NOT divided. Returns the time spent in
    /// communication too.
    pub fn reduce(
        &mut self,
        params: &[Param],
        comm: &mut dyn Collective,
        divisor: f64,
        extras: &mut [f32],
    ) -> CommResult<(Vec<Tensor>, Duration)> {
        let mut reduced = Vec::with_capacity(params.len());
        let mut comm_time = Duration::ZERO;
        let last = self.buckets.len().saturating_sub(1);
        for b in 0..self.buckets.len() {
            let range = self.buckets[b].clone();
            let grads: Vec<Tensor> =
                params[range.clone()].iter().map(|p| grad_or_zeros(&p.tensor).flatten(0, -1)).collect();
            let flat = Tensor::cat(&grads, 0).to_kind(Kind::Float).to_device(tch::Device::Cpu);
            let n = flat.numel();
            let ride = if b == last { extras.len() } else { 0 };
            self.staging.resize(n + ride, 0.0);
            flat.copy_data(&mut self.staging[..n], n);
            if ride > 0 {
                self.staging[n..].copy_from_slice(extras);
            }
            let started = Instant::now();
            comm.all_reduce_sum(&mut self.staging)?;
            comm_time += started.elapsed();
            if ride > 0 {
                extras.copy_from_slice(&self.staging[n..]);
            }
            let averaged = Tensor::from_slice(&self.staging[..n]) / divisor;
            let mut offset = 0;
            for p in &params[range] {
                let numel = p.tensor.numel() as i64;
                let g = averaged.narrow(0, offset, numel).view(p.tensor.size().as_slice()).to_device(p.tensor.device());
                reduced.push(g);
                offset += numel;
            }
        }
        if params.is_empty() && !extras.is_empty() {
            comm.all_reduce_sum(extras)?;
        }
        Ok((reduced, comm_time))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::SoloCollective;
    use tch::{nn, Device};

    fn params(sizes: &[i64]) -> (nn::VarStore, Vec<Param>) {
        let vs = nn::VarStore::new(Device::Cpu);
        let params = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Param {
                name: format!("p{i}"),
                tensor: vs.root().var(&format!("p{i}"), &[n], nn::Init::Const(1.0)),
                decay: true,
            })
            .collect();
        (vs, params)
    }

    #[test]
    fn buckets_respect_the_size_limit_and_cover_every_parameter() {
        let (_vs, ps) = params(&[10, 10, 30, 5, 5]);
        let reducer = GradientReducer::new(&ps, 20 * 4);
        assert_eq!(reducer.buckets, vec![0..2, 2..3, 3..5]);
        assert_eq!(GradientReducer::new(&ps, DEFAULT_BUCKET_BYTES).bucket_count(), 1);
    }

    #[test]
    fn divides_by_the_world_and_keeps_extras_summed() {
        let (_vs, ps) = params(&[3, 2]);
        (ps[0].tensor.sum(Kind::Float) * 4.0).backward(); // grad of p0 = 4, p1 has none
        let mut reducer = GradientReducer::new(&ps, 8);
        let mut extras = [2.5, 7.0];
        let (grads, _) = reducer.reduce(&ps, &mut SoloCollective, 2.0, &mut extras).unwrap();
        assert_eq!(Vec::<f32>::try_from(&grads[0]).unwrap(), vec![2.0; 3]);
        assert_eq!(Vec::<f32>::try_from(&grads[1]).unwrap(), vec![0.0; 2]);
        assert_eq!(extras, [2.5, 7.0]);
    }
}
