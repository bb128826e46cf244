//! One rank's training loop: data-parallel synchronous SGD with Goyal et al.'s recipe.
//!
//! Per iteration t of epoch e: every (virtual) rank takes the t-th slice of n samples of its shard of the
//! epoch's shared permutation, computes the mean loss over those n samples with its own BatchNorm
//! statistics, and back-propagates; the gradients are all-reduce-summed and divided by k; every rank applies
//! the same SGD update with the lr `core`'s schedule gives for t. Virtual ranks let one process act as v
//! ranks (v micro-batches, BN per micro-batch, gradients accumulated), reproducing k workers exactly.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ringtrain_core::{Effective, JobSpec};
use tch::nn::{ModuleT, VarStore};
use tch::{Device, Kind, Tensor};

use crate::checkpoint::{self, CheckpointState, CheckpointTensors, PartialEpoch};
use crate::collective::Collective;
use crate::data::shuffle::{batch_indices, epoch_permutation};
use crate::data::Dataset;
use crate::gradients::{GradientReducer, DEFAULT_BUCKET_BYTES};
use crate::metrics::{EpochRecord, Metric, RunResult};
use crate::models;
use crate::optim::{Sgd, SgdConfig};

/// A failure of the job itself (its spec does not fit its dataset, its loss diverged): retrying it on other
/// devices would fail the same way, unlike a lost peer or a killed process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError(pub String);

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JobError {}

/// Every rank stopped at the same iteration because one was asked to (`TrainOptions::stop_file`), after
/// rank 0 wrote a checkpoint of exactly that point: resuming from it continues as if nothing happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// The next iteration, where a resumed run starts (when known: a launcher of several ranks only knows
    /// that they stopped).
    pub next_iteration: Option<u64>,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.next_iteration {
            Some(next) => write!(f, "stopped on request with a checkpoint before iteration {next}"),
            None => write!(f, "stopped on request with a checkpoint of where the ranks stopped"),
        }
    }
}

impl std::error::Error for Stopped {}

#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// Where checkpoints (`checkpoints/`) and `result.json` go (rank 0 writes them). None: nowhere.
    pub out_dir: Option<PathBuf>,
    /// A checkpoint folder (the `checkpoints/` of an earlier run) to resume from; only rank 0 reads it.
    pub resume_from: Option<PathBuf>,
    /// v: how many ranks this process plays.
    pub virtual_ranks: usize,
    pub bucket_bytes: usize,
    pub device: Device,
    /// The file of an uploaded (safetensors) dataset.
    pub dataset_file: Option<PathBuf>,
    /// Samples per forward pass when evaluating.
    pub eval_batch: usize,
    /// Fault injection for tests: abort this process (like a crash or kill -9: no clean-up, no unwinding)
    /// when it is about to take this global iteration.
    pub crash_at_iteration: Option<u64>,
    /// Fault injection for tests: feed this process NaN inputs at this global iteration (bad data).
    pub nan_inputs_at_iteration: Option<u64>,
    /// When this file exists, this rank asks every rank to stop after the current iteration with a
    /// checkpoint of it (the agent creates it on preemption). Looked at once per iteration.
    pub stop_file: Option<PathBuf>,
    /// For tests: ask to stop (as if the stop file appeared) at this global iteration.
    pub stop_at_iteration: Option<u64>,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            out_dir: None,
            resume_from: None,
            virtual_ranks: 1,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            device: Device::Cpu,
            dataset_file: None,
            eval_batch: 1000,
            crash_at_iteration: None,
            nan_inputs_at_iteration: None,
            stop_file: None,
            stop_at_iteration: None,
        }
    }
}

/// Seconds spent in each phase of the training steps so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseTimes {
    pub forward: Duration,
    pub backward: Duration,
    pub allreduce: Duration,
    pub optimizer: Duration,
    pub steps: u64,
}

impl PhaseTimes {
    pub fn total(&self) -> Duration {
        self.forward + self.backward + self.allreduce + self.optimizer
    }
}

/// What one iteration produced.
#[derive(Debug, Clone, Copy)]
pub struct StepOutcome {
    pub lr: f64,
    /// Mean loss over all k ranks.
    pub loss: f64,
    /// This process's mean loss over its v micro-batches.
    pub rank_loss: f64,
    /// Misclassified samples over all k ranks.
    pub wrong: f64,
    pub allreduce: Duration,
    /// Some rank asked to stop after this iteration (the same answer on every rank).
    pub stop: bool,
}

