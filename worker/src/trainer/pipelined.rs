//! A trainer that is one stage of its worker's pipeline (a built-in ResNet's blocks, or a composite
//! uploaded model's modules) ([`crate::pipeline`]): the step runs the
//! micro-batches (its virtual ranks) through the stages in the 1F1B schedule, sums this stage's gradients
//! with the same stage of the other workers, and agrees with the worker's other stages on the step's loss,
//! error and stop; evaluation passes the test batches through the stages; a checkpoint is the unsplit
//! model's, assembled in worker 0's first stage. Resuming needs nothing of its own: each stage reads the
//! checkpoint and takes its own variables by name.

use anyhow::{Context, Result};
use ringtrain_core::timeline::StageTime;
use tch::Tensor;

use super::{data_error, loss_and_tally, EvalTally, JobError, StepOutcome, StepTally, Trainer};
use crate::checkpoint::{self, CheckpointTensors, PartialEpoch};
use crate::data::shuffle::batch_indices;
use crate::pipeline::{one_forward_one_backward, state, StageLinks};
use crate::precision;

/// The prefixes that keep a checkpoint's three files apart while their tensors cross the stages' links.
const FILES: [&str; 3] = ["model/", "optimizer/", "batch_norm/"];

impl Trainer<'_> {
    fn take_links(&mut self) -> Result<StageLinks> {
        self.links.take().context("a pipeline stage trains only once given its links (with_stage_links)")
    }

    /// One iteration of this stage (see [`Trainer::train_step`]).
    pub(super) fn pipelined_step(
        &mut self,
        iteration: u64,
        step_in_epoch: usize,
        permutation: &[i64],
    ) -> Result<StepOutcome> {
        let mut links = self.take_links()?;
        let stepped = self.stage_step(&mut links, iteration, step_in_epoch, permutation);
        self.links = Some(links);
        stepped
    }

    fn stage_step(
        &mut self,
        links: &mut StageLinks,
        iteration: u64,
        step_in_epoch: usize,
        permutation: &[i64],
    ) -> Result<StepOutcome> {
        self.faults.crash_if_due(iteration, self.comm.rank());
        self.opt.zero_grad();
        let v = self.virtual_ranks();
        let first_rank = self.comm.rank() * v;
        let (n, device, total_ranks) = (self.spec.per_worker_batch as usize, self.options.device, self.total_ranks);
        let (precision, loss_kind, classes, last) =
            (self.spec.precision, self.loss, self.data.classes(), links.is_last());
        let (model, bn, data) = (&mut self.model, &mut self.bn, &mut self.data);
        let (mut loss_sum, mut wrong) = (0.0f64, 0.0f64);
        let started = std::time::Instant::now();
        let done = one_forward_one_backward(links, v, |j, inputs| {
            let indices = batch_indices(permutation, total_ranks, first_rank + j, step_in_epoch, n);
            let (x, y) = data.train_batch(indices, device).map_err(data_error)?;
            // links carry host memory: a GPU stage's inputs go to its device (the copy is differentiable, so
            // their gradients come back to the received tensors, which are sent back)
            let inputs: Vec<Tensor> = inputs.iter().map(|t| t.to_device(device)).collect();
            bn.swap_in(j);
            let out = precision::forward_in(precision, device, || model.forward_stage(&x, &inputs, true));
            bn.swap_out(j);
            let mut out = out.map_err(|e| JobError(format!("{e:#}")))?;
            if !last {
                return Ok(out);
            }
            let out = out.remove(0);
            let (loss, tally) = loss_and_tally(loss_kind, classes, &out, &y)?;
            loss_sum += loss.double_value(&[]);
            wrong += tally.double_value(&[]);
            Ok(vec![loss])
        })
        .with_context(|| format!("as pipeline stage {} of worker {}", links.stage(), self.comm.rank()))?;
        // forward and backward interleave in 1F1B: the stage's compute is counted as forward
        let (total, steps) = &mut self.stage_time;
        total.compute += done.compute;
        total.traffic.sending += done.traffic.sending;
        total.traffic.waiting += done.traffic.waiting;
        total.traffic.bytes_sent += done.traffic.bytes_sent;
        *steps += 1;
        self.times.forward += done.compute;
        self.times.backward += started.elapsed().saturating_sub(done.compute);
        let stop = self.stop_requested(iteration);
        let extras = Tensor::from_slice(&[loss_sum as f32, wrong as f32, f32::from(u8::from(stop))]);
        let reduced = self
            .reducer
            .reduce(self.opt.params(), &mut *self.comm, total_ranks as f64, &extras)
            .with_context(|| {
                format!(
                    "summing pipeline stage {}'s gradients across the workers (a rank there is a worker)",
                    links.stage()
                )
            })?;
        let all = StepTally::unpack(&state::sum_along(links, &reduced.extras)?);
        let rank_loss = all.loss_sum / total_ranks as f64;
        self.finish_step(iteration, &reduced, all, rank_loss)
    }

    /// Top-1 error and mean loss on the test split (see [`Trainer::evaluate`]), the batches passed through
    /// the worker's stages.
    pub(super) fn pipelined_evaluate(&mut self) -> Result<(f64, f64)> {
        let mut links = self.take_links()?;
        let evaluated = self.evaluate_through(&mut links);
        self.links = Some(links);
        evaluated
    }

    fn evaluate_through(&mut self, links: &mut StageLinks) -> Result<(f64, f64)> {
        let (own, range) = self.begin_evaluation()?;
        let mut mine = EvalTally::default();
        let (precision, device, loss_kind, classes) =
            (self.spec.precision, self.options.device, self.loss, self.data.classes());
        tch::no_grad(|| -> Result<()> {
            let mut start = range.start;
            while start < range.end {
                let size = self.options.eval_batch.min(range.end - start);
                let (x, y) = self.data.test_batch(start, size, device).map_err(data_error)?;
                let received = match links.is_first() {
                    true => Vec::new(),
                    false => links.receive_forward()?.iter().map(|t| t.to_device(device)).collect(),
                };
                let model = &mut self.model;
                let mut out = precision::forward_in(precision, device, || model.forward_stage(&x, &received, false))
                    .map_err(|e| JobError(format!("{e:#}")))?;
                if links.is_last() {
                    let (loss, tally) = loss_and_tally(loss_kind, classes, &out.remove(0), &y)?;
                    mine.wrong += tally.double_value(&[]) as f32;
                    mine.loss_sum += loss.double_value(&[]) as f32 * size as f32;
                    mine.seen += size as f32;
                } else {
                    links.send_forward(&out)?;
                }
                start += size;
            }
            Ok(())
        })?;
        let mut counts = mine.pack();
        self.comm.all_reduce_sum(&mut counts)?;
        let summed = state::sum_along(links, &counts)?;
        let all = EvalTally::unpack([summed[0], summed[1], summed[2]]);
        self.bn.restore(&own);
        let seen = f64::from(all.seen).max(1.0);
        Ok((self.error_from(f64::from(all.wrong), seen), f64::from(all.loss_sum) / seen))
    }

    /// Where each stage of this worker spent its training steps (every stage of the worker calls it: the
    /// figures are summed along the stages), for the result's timeline.
    pub(super) fn stage_times(&mut self) -> Result<Vec<StageTime>> {
        let mut links = self.take_links()?;
        let (stage, stages) = (links.stage(), links.stages());
        let (total, steps) = self.stage_time;
        let mut mine = vec![0f32; stages * 4];
        mine[stage * 4..stage * 4 + 4].copy_from_slice(&[
            total.compute.as_secs_f32(),
            total.traffic.waiting.as_secs_f32(),
            total.traffic.sending.as_secs_f32(),
            total.traffic.bytes_sent as f32,
        ]);
        let summed = state::sum_along(&mut links, &mine);
        self.links = Some(links);
        let all = summed?;
        Ok(all
            .chunks_exact(4)
            .enumerate()
            .map(|(s, f)| {
                let [compute, waiting, sending, bytes] = [f[0], f[1], f[2], f[3]].map(f64::from);
                StageTime::from_totals(s as u32, compute, waiting, sending, bytes, steps)
            })
            .collect())
    }

    /// A checkpoint of every stage in one: each stage's ring gathers its BatchNorm tables, worker 0's
    /// stages send their part to the first stage, which writes the unsplit model's checkpoint.
    pub(super) fn save_pipelined_checkpoint(
        &mut self,
        next_iteration: u64,
        partial: Option<PartialEpoch>,
    ) -> Result<()> {
        let (keep, history) = (self.options.out_dir.is_some(), self.history.clone());
        let snapshot = self.replica().snapshot(next_iteration, partial, &history, keep)?;
        // worker 0's stages hold their ring's snapshot; the other workers are done
        let Some((state, tensors, _)) = snapshot else { return Ok(()) };
        let mut links = self.take_links()?;
        let gathered = state::gather(&mut links, named(tensors));
        self.links = Some(links);
        let (Some(whole), Some(out)) = (gathered?, self.options.out_dir.as_ref()) else { return Ok(()) };
        checkpoint::write_with(&out.join("checkpoints"), &state, &files(whole), &|_| Ok(()))?;
        Ok(())
    }
}

/// A checkpoint's tensors as one named list, each name prefixed with its file.
fn named(tensors: CheckpointTensors) -> Vec<(String, Tensor)> {
    let CheckpointTensors { model, optimizer, batch_norm } = tensors;
    [model, optimizer, batch_norm]
        .into_iter()
        .zip(FILES)
        .flat_map(|(list, prefix)| list.into_iter().map(move |(name, t)| (format!("{prefix}{name}"), t)))
        .collect()
}

/// The inverse of [`named`].
fn files(named: Vec<(String, Tensor)>) -> CheckpointTensors {
    let mut tensors = CheckpointTensors::default();
    for (name, t) in named {
        let file = FILES.iter().position(|prefix| name.starts_with(prefix));
        let (list, rest) = match file {
            Some(0) => (&mut tensors.model, &name[FILES[0].len()..]),
            Some(1) => (&mut tensors.optimizer, &name[FILES[1].len()..]),
            Some(_) => (&mut tensors.batch_norm, &name[FILES[2].len()..]),
            None => continue,
        };
        list.push((rest.to_string(), t));
    }
    tensors
}
