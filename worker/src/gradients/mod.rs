//! The gradient all-reduce: after backward, gradients are flattened into buckets (default 25 MB, as PyTorch
//! DDP), each bucket is all-reduce-SUMMED and divided by k, and the result handed to the optimizer. With
//! per-rank mean losses this normalises the gradient by kn exactly once (Goyal §2.2); the loss is never
//! scaled instead.

use std::ops::Range;
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};

use crate::collective::{Collective, CommResult};
use crate::optim::{grad_or_zeros, Param};

mod hooks;
mod overlap;

pub use overlap::{Overlapped, OverlappedReducer, DEFAULT_OVERLAP_BUCKET_BYTES};

pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

#[derive(Debug)]
pub struct GradientReducer {
    /// Parameter index ranges, one per bucket, in parameter order.
    buckets: Vec<Range<usize>>,
    staging: Vec<f32>,
}

impl GradientReducer {
    pub fn new(params: &[Param], bucket_bytes: usize) -> GradientReducer {
        GradientReducer { buckets: layout(params, bucket_bytes, Order::FirstParametersFirst), staging: Vec::new() }
    }

    /// The host staging buffer, for [`reduce_in_rank_order`].
    pub fn staging(&mut self) -> &mut Vec<f32> {
        &mut self.staging
    }

    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// All-reduces the local gradients of `params`, divides them by `divisor` (the total number of ranks k,
    /// virtual ranks included) and returns them in parameter order, as views of the reduced buckets.
    /// `extras` (a 1-D tensor: e.g. loss and error counts) rides at the end of the last bucket and comes back
    /// summed but NOT divided.
    ///
    /// Buckets are flattened where the parameters live and summed in place there (on a GPU, with NCCL),
    /// so the only copy to the host is the few extras, once per step, after the all-reduce.
    pub fn reduce(
        &mut self,
        params: &[Param],
        comm: &mut dyn Collective,
        divisor: f64,
        extras: &Tensor,
    ) -> CommResult<Reduced> {
        let extras = extras_beside(params, extras);
        let last = self.buckets.len().saturating_sub(1);
        let mut flats: Vec<Tensor> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(b, range)| flatten(&params[range.clone()], (b == last).then_some(&extras)))
            .collect();
        if flats.is_empty() {
            flats.push(extras.copy());
        }
        let started = Instant::now();
        comm.all_reduce_sum_tensors(&mut flats, &mut self.staging)?;
        let comm_time = comm.last_device_time().unwrap_or_else(|| started.elapsed());
        let (grads, extras) = split(params, &self.buckets, &flats, last, extras.numel() as i64, divisor);
        Ok(Reduced { grads, extras, comm_time })
    }
}

/// The extras as a flat f32 tensor where the parameters live, to ride in a bucket with their gradients.
fn extras_beside(params: &[Param], extras: &Tensor) -> Tensor {
    let device = params.first().map_or(extras.device(), |p| p.tensor.device());
    extras.to_kind(Kind::Float).to_device(device).flatten(0, -1)
}

/// Which parameters a list of buckets starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    FirstParametersFirst,
    /// The order backward makes gradients in, roughly: the overlapped reducer's.
    LastParametersFirst,
}

/// Buckets of consecutive parameters, each at most `bucket_bytes` of f32 (or one parameter, if larger), listed
/// in `order`.
fn layout(params: &[Param], bucket_bytes: usize, order: Order) -> Vec<Range<usize>> {
    let limit = (bucket_bytes / std::mem::size_of::<f32>()).max(1);
    let indices: Box<dyn Iterator<Item = usize>> = match order {
        Order::FirstParametersFirst => Box::new(0..params.len()),
        Order::LastParametersFirst => Box::new((0..params.len()).rev()),
    };
    let mut buckets: Vec<Range<usize>> = Vec::new();
    let mut filled = 0;
    for i in indices {
        let n = params[i].tensor.numel();
        match buckets.last_mut() {
            Some(bucket) if filled + n <= limit || filled == 0 => {
                *bucket = bucket.start.min(i)..bucket.end.max(i + 1);
                filled += n;
            }
            _ => {
                buckets.push(i..i + 1);
                filled = n;
            }
        }
    }
    buckets
}

/// One bucket's local gradients, flattened into one f32 tensor where they live, in parameter order, with
/// `extras` (if given) after them.
fn flatten(params: &[Param], extras: Option<&Tensor>) -> Tensor {
    let mut parts: Vec<Tensor> =
        params.iter().map(|p| grad_or_zeros(&p.tensor).to_kind(Kind::Float).flatten(0, -1)).collect();
    parts.extend(extras.map(Tensor::shallow_clone));
    Tensor::cat(&parts, 0)
}