/// The running BatchNorm statistics: per rank, never synchronised (Goyal §2.3). With virtual ranks each
/// virtual rank keeps its own table, swapped in around its micro-batch.
#[derive(Debug)]
struct BatchNormState {
    buffers: Vec<(String, Tensor)>,
    /// One flat table per virtual rank of this process (only used when v > 1).
    tables: Vec<Vec<f32>>,
}

impl BatchNormState {
    fn new(vs: &VarStore, virtual_ranks: usize) -> BatchNormState {
        let mut buffers: Vec<(String, Tensor)> =
            vs.variables().into_iter().filter(|(_, t)| !t.requires_grad()).collect();
        buffers.sort_by(|a, b| a.0.cmp(&b.0));
        let mut state = BatchNormState { buffers, tables: Vec::new() };
        let initial = state.snapshot();
        state.tables = vec![initial; if virtual_ranks > 1 { virtual_ranks } else { 0 }];
        state
    }

    fn len(&self) -> usize {
        self.buffers.iter().map(|(_, t)| t.numel()).sum()
    }

    fn snapshot(&self) -> Vec<f32> {
        flatten(self.buffers.iter().map(|(_, t)| t))
    }

    fn restore(&self, flat: &[f32]) {
        unflatten_into(flat, self.buffers.iter().map(|(_, t)| t));
    }

    /// The table of virtual rank j of this process (the live buffers when v = 1).
    fn table(&self, j: usize) -> Vec<f32> {
        if self.tables.is_empty() {
            self.snapshot()
        } else {
            self.tables[j].clone()
        }
    }

    fn set_table(&mut self, j: usize, flat: Vec<f32>) {
        if self.tables.is_empty() {
            self.restore(&flat);
        } else {
            self.tables[j] = flat;
        }
    }
}

/// A u64 as four 16-bit pieces, each exact in an f32: how exact integers and f64 bits travel through the
/// f32 broadcast.
fn pack_u64(value: u64) -> [f32; 4] {
    [0, 16, 32, 48].map(|shift| ((value >> shift) & 0xFFFF) as f32)
}

fn unpack_u64(pieces: &[f32]) -> u64 {
    pieces.iter().zip([0, 16, 32, 48]).fold(0, |acc, (&p, shift)| acc | ((p as u64) << shift))
}

fn flatten<'a>(tensors: impl Iterator<Item = &'a Tensor>) -> Vec<f32> {
    let mut out = Vec::new();
    for t in tensors {
        let host = t.to_kind(Kind::Float).to_device(Device::Cpu).contiguous();
        let n = host.numel();
        let start = out.len();
        out.resize(start + n, 0.0);
        host.copy_data(&mut out[start..], n);
    }
    out
}

fn unflatten_into<'a>(flat: &[f32], tensors: impl Iterator<Item = &'a Tensor>) {
    let mut offset = 0;
    tch::no_grad(|| {
        for t in tensors {
            let n = t.numel();
            let src = Tensor::from_slice(&flat[offset..offset + n]).view(t.size().as_slice()).to_device(t.device());
            let mut dst = t.shallow_clone();
            dst.copy_(&src);
            offset += n;
        }
    });
}

pub struct Trainer<'c> {
    spec: JobSpec,
    effective: Effective,
    data: Dataset,
    _vs: VarStore,
    model: Box<dyn ModuleT>,
    opt: Sgd,
    reducer: GradientReducer,
    bn: BatchNormState,
    comm: &'c mut dyn Collective,
    options: TrainOptions,
    /// k: every rank of the job, virtual ones included.
    total_ranks: usize,
    pub times: PhaseTimes,
    history: Vec<EpochRecord>,
    start_epoch: u64,
    /// Where training starts: `start_epoch * iterations_per_epoch`, or later when resuming mid-epoch.
    start_iteration: u64,
    /// The interrupted epoch's running sums when resuming mid-epoch.
    start_partial: PartialEpoch,
}

impl std::fmt::Debug for Trainer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer").field("rank", &self.comm.rank()).field("total_ranks", &self.total_ranks).finish()
    }
}

