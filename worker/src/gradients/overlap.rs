//! The gradient all-reduce overlapped with backward, as PyTorch DDP does it: buckets are
//! laid out from the last parameters to the first (the order backward makes their gradients in), a hook on
//! each parameter's gradient accumulation ([`super::hooks`]) says when a bucket is complete, and that bucket
//! is summed while backward goes on with the rest.
//!
//! Backward runs on a helper thread (libtorch runs a CPU backward on the thread that calls it; a GPU's on its
//! own device thread either way); this, the trainer's thread, flattens and starts the all-reduce of each
//! bucket as soon as it is ready, in bucket order whatever order the buckets become ready in, so every rank
//! issues the same collectives in the same order. A host collective sums at once; NCCL enqueues the sum on
//! a stream of its own after the bucket's flattening, so the GPU runs it beside backward's remaining kernels
//! ([`Collective::start_all_reduce_sum_tensor`]), and the step waits for all of them at the end. A bucket
//! whose parameters backward never reached (unused in this step) is summed after backward returns, as zeros.
//!
//! The arithmetic is [`GradientReducer::reduce`](super::GradientReducer::reduce)'s: each bucket summed by
//! the collective, then divided by k; the extras ride at the end of the last bucket summed. With the same
//! buckets the bits are the same; the buckets differ from the plain reducer's, so a k ≥ 3 ring (whose sum
//! order depends on where an element falls in a bucket) may round differently from it, never from itself.

use std::ops::Range;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use tch::Tensor;

use super::hooks::{GradHooks, Progress};
use super::{extras_beside, flatten, layout, split, Order, Reduced};
use crate::collective::Collective;
use crate::optim::Param;

/// The overlapped reducer's bucket size: small enough that a small model's gradients come in several
/// buckets, so that the first can travel while backward makes the others (DDP's first bucket is 1 MiB for
/// the same reason). ResNet-20's 1.1 MB of gradients is 5 buckets.
pub const DEFAULT_OVERLAP_BUCKET_BYTES: usize = 256 * 1024;

#[derive(Debug)]
pub struct OverlappedReducer {
    /// Parameter index ranges, one per bucket, in the order they are summed: the last parameters first.
    buckets: Vec<Range<usize>>,
    hooks: GradHooks,
    staging: Vec<f32>,
}

/// What [`OverlappedReducer::backward_and_reduce`] returns.
#[derive(Debug)]
pub struct Overlapped {
    /// The gradients and extras; `comm_time` is the exposed all-reduce: from the end of backward to the end
    /// of the last bucket's sum, the time the step waited for communication.
    pub reduced: Reduced,
    /// Wall time of backward, on its thread.
    pub backward: Duration,
    /// Time spent in the buckets' all-reduces, overlapped or not.
    pub communicating: Duration,
}