/// The summed buckets (`flats[b]` holds `buckets[b]`'s parameters, and bucket `carrier` `ride` extras after
/// them) as the k-averaged gradients in parameter order, views of the buckets, and the extras, summed but
/// not divided.
fn split(
    params: &[Param],
    buckets: &[Range<usize>],
    flats: &[Tensor],
    carrier: usize,
    ride: i64,
    divisor: f64,
) -> (Vec<Tensor>, Vec<f32>) {
    let tail = flats.get(carrier).map_or(0, Tensor::numel) as i64 - ride;
    let extras = match flats.get(carrier) {
        Some(flat) if ride > 0 => Vec::<f32>::try_from(&flat.narrow(0, tail, ride)).unwrap_or_default(),
        _ => Vec::new(),
    };
    let mut in_order: Vec<usize> = (0..buckets.len()).collect();
    in_order.sort_by_key(|&b| buckets[b].start);
    let mut grads = Vec::with_capacity(params.len());
    for b in in_order {
        let flat = if b == carrier { flats[b].narrow(0, 0, tail) } else { flats[b].shallow_clone() };
        let averaged = flat / divisor;
        let mut offset = 0;
        for p in &params[buckets[b].clone()] {
            let numel = p.tensor.numel() as i64;
            grads.push(averaged.narrow(0, offset, numel).view(p.tensor.size().as_slice()));
            offset += numel;
        }
    }
    (grads, extras)
}

/// One virtual rank's gradients, flattened in parameter order (f32): what [`reduce_in_rank_order`] takes.
pub fn flat_gradients(params: &[Param]) -> Tensor {
    let parts: Vec<Tensor> =
        params.iter().map(|p| grad_or_zeros(&p.tensor).to_kind(Kind::Float).flatten(0, -1)).collect();
    match parts.is_empty() {
        true => Tensor::zeros([0], (Kind::Float, tch::Device::Cpu)),
        false => Tensor::cat(&parts, 0),
    }
}

/// The all-reduce of an elastic job, which must give the same sums on any number of processes:
/// every virtual rank's gradients (`rows`, this process's, from virtual rank `first` on) are gathered into
/// a [k, P + extras] table (each process fills its own rows, zeros elsewhere, and the table is all-reduce
/// SUMMED: adding zeros is exact), then summed row by row in virtual-rank order and divided by `k`. The
/// order of the additions is thus the same whatever the processes, so a run resized at a checkpoint is the
/// fixed run bit for bit; the price is k/2 times the all-reduce bytes of [`GradientReducer::reduce`]'s
/// in-ring sum (each process sends the whole table, not only the sum). `extras` ride in row `first` and come
/// back summed in the same order, not divided.
pub fn reduce_in_rank_order(
    params: &[Param],
    rows: &[Tensor],
    first: usize,
    k: usize,
    comm: &mut dyn Collective,
    staging: &mut Vec<f32>,
    extras: &Tensor,
) -> CommResult<Reduced> {
    let extras = extras_beside(params, extras);
    let device = extras.device();
    let (ride, width) = (extras.numel() as i64, rows.first().map_or(0, Tensor::numel) as i64);
    let mut table = Tensor::zeros([k as i64, width + ride], (Kind::Float, device));
    for (j, row) in rows.iter().enumerate() {
        table.get((first + j) as i64).narrow(0, 0, width).copy_(row);
    }
    table.get(first as i64).narrow(0, width, ride).copy_(&extras);
    let started = Instant::now();
    comm.all_reduce_sum_tensor(&mut table, staging)?;
    let comm_time = comm.last_device_time().unwrap_or_else(|| started.elapsed());
    // one addition after another, row 0 first: the same order on any layout (a `sum` over the rows might
    // split its work by the thread count)
    let mut total = table.get(0).copy();
    for r in 1..k as i64 {
        total += table.get(r);
    }
    let summed_extras = Vec::<f32>::try_from(&total.narrow(0, width, ride)).unwrap_or_default();
    let averaged = total.narrow(0, 0, width) / k as f64;
    let mut grads = Vec::with_capacity(params.len());
    let mut offset = 0;
    for p in params {
        let numel = p.tensor.numel() as i64;
        grads.push(averaged.narrow(0, offset, numel).view(p.tensor.size().as_slice()));
        offset += numel;
    }
    Ok(Reduced { grads, extras: summed_extras, comm_time })
}