impl<'c> Trainer<'c> {
    /// Loads the data, builds the model from the spec's seed, makes every rank's weights rank 0's, and
    /// resumes from a checkpoint when asked.
    pub fn new(spec: &JobSpec, comm: &'c mut dyn Collective, options: TrainOptions) -> Result<Trainer<'c>> {
        let v = options.virtual_ranks.max(1);
        let total_ranks = comm.world_size() * v;
        ensure!(
            total_ranks == spec.workers as usize,
            "the spec asks for workers = {} ranks, but {} processes × {v} virtual ranks make {total_ranks}",
            spec.workers,
            comm.world_size()
        );
        let data = match &options.dataset_file {
            Some(path) => Dataset::load_safetensors(path, spec.train_samples, spec.test_samples)?,
            None => Dataset::load(&spec.dataset, spec.train_samples, spec.test_samples)?,
        };
        let effective = Effective::new(spec, data.train.len() as u64)
            .map_err(|errors| JobError(format!("invalid spec for this dataset: {}", join(&errors))))?;

        tch::manual_seed(spec.seed as i64);
        let vs = VarStore::new(options.device);
        let model = models::build(&spec.model, &vs.root(), &data.sample_shape(), data.classes, spec.bn_zero_init_last)?;
        let opt = Sgd::new(&vs, SgdConfig::from_effective(&effective));
        let reducer = GradientReducer::new(opt.params(), options.bucket_bytes);
        let bn = BatchNormState::new(&vs, v);
        let mut trainer = Trainer {
            spec: spec.clone(),
            effective,
            data,
            _vs: vs,
            model,
            opt,
            reducer,
            bn,
            comm,
            options,
            total_ranks,
            times: PhaseTimes::default(),
            history: Vec::new(),
            start_epoch: 0,
            start_iteration: 0,
            start_partial: PartialEpoch::default(),
        };
        trainer.synchronise_start()?;
        Ok(trainer)
    }

    pub fn effective(&self) -> &Effective {
        &self.effective
    }

    fn virtual_ranks(&self) -> usize {
        self.options.virtual_ranks.max(1)
    }

    fn is_root(&self) -> bool {
        self.comm.rank() == 0
    }

    /// Rank 0 reads the checkpoint (if resuming), then broadcasts the epoch to start at, the weights, and
    /// on resume the momentum buffers and every rank's BatchNorm statistics.
    fn synchronise_start(&mut self) -> Result<()> {
        let mut loaded: Option<(CheckpointState, CheckpointTensors)> = None;
        if self.is_root() {
            if let Some(root) = &self.options.resume_from {
                if let Some(dir) = checkpoint::latest(root)? {
                    loaded = Some(checkpoint::read(&dir)?);
                }
            }
        }
        // Where to start, bit-exact: the next iteration and the interrupted epoch's sums, as 16-bit pieces.
        let (next, partial) = loaded
            .as_ref()
            .map_or((0, PartialEpoch::default()), |(s, _)| (s.next_iteration, s.partial.unwrap_or_default()));
        let mut header = [next, partial.loss_sum.to_bits(), partial.wrong_sum.to_bits(), partial.seconds.to_bits()]
            .iter()
            .flat_map(|&v| pack_u64(v))
            .collect::<Vec<f32>>();
        self.comm.broadcast(&mut header, 0)?;
        let words: Vec<u64> = header.chunks(4).map(unpack_u64).collect();
        self.start_iteration = words[0];
        self.start_partial = PartialEpoch {
            loss_sum: f64::from_bits(words[1]),
            wrong_sum: f64::from_bits(words[2]),
            seconds: f64::from_bits(words[3]),
        };
        self.start_epoch = self.start_iteration / self.effective.iterations_per_epoch.max(1);

        if let Some((state, tensors)) = &loaded {
            ensure!(
                state.seed == self.spec.seed,
                "the checkpoint was made with seed {}, the spec says {}",
                state.seed,
                self.spec.seed
            );
            ensure!(
                state.world == self.total_ranks,
                "the checkpoint has {} ranks' BN statistics, this run has {}",
                state.world,
                self.total_ranks
            );
            for p in self.opt.params() {
                let saved = find(&tensors.model, &p.name)?;
                tch::no_grad(|| p.tensor.shallow_clone().copy_(saved));
            }
            self.opt.load_state(&tensors.optimizer)?;
            self.history = state.history.clone();
        }

        let params: Vec<Tensor> = self.opt.params().iter().map(|p| p.tensor.shallow_clone()).collect();
        let mut flat = flatten(params.iter());
        self.comm.broadcast(&mut flat, 0)?;
        unflatten_into(&flat, params.iter());

        if self.start_iteration > 0 {
            let momentum: Vec<Tensor> = self.opt.state().into_iter().map(|(_, t)| t).collect();
            let mut flat = flatten(momentum.iter());
            self.comm.broadcast(&mut flat, 0)?;
            unflatten_into(&flat, momentum.iter());
            self.opt.set_last_lr(self.start_iteration.checked_sub(1).map(|t| self.effective.lr_at(t)));

            let b = self.bn.len();
            let mut all = vec![0.0f32; b * self.total_ranks];
            if let Some((_, tensors)) = &loaded {
                for vr in 0..self.total_ranks {
                    for (offset, (name, t)) in offsets(&self.bn.buffers) {
                        let saved = find(&tensors.batch_norm, &format!("rank{vr}.{name}"))?;
                        let n = t.numel();
                        saved
                            .to_kind(Kind::Float)
                            .contiguous()
                            .copy_data(&mut all[vr * b + offset..vr * b + offset + n], n);
                    }
                }
            }
            self.comm.broadcast(&mut all, 0)?;
            let first = self.comm.rank() * self.virtual_ranks();
            for j in 0..self.virtual_ranks() {
                let vr = first + j;
                self.bn.set_table(j, all[vr * b..(vr + 1) * b].to_vec());
            }
        }
        Ok(())
    }

    /// One iteration: forward/backward of every virtual rank's batch, the gradient all-reduce, the update.
    pub fn train_step(&mut self, iteration: u64, step_in_epoch: usize, permutation: &[i64]) -> Result<StepOutcome> {
        let v = self.virtual_ranks();
        let n = self.spec.per_worker_batch as usize;
        let device = self.options.device;
        if self.options.crash_at_iteration == Some(iteration) {
            eprintln!("rank {}: crashing at iteration {iteration} (fault injection)", self.comm.rank());
            std::process::abort();
        }
        self.opt.zero_grad();
        let mut rank_loss = 0.0;
        let mut wrong = 0.0;
        for j in 0..v {
            let virtual_rank = self.comm.rank() * v + j;
            if v > 1 {
                self.bn.restore(&self.bn.tables[j]);
            }
            let indices = batch_indices(permutation, self.total_ranks, virtual_rank, step_in_epoch, n);
            let (mut x, y) = self.data.train_batch(indices, device);
            if self.options.nan_inputs_at_iteration == Some(iteration) {
                x *= f64::NAN;
            }
            let started = Instant::now();
            let logits = self.model.forward_t(&x, true);
            let loss = logits.cross_entropy_for_logits(&y);
            self.times.forward += started.elapsed();
            let started = Instant::now();
            loss.backward();
            self.times.backward += started.elapsed();
            rank_loss += loss.double_value(&[]);
            wrong += logits.argmax(-1, false).ne_tensor(&y).sum(Kind::Int64).int64_value(&[]) as f64;
            if v > 1 {
                self.bn.tables[j] = self.bn.snapshot();
            }
        }
        // the loss sum, the error count and the stop request ride along with the gradients
        let mut extras = [rank_loss as f32, wrong as f32, f32::from(u8::from(self.stop_requested(iteration)))];
        let (grads, allreduce) =
            self.reducer.reduce(self.opt.params(), &mut *self.comm, self.total_ranks as f64, &mut extras)?;
        self.times.allreduce += allreduce;
        let loss = f64::from(extras[0]) / self.total_ranks as f64;
        if !loss.is_finite() {
            return Err(JobError(format!(
                "the training loss became {loss} at iteration {iteration} (lr {}): stopping; the last good checkpoint is kept",
                self.effective.lr_at(iteration)
            ))
            .into());
        }
        let lr = self.effective.lr_at(iteration);
        let started = Instant::now();
        self.opt.step(lr, &grads);
        self.times.optimizer += started.elapsed();
        self.times.steps += 1;
        Ok(StepOutcome {
            lr,
            loss,
            rank_loss: rank_loss / v as f64,
            wrong: f64::from(extras[1]),
            allreduce,
            stop: extras[2] > 0.0,
        })
    }

    fn stop_requested(&self, iteration: u64) -> bool {
        self.options.stop_at_iteration == Some(iteration) || self.options.stop_file.as_ref().is_some_and(|f| f.exists())
    }

    /// Top-1 error and mean loss on the whole test split, split across processes, with rank 0's BatchNorm
    /// statistics (as PyTorch DDP evaluates); each rank's own statistics are put back afterwards.
    pub fn evaluate(&mut self) -> Result<(f64, f64)> {
        let own = self.bn.snapshot();
        if self.bn.len() > 0 {
            let mut rank0 = self.bn.table(0);
            self.comm.broadcast(&mut rank0, 0)?;
            self.bn.restore(&rank0);
        }
        let (p, world) = (self.comm.rank(), self.comm.world_size());
        let len = self.data.test.len();
        let range = p * len / world..(p + 1) * len / world;
        let mut counts = [0.0f32; 3]; // wrong, seen, loss sum
        tch::no_grad(|| {
            let mut start = range.start;
            while start < range.end {
                let size = self.options.eval_batch.min(range.end - start);
                let (x, y) = self.data.test_batch(start, size, self.options.device);
                let logits = self.model.forward_t(&x, false);
                counts[0] += logits.argmax(-1, false).ne_tensor(&y).sum(Kind::Int64).int64_value(&[]) as f32;
                counts[1] += size as f32;
                counts[2] += logits.cross_entropy_for_logits(&y).double_value(&[]) as f32 * size as f32;
                start += size;
            }
        });
        self.comm.all_reduce_sum(&mut counts)?;
        self.bn.restore(&own);
        let seen = f64::from(counts[1]).max(1.0);
        Ok((f64::from(counts[0]) / seen, f64::from(counts[2]) / seen))
    }

    /// Every rank's BatchNorm running statistics (name-sorted buffers, flattened), gathered on all ranks
    /// with an all-reduce of a zeroed table in which each rank fills its own slots. Indexed by virtual rank:
    /// rank r's table is `[r * len .. (r + 1) * len]`.
    pub fn gather_batch_norm(&mut self) -> Result<Vec<f32>> {
        let b = self.bn.len();
        let mut all = vec![0.0f32; b * self.total_ranks];
        let first = self.comm.rank() * self.virtual_ranks();
        for j in 0..self.virtual_ranks() {
            all[(first + j) * b..(first + j + 1) * b].copy_from_slice(&self.bn.table(j));
        }
        self.comm.all_reduce_sum(&mut all)?;
        Ok(all)
    }

    /// Rank 0 writes a checkpoint from which training resumes at `next_iteration` (an epoch boundary, or
    /// mid-epoch with the interrupted epoch's `partial` sums); every rank takes part in gathering the
    /// BatchNorm statistics.
    fn write_checkpoint(&mut self, next_iteration: u64, partial: Option<PartialEpoch>) -> Result<()> {
        let epochs_done = next_iteration / self.effective.iterations_per_epoch.max(1);
        let all_bn = self.gather_batch_norm()?;
        let Some(out) = self.options.out_dir.clone().filter(|_| self.is_root()) else { return Ok(()) };
        let b = self.bn.len();
        let mut model: Vec<(String, Tensor)> =
            self.opt.params().iter().map(|p| (p.name.clone(), p.tensor.detach().copy())).collect();
        let mut batch_norm = Vec::new();
        for (offset, (name, t)) in offsets(&self.bn.buffers) {
            let shape = t.size();
            let n = t.numel();
            // the model file carries rank 0's statistics: the ones evaluation uses
            model.push((name.clone(), Tensor::from_slice(&all_bn[offset..offset + n]).view(shape.as_slice())));
            for vr in 0..self.total_ranks {
                let at = vr * b + offset;
                batch_norm
                    .push((format!("rank{vr}.{name}"), Tensor::from_slice(&all_bn[at..at + n]).view(shape.as_slice())));
            }
        }
        let state = CheckpointState {
            epochs_done,
            next_iteration,
            last_lr: next_iteration.checked_sub(1).map(|t| self.effective.lr_at(t)),
            seed: self.spec.seed,
            world: self.total_ranks,
            history: self.history.clone(),
            partial,
        };
        let tensors = CheckpointTensors { model, optimizer: self.opt.state(), batch_norm };
        checkpoint::write(&out.join("checkpoints"), &state, &tensors)?;
        Ok(())
    }

    /// Trains from the start epoch to the end, reporting through `sink`; rank 0 writes checkpoints and
    /// `result.json`.
    pub fn run(&mut self, sink: &mut dyn FnMut(&Metric)) -> Result<RunResult> {
        let run_started = Instant::now();
        let eff = self.effective.clone();
        let ipe = eff.iterations_per_epoch as usize;
        let rank = self.comm.rank();
        let log_every = u64::from(self.spec.log_every_iterations.max(1));
        let global_batch = eff.global_batch as f64;
        let mut training_time = Duration::ZERO;
        let mut trained_steps = 0u64;
        for epoch in self.start_epoch..u64::from(eff.epochs) {
            let epoch_started = Instant::now();
            let permutation = epoch_permutation(self.spec.seed, epoch, self.data.train.len());
            // A run resumed mid-epoch continues the interrupted epoch's sums and step.
            let resumed = epoch == self.start_epoch;
            let first_step = if resumed { (self.start_iteration - epoch * ipe as u64) as usize } else { 0 };
            let carried = if resumed { self.start_partial } else { PartialEpoch::default() };
            let (mut loss_sum, mut wrong_sum) = (carried.loss_sum, carried.wrong_sum);
            let mut window = (Instant::now(), 0u64, Duration::ZERO);
            let mut stop = false;
            for t in first_step..ipe {
                let iteration = epoch * ipe as u64 + t as u64;
                let outcome = self.train_step(iteration, t, &permutation)?;
                loss_sum += outcome.loss;
                wrong_sum += outcome.wrong;
                window.1 += 1;
                window.2 += outcome.allreduce;
                if (iteration + 1) % log_every == 0 || t + 1 == ipe {
                    let elapsed = window.0.elapsed().as_secs_f64().max(1e-9);
                    sink(&Metric::Iteration {
                        rank,
                        epoch,
                        iteration,
                        lr: outcome.lr,
                        loss: outcome.loss,
                        rank_loss: outcome.rank_loss,
                        samples_per_s: window.1 as f64 * global_batch / elapsed,
                        allreduce_s: window.2.as_secs_f64(),
                    });
                    window = (Instant::now(), 0, Duration::ZERO);
                }
                stop = outcome.stop;
                if stop && t + 1 < ipe {
                    let seconds = carried.seconds + epoch_started.elapsed().as_secs_f64();
                    self.write_checkpoint(iteration + 1, Some(PartialEpoch { loss_sum, wrong_sum, seconds }))?;
                    return Err(Stopped { next_iteration: Some(iteration + 1) }.into());
                }
            }
            training_time += epoch_started.elapsed();
            trained_steps += (ipe - first_step) as u64;
            let (test_error, test_loss) = self.evaluate()?;
            let record = EpochRecord {
                rank,
                epoch,
                iteration: (epoch + 1) * ipe as u64 - 1,
                train_loss: loss_sum / ipe as f64,
                train_error: wrong_sum / (ipe as f64 * global_batch),
                test_error,
                test_loss,
                seconds: carried.seconds + epoch_started.elapsed().as_secs_f64(),
            };
            sink(&Metric::Epoch(record.clone()));
            self.history.push(record);
            let done = epoch + 1;
            let every = u64::from(self.spec.checkpoint_every_epochs);
            // A stop asked for in an epoch's last step is served by the epoch's checkpoint.
            if done == u64::from(eff.epochs) || (every > 0 && done % every == 0) || stop {
                self.write_checkpoint(done * ipe as u64, None)?;
            }
            if stop && done < u64::from(eff.epochs) {
                return Err(Stopped { next_iteration: Some(done * ipe as u64) }.into());
            }
        }
        let result = RunResult {
            spec: self.spec.clone(),
            effective: eff.clone(),
            schedule: eff.render(false),
            epochs: self.history.clone(),
            final_test_error: self.history.last().map_or(f64::NAN, |r| r.test_error),
            wall_seconds: run_started.elapsed().as_secs_f64(),
            samples_per_s: trained_steps as f64 * global_batch / training_time.as_secs_f64().max(1e-9),
            communication_fraction: self.times.allreduce.as_secs_f64() / self.times.total().as_secs_f64().max(1e-9),
            processes: self.comm.world_size(),
            virtual_ranks: self.virtual_ranks(),
        };
        if let Some(out) = self.options.out_dir.as_ref().filter(|_| rank == 0) {
            let path = out.join("result.json");
            let tmp = out.join("result.json.tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&result)?)
                .with_context(|| format!("cannot write {}", tmp.display()))?;
            std::fs::rename(&tmp, &path)?;
        }
        Ok(result)
    }
}

fn offsets(buffers: &[(String, Tensor)]) -> Vec<(usize, &(String, Tensor))> {
    let mut offset = 0;
    buffers
        .iter()
        .map(|entry| {
            let at = offset;
            offset += entry.1.numel();
            (at, entry)
        })
        .collect()
}

fn find<'a>(named: &'a [(String, Tensor)], name: &str) -> Result<&'a Tensor> {
    named
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .with_context(|| format!("the checkpoint has no tensor {name}"))
}

fn join(errors: &[ringtrain_core::FieldError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