impl OverlappedReducer {
    /// Hooks `params`' gradients; `bucket_bytes` is each bucket's size limit.
    pub fn new(params: &[Param], bucket_bytes: usize) -> Result<OverlappedReducer> {
        let buckets = layout(params, bucket_bytes, Order::LastParametersFirst);
        let mut bucket_of = vec![0; params.len()];
        for (b, range) in buckets.iter().enumerate() {
            range.clone().for_each(|i| bucket_of[i] = b);
        }
        let tensors: Vec<&Tensor> = params.iter().map(|p| &p.tensor).collect();
        let hooks = GradHooks::add(&tensors, bucket_of)?;
        Ok(OverlappedReducer { buckets, hooks, staging: Vec::new() })
    }

    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Back-propagates `loss` (adding to whatever `.grad` the parameters hold: earlier virtual ranks') and
    /// all-reduces the gradients bucket by bucket as backward completes them; returns what
    /// [`GradientReducer::reduce`](super::GradientReducer::reduce) would. A failed all-reduce is returned
    /// after backward has finished; a failed backward after every bucket was summed (so that the other ranks'
    /// collectives are answered), as an error of the job.
    pub fn backward_and_reduce(
        &mut self,
        params: &[Param],
        loss: Tensor,
        comm: &mut dyn Collective,
        divisor: f64,
        extras: &Tensor,
    ) -> Result<Overlapped> {
        let extras = extras_beside(params, extras);
        let (progress, heard) = mpsc::channel();
        self.hooks.arm(progress.clone());
        let outcome = std::thread::scope(|scope| {
            let backward = scope.spawn(move || {
                // told on every way out, a panic's too: the loop below waits for it when a bucket never fills
                let _told = TellWhenDone(progress);
                let started = Instant::now();
                let done = loss.f_backward();
                (done, started, Instant::now())
            });
            let summed = self.reduce_as_ready(params, comm, &extras, &heard);
            let (done, started, ended) = backward.join().map_err(|_| anyhow!("backward panicked"))?;
            let (flats, communicating, finished) = summed?;
            done.map_err(|e| crate::trainer::JobError(format!("backward failed: {e}")))?;
            Ok::<_, anyhow::Error>((flats, communicating, ended - started, finished.saturating_duration_since(ended)))
        });
        self.hooks.disarm();
        let (flats, communicating, backward, exposed) = outcome?;
        let carrier = self.buckets.len().saturating_sub(1);
        let (grads, extras) = split(params, &self.buckets, &flats, carrier, extras.numel() as i64, divisor);
        Ok(Overlapped { reduced: Reduced { grads, extras, comm_time: exposed }, backward, communicating })
    }

    /// The trainer's side of the step: each bucket flattened and summed once it is ready (or once backward
    /// has returned), in bucket order. Returns the summed buckets, the time spent summing, and when the last
    /// sum ended.
    fn reduce_as_ready(
        &mut self,
        params: &[Param],
        comm: &mut dyn Collective,
        extras: &Tensor,
        heard: &mpsc::Receiver<Progress>,
    ) -> Result<(Vec<Tensor>, Duration, Instant)> {
        let count = self.buckets.len();
        let mut ready = vec![false; count];
        let mut backward_done = false;
        let mut flats = Vec::with_capacity(count.max(1));
        let mut communicating = Duration::ZERO;
        while flats.len() < count.max(1) {
            let next = flats.len();
            if backward_done || ready.get(next).copied().unwrap_or(true) {
                let carried = (next + 1 >= count).then_some(extras);
                let mut flat = match self.buckets.get(next) {
                    Some(range) => flatten(&params[range.clone()], carried),
                    None => extras.copy(), // no parameters: the extras alone
                };
                let started = Instant::now();
                comm.start_all_reduce_sum_tensor(&mut flat, &mut self.staging)?;
                communicating += started.elapsed();
                flats.push(flat);
                continue;
            }
            match heard.recv() {
                Ok(Progress::BucketReady(b)) => ready[b] = true,
                Ok(Progress::BackwardDone) | Err(_) => backward_done = true,
            }
        }
        let started = Instant::now();
        comm.finish_started_sums()?;
        communicating += started.elapsed();
        Ok((flats, communicating, Instant::now()))
    }
}

/// Sends [`Progress::BackwardDone`] when dropped.
struct TellWhenDone(mpsc::Sender<Progress>);

impl Drop for TellWhenDone {
    fn drop(&mut self) {
        let _ = self.0.send(Progress::BackwardDone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{on_test_ring, SoloCollective};
    use crate::gradients::GradientReducer;
    use tch::nn::{self, Module};
    use tch::{Device, Kind};

    /// Three linear layers in a chain, their parameters in layer order: backward reaches layer 3's first.
    fn chain(vs: &nn::VarStore) -> (nn::Sequential, Vec<Param>) {
        let root = vs.root();
        let net = nn::seq()
            .add(nn::linear(&root / "l0", 16, 64, Default::default()))
            .add_fn(|x| x.tanh())
            .add(nn::linear(&root / "l1", 64, 64, Default::default()))
            .add_fn(|x| x.tanh())
            .add(nn::linear(&root / "l2", 64, 4, Default::default()));
        let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let params = named.into_iter().map(|(name, tensor)| Param { name, tensor, decay: true }).collect();
        (net, params)
    }

    /// A loss whose input depends on `seed` only (not on the global generator, which tests on other threads
    /// move).
    fn loss_of(net: &nn::Sequential, seed: i64) -> Tensor {
        let x = (Tensor::arange(128, (Kind::Float, Device::Cpu)).view([8, 16]) * (0.37 * seed as f64)).sin();
        net.forward(&x).square().mean(Kind::Float)
    }

    fn bits(tensors: &[Tensor]) -> Vec<Vec<u32>> {
        tensors
            .iter()
            .map(|t| Vec::<f32>::try_from(&t.flatten(0, -1)).unwrap().iter().map(|f| f.to_bits()).collect())
            .collect()
    }

    #[test]
    fn buckets_go_from_the_last_parameters_to_the_first() {
        let vs = nn::VarStore::new(Device::Cpu);
        let (_net, params) = chain(&vs);
        // l0.bias 64, l0.weight 1024, l1.bias 64, l1.weight 4096, l2.bias 4, l2.weight 256 floats; 1200 a bucket
        let reducer = OverlappedReducer::new(&params, 1200 * 4).unwrap();
        assert_eq!(reducer.buckets, vec![4..6, 3..4, 0..3]);
    }

    /// The hooks tell each bucket once its last gradient is in, in the order backward completes them, and
    /// nothing while disarmed.
    #[test]
    fn hooks_tell_each_bucket_once_as_backward_completes_it() {
        let vs = nn::VarStore::new(Device::Cpu);
        let (net, params) = chain(&vs);
        let tensors: Vec<&Tensor> = params.iter().map(|p| &p.tensor).collect();
        // buckets: l0 (0, 1), l1 (2, 3), l2 (4, 5), numbered from the end as the reducer does
        let hooks = GradHooks::add(&tensors, vec![2, 2, 1, 1, 0, 0]).unwrap();
        let (progress, heard) = mpsc::channel();
        loss_of(&net, 1).backward();
        hooks.arm(progress);
        loss_of(&net, 2).backward();
        hooks.disarm();
        loss_of(&net, 3).backward();
        let told: Vec<Progress> = heard.try_iter().collect();
        assert_eq!(told, [0, 1, 2].map(Progress::BucketReady));
    }

    /// Over a real two-rank ring, several buckets: the overlapped sums are the plain reducer's bit for bit
    /// (a sum of two is the same whatever the buckets), extras included.
    #[test]
    fn two_ranks_get_the_plain_reducers_bits() {
        let results = on_test_ring(2, |mut ring| {
            let rank = ring.rank() as i64;
            let vs = nn::VarStore::new(Device::Cpu);
            let (net, params) = chain(&vs);
            let extras = Tensor::from_slice(&[rank as f32 + 0.25, 2.0]);
            let mut overlapped = OverlappedReducer::new(&params, 1200 * 4).unwrap();
            assert_eq!(overlapped.bucket_count(), 3);
            let done =
                overlapped.backward_and_reduce(&params, loss_of(&net, 10 + rank), &mut ring, 2.0, &extras).unwrap();
            let mine = (bits(&done.reduced.grads), done.reduced.extras);
            params.iter().for_each(|p| drop(p.tensor.grad().zero_()));
            loss_of(&net, 10 + rank).backward();
            let plain = GradientReducer::new(&params, crate::gradients::DEFAULT_BUCKET_BYTES)
                .reduce(&params, &mut ring, 2.0, &extras)
                .unwrap();
            (mine, (bits(&plain.grads), plain.extras))
        });
        for ((overlapped, extras), (plain, plain_extras)) in results {
            assert_eq!(extras, [1.5, 4.0]);
            assert_eq!(extras, plain_extras);
            assert_eq!(overlapped, plain);
        }
    }

    /// A parameter that backward never reaches (unused this step) leaves its bucket unfinished: it is summed
    /// once backward returns, as zeros, rather than waited for.
    #[test]
    fn an_unreached_parameter_is_summed_as_zeros_not_waited_for() {
        let vs = nn::VarStore::new(Device::Cpu);
        let (net, mut params) = chain(&vs);
        let unused = vs.root().var("unused", &[3], nn::Init::Const(1.0));
        params.push(Param { name: "unused".into(), tensor: unused, decay: true });
        let mut reducer = OverlappedReducer::new(&params, 1200 * 4).unwrap();
        let done = reducer
            .backward_and_reduce(&params, loss_of(&net, 4), &mut SoloCollective, 1.0, &Tensor::from_slice(&[1.0f32]))
            .unwrap();
        assert_eq!(Vec::<f32>::try_from(done.reduced.grads.last().unwrap()).unwrap(), [0.0; 3]);
        assert_eq!(done.reduced.extras, [1.0]);
        for (got, p) in done.reduced.grads.iter().zip(&params).take(6) {
            assert_eq!(bits(std::slice::from_ref(got)), bits(&[p.tensor.grad()]), "{}", p.name);
        }
    }
}