/// What [`GradientReducer::reduce`] returns.
#[derive(Debug)]
pub struct Reduced {
    /// The k-averaged gradients, in parameter order.
    pub grads: Vec<Tensor>,
    /// The extras, summed over all ranks.
    pub extras: Vec<f32>,
    /// Time in the all-reduce (GPU time when the backend measures it).
    pub comm_time: Duration,
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
        let reduced = reducer.reduce(&ps, &mut SoloCollective, 2.0, &Tensor::from_slice(&[2.5f32, 7.0])).unwrap();
        assert_eq!(Vec::<f32>::try_from(&reduced.grads[0]).unwrap(), vec![2.0; 3]);
        assert_eq!(Vec::<f32>::try_from(&reduced.grads[1]).unwrap(), vec![0.0; 2]);
        assert_eq!(reduced.extras, [2.5, 7.0]);
    }

    /// A world of one process has nobody to sum with: nothing is copied to the host and back (the staging
    /// buffer stays empty), so a one-device job's all-reduce share is not host copies for nothing.
    #[test]
    fn a_world_of_one_copies_nothing() {
        let (_vs, ps) = params(&[1000, 24]);
        (ps[0].tensor.sum(Kind::Float) * 2.0).backward();
        let mut reducer = GradientReducer::new(&ps, DEFAULT_BUCKET_BYTES);
        let reduced = reducer.reduce(&ps, &mut SoloCollective, 1.0, &Tensor::from_slice(&[3.0f32])).unwrap();
        assert!(reducer.staging().is_empty(), "staged {} floats", reducer.staging().len());
        assert_eq!(Vec::<f32>::try_from(&reduced.grads[0]).unwrap(), vec![2.0; 1000]);
        assert_eq!(reduced.extras, [3.0]);
    }

    #[test]
    fn without_parameters_the_extras_are_still_summed() {
        let mut reducer = GradientReducer::new(&[], DEFAULT_BUCKET_BYTES);
        let reduced = reducer.reduce(&[], &mut SoloCollective, 2.0, &Tensor::from_slice(&[1.5f32])).unwrap();
        assert!(reduced.grads.is_empty());
        assert_eq!(reduced.extras, [1.5]);
    }

    /// Two ranks over the real TCP ring, several buckets: every gradient is exactly (a + b) / 2 as libtorch
    /// computes it on the host (the old host-staged reducer's arithmetic), and the extras are exact sums.
    #[test]
    fn two_ranks_over_the_ring_get_the_host_arithmetic_bit_for_bit() {
        use crate::collective::{on_test_ring, Collective};
        let sizes = [7i64, 300, 5, 64, 1];
        let grads_of = |rank: i64| -> Vec<Tensor> {
            sizes.iter().map(|&n| Tensor::randn([n], (Kind::Float, Device::Cpu)) * (rank + 1) as f64).collect()
        };
        tch::manual_seed(11);
        let per_rank: Vec<Vec<Tensor>> = (0..2).map(grads_of).collect();
        let expected: Vec<Tensor> = (0..sizes.len()).map(|i| (&per_rank[0][i] + &per_rank[1][i]) / 2.0).collect();
        let inputs: Vec<Vec<Vec<f32>>> =
            per_rank.iter().map(|gs| gs.iter().map(|g| Vec::<f32>::try_from(g).unwrap()).collect()).collect();
        let results = on_test_ring(2, move |mut ring| {
            let rank = ring.rank();
            let (_vs, ps) = params(&sizes);
            for (p, g) in ps.iter().zip(&inputs[rank]) {
                // d/dp sum(p * g) = g, exactly
                (&p.tensor * Tensor::from_slice(g)).sum(Kind::Float).backward();
            }
            let mut reducer = GradientReducer::new(&ps, 310 * 4);
            assert!(reducer.bucket_count() > 1);
            let extras = Tensor::from_slice(&[rank as f32 + 0.5, 3.0]);
            let reduced = reducer.reduce(&ps, &mut ring, 2.0, &extras).unwrap();
            let grads: Vec<Vec<f32>> = reduced.grads.iter().map(|g| Vec::<f32>::try_from(g).unwrap()).collect();
            (grads, reduced.extras)
        });
        for (grads, extras) in results {
            assert_eq!(extras, [2.0, 6.0]);
            for (got, want) in grads.iter().zip(&expected) {
                let want = Vec::<f32>::try_from(want).unwrap();
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{got:?} != {want:?}");
            }
        }
    }
}
