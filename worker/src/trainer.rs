//! One rank's training loop: data-parallel synchronous SGD with Goyal et al.'s recipe.
//!
//! Per iteration t of epoch e: every (virtual) rank takes the t-th slice of n samples of its shard of the
//! epoch's shared permutation, computes the mean loss over those n samples with its own BatchNorm
//! statistics, and back-propagates; the gradients are all-reduce-summed and divided by k; every rank applies
//! the same SGD update with the lr `core`'s schedule gives for t. Virtual ranks let one process act as v
//! ranks (v micro-batches, BN per micro-batch, gradients accumulated), reproducing k workers exactly.
//!
//! This module is the step; the epoch loop around it is in [`epochs`]; a trainer that is one stage of its
//! worker's pipeline steps, evaluates and checkpoints as [`pipelined`] says. The per-rank BatchNorm tables live in
//! [`crate::batch_norm`]; what a checkpoint holds and how the ranks agree on where to start, in
//! [`crate::checkpoint`]; the faults tests inject, in [`crate::faults`].
//!
//! Over 450 lines because the step is one piece (batch, forward per virtual rank, backward, all-reduce,
//! update) whose order is the recipe; everything around it is already in the modules named above.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use ringtrain_core::spec::Loss;
use ringtrain_core::{DatasetRef, Effective, JobSpec};
use tch::nn::VarStore;
use tch::{Device, Kind, Reduction, Tensor};

use crate::batch_norm::BatchNormState;
use crate::checkpoint::{PartialEpoch, Replica, StartPoint};
use crate::collective::Collective;
use crate::data::shuffle::batch_indices;
use crate::data::{Dataset, Labels, ShardOptions, ON_DEVICE_MAX_BYTES};
use crate::faults::FaultInjection;
use crate::gradients::{
    flat_gradients, reduce_in_rank_order, GradientReducer, OverlappedReducer, DEFAULT_BUCKET_BYTES,
    DEFAULT_OVERLAP_BUCKET_BYTES,
};
use crate::metrics::EpochRecord;
use crate::models::{self, Composite, Network, OperatorCheck, Scripted};
use crate::optim::{Sgd, SgdConfig};
use crate::pipeline::StageLinks;
use crate::precision;

mod epochs;
mod guard;
mod pipelined;

/// A failure of the job itself (its spec does not fit its dataset, its loss diverged): retrying it on other
/// devices would fail the same way, unlike a lost peer or a killed process.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JobError(pub String);

/// Every rank stopped at the same iteration because one was asked to (`TrainOptions::stop_file`), after
/// rank 0 wrote a checkpoint of exactly that point: resuming from it continues as if nothing happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe_stop(.next_iteration))]
pub struct Stopped {
    /// The next iteration, where a resumed run starts (when known: a launcher of several ranks only knows
    /// that they stopped).
    pub next_iteration: Option<u64>,
}

fn describe_stop(next_iteration: &Option<u64>) -> String {
    match next_iteration {
        Some(next) => format!("stopped on request with a checkpoint before iteration {next}"),
        None => "stopped on request with a checkpoint of where the ranks stopped".to_string(),
    }
}

#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// Where checkpoints (`checkpoints/`) and `result.json` go (rank 0 writes them). None: nowhere.
    pub out_dir: Option<PathBuf>,
    /// A checkpoint folder (the `checkpoints/` of an earlier run) to resume from; only rank 0 reads it.
    pub resume_from: Option<PathBuf>,
    /// A fork's starting checkpoint (the spec's `init_from`, laid out as a resume folder), used when there
    /// is nothing to resume; only rank 0 reads it.
    pub init_from: Option<PathBuf>,
    /// v: how many ranks this process plays.
    pub virtual_ranks: usize,
    pub bucket_bytes: usize,
    /// Sum gradients while backward still runs (see [`crate::gradients::OverlappedReducer`]), in a job of
    /// several processes that is not elastic. False (the default): after backward, in `bucket_bytes`
    /// buckets. Off by default: on CPUs the overlap's communication takes the cores backward needs, and on
    /// GPUs (NCCL on a stream of its own) it has not run yet.
    pub overlap_backward: bool,
    /// The overlapped reducer's bucket size.
    pub overlap_bucket_bytes: usize,
    pub device: Device,
    /// The file of an uploaded (safetensors) dataset.
    pub dataset_file: Option<PathBuf>,
    /// The TorchScript file of the spec's uploaded model (`model.uploaded`).
    pub model_file: Option<PathBuf>,
    /// The uploaded model's inputs in `forward`'s order: the dataset's tensors `x.NAME` (and `x_test.NAME`).
    /// None: the dataset's one `x`.
    pub model_inputs: Option<Vec<String>>,
    /// Samples per forward pass when evaluating.
    pub eval_batch: usize,
    /// When this file exists, this rank asks every rank to stop after the current iteration with a
    /// checkpoint of it (the agent creates it on preemption). Looked at once per iteration.
    pub stop_file: Option<PathBuf>,
    /// Wait for the GPU at each phase boundary so [`PhaseTimes`] are GPU times, not kernel-launch times
    /// (benchmarks only: it costs the overlap of host and device).
    pub sync_phases: bool,
    /// Whether an uploaded model's operators are checked against the allow-list (always, but in the
    /// sandbox's own tests).
    pub operator_check: OperatorCheck,
    /// When the rank's work began (its command's entry), for the timeline's start-up; default: when the
    /// trainer was made.
    pub started: Option<Instant>,
    /// Take the optimizer step in one pass over each CPU parameter (the default; see `optim`); false: with
    /// libtorch's tensor ops, the same bits more slowly (`bench train --optimizer tensor-ops` compares them).
    pub fused_optimizer: bool,
    /// A GPU rank keeps the data set on its device when it holds at most this many bytes, and gathers each
    /// batch there (default [`ON_DEVICE_MAX_BYTES`]); 0: each batch is gathered on the host and copied
    /// (`bench train --data host` compares the two). No effect on CPU ranks.
    pub data_on_device_max_bytes: u64,
    /// Threads that decode a sharded data set's images ahead of the steps (`shards:` data sets).
    pub loader_threads: usize,
    /// This process is one stage of its worker's pipeline (a built-in ResNet cut at named layers); its
    /// links to the worker's other stages come with [`Trainer::with_stage_links`], and `comm` is the ring
    /// of this stage across the workers. None: the whole model.
    pub pipeline: Option<PipelineStage>,
}

/// Which stage of the worker's pipeline a process is, and where the model is split: a built-in ResNet's
/// `cuts`, or the `modules` each stage of a composite uploaded model runs (the spec's `placement`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PipelineStage {
    pub stage: usize,
    pub cuts: Vec<String>,
    pub modules: Vec<Vec<String>>,
}

/// An uploaded model: one TorchScript file, or a composite model's archive (this stage's modules when the
/// job splits it).
fn load_uploaded(file: &std::path::Path, vs: &VarStore, options: &TrainOptions) -> Result<Network> {
    if !models::composite::is_archive(file) {
        ensure!(
            options.pipeline.is_none(),
            "a model of one TorchScript file is not split into stages: upload a composite model (an archive of modules)"
        );
        return Ok(Network::Scripted(Scripted::load_with(file, &vs.root(), options.operator_check)?));
    }
    let stage = match &options.pipeline {
        Some(PipelineStage { stage, modules, .. }) if !modules.is_empty() => Some((modules.as_slice(), *stage)),
        Some(_) => bail!("a composite model is split by placement.stages, not cut"),
        None => None,
    };
    let composite = Composite::load(file, &vs.root(), options.operator_check, stage)?;
    // the data set's inputs arrive in the order the rank was given them; the modules find them in the
    // manifest's order
    let takes = composite.manifest().data_inputs();
    let given = options.model_inputs.clone().unwrap_or_default();
    ensure!(
        given == takes,
        "its modules take the data set's {} in this order (its composite.json), but the rank was given {}",
        takes.join(", "),
        if given.is_empty() { "its one x".to_string() } else { given.join(", ") }
    );
    Ok(Network::Composite(composite))
}

/// The side images of a `shards:` data set are cropped to when the spec names none (ImageNet's ResNets').
pub const DEFAULT_IMAGE_SIZE: u32 = 224;

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            out_dir: None,
            resume_from: None,
            init_from: None,
            virtual_ranks: 1,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            overlap_backward: false,
            overlap_bucket_bytes: DEFAULT_OVERLAP_BUCKET_BYTES,
            device: Device::Cpu,
            dataset_file: None,
            model_file: None,
            model_inputs: None,
            eval_batch: 1000,
            stop_file: None,
            sync_phases: false,
            operator_check: OperatorCheck::Enforced,
            started: None,
            fused_optimizer: true,
            loader_threads: 1,
            data_on_device_max_bytes: ON_DEVICE_MAX_BYTES,
            pipeline: None,
        }
    }
}

/// Seconds spent in each phase of the training steps so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseTimes {
    pub forward: Duration,
    pub backward: Duration,
    /// The exposed all-reduce: what the steps waited for communication after backward.
    pub allreduce: Duration,
    pub optimizer: Duration,
    /// Every all-reduce, overlapped with backward or not (equal to `allreduce` without overlap).
    pub allreduce_total: Duration,
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
    /// The error tally over all k ranks: misclassified samples, or for value labels the sum over samples of
    /// each sample's mean squared error.
    pub wrong: f64,
    pub allreduce: Duration,
    /// Some rank asked to stop after this iteration (the same answer on every rank).
    pub stop: bool,
}

pub struct Trainer<'c> {
    spec: JobSpec,
    effective: Effective,
    data: Dataset,
    _vs: VarStore,
    model: Network,
    loss: Loss,
    opt: Sgd,
    reducer: GradientReducer,
    /// Some when the step overlaps the all-reduce with backward (see [`TrainOptions::overlap_backward`]).
    overlapped: Option<OverlappedReducer>,
    bn: BatchNormState,
    comm: &'c mut dyn Collective,
    options: TrainOptions,
    faults: FaultInjection,
    /// k: every rank of the job, virtual ones included.
    total_ranks: usize,
    pub times: PhaseTimes,
    history: Vec<EpochRecord>,
    /// Where training starts: iteration 0, or where the checkpoint it resumed from was taken.
    start: StartPoint,
    /// Time spent so far outside the steps' phases, for the result's timeline.
    spent: Spent,
    /// A pipeline stage's links to its worker's other stages (see [`TrainOptions::pipeline`]).
    links: Option<StageLinks>,
    /// A pipeline stage's training steps so far: its compute and traffic summed, and their count.
    stage_time: (crate::pipeline::StageStep, u64),
}

/// Where a run's time went besides its steps' phases (see [`crate::metrics::Timeline`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spent {
    /// When the rank began: [`TrainOptions::started`], or when the trainer was made.
    pub began: Instant,
    pub steps: Duration,
    pub evaluation: Duration,
    pub checkpoint: Duration,
    pub reporting: Duration,
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
        let began = options.started.unwrap_or_else(Instant::now);
        let v = options.virtual_ranks.max(1);
        let total_ranks = comm.world_size() * v;
        ensure!(
            total_ranks == spec.workers as usize,
            "the spec asks for workers = {} ranks, but {} processes × {v} virtual ranks make {total_ranks}",
            spec.workers,
            comm.world_size()
        );
        // The data set and the model are the job's own: if they cannot be loaded or built, another attempt
        // on other devices fails the same way (a job error, not retried).
        let shards = ShardOptions {
            image_size: spec.image_size.unwrap_or(DEFAULT_IMAGE_SIZE),
            threads: options.loader_threads,
            seed: spec.seed,
            augment: spec.augment.unwrap_or_default() == ringtrain_core::spec::Augment::Goyal,
            train_samples: spec.train_samples,
            test_samples: spec.test_samples,
            // a bucket's shards arrive while the rank trains (the agent streams them into its cache)
            streamed: options.dataset_file.is_some() && spec.dataset.bucket_url().is_some(),
            inputs: options.model_inputs.clone(),
        };
        let loaded = match (&options.dataset_file, &spec.dataset) {
            // a bucket's shards, which the agent streams into its cache (a folder it passes open)
            (Some(folder), DatasetRef::Shards { .. }) => Dataset::load_shards(folder, &shards),
            (Some(path), _) => {
                Dataset::load_safetensors(path, options.model_inputs.as_deref(), spec.train_samples, spec.test_samples)
            }
            (None, DatasetRef::Shards { path }) if spec.dataset.bucket_url().is_some() => Err(anyhow::anyhow!(
                "{path} is in a bucket: pass the folder its agent copied it into with --dataset-file"
            )),
            (None, DatasetRef::Shards { path }) => Dataset::load_shards(std::path::Path::new(path), &shards),
            (None, other) => Dataset::load(other, spec.train_samples, spec.test_samples),
        };
        let mut data = loaded.map_err(|e| JobError(format!("the data set cannot be used: {e:#}")))?;
        if data.holds_named_tensors() && spec.model.uploaded.is_none() {
            let why = "the data set's samples are named tensors: train an uploaded model on it".to_string();
            return Err(JobError(why).into());
        }
        data.place_on(options.device, options.data_on_device_max_bytes);
        let effective = Effective::new(spec, data.train_len() as u64)
            .map_err(|errors| JobError(format!("invalid spec for this dataset: {}", join(&errors))))?;

        let loss = training_loss(spec.loss, data.labels).map_err(JobError)?;

        tch::manual_seed(spec.seed as i64);
        let vs = VarStore::new(options.device);
        let model = match (spec.model.uploaded, &options.model_file) {
            (Some(_), Some(file)) => load_uploaded(file, &vs, &options)
                .map_err(|e| JobError(format!("the uploaded model cannot be used: {e:#}")))?,
            (Some(id), None) => {
                let why = format!("model {id} is an upload: pass its file with --model-file (the agent does this)");
                return Err(JobError(why).into());
            }
            (None, _) => {
                let (shape, classes, zero_last) = (data.sample_shape(), data.classes(), spec.bn_zero_init_last);
                let built = match &options.pipeline {
                    Some(PipelineStage { stage, cuts, .. }) => {
                        models::build_stage(&spec.model, &vs, &shape, classes, zero_last, cuts, *stage)
                    }
                    None => models::build(&spec.model, &vs.root(), &shape, classes, zero_last),
                };
                Network::BuiltIn(
                    built.map_err(|e| JobError(format!("the model cannot be built for this data: {e:#}")))?,
                )
            }
        };
        if options.pipeline.is_some() {
            ensure!(!spec.is_elastic(), JobError("an elastic job is not cut into stages yet".into()));
        }
        let mut opt = Sgd::with_rules(&vs, SgdConfig::from_effective(&effective), &|name, t| model.param_kind(name, t));
        if !options.fused_optimizer {
            opt = opt.with_tensor_ops();
        }
        let reducer = GradientReducer::new(opt.params(), options.bucket_bytes);
        let overlap =
            options.overlap_backward && comm.world_size() > 1 && !spec.is_elastic() && options.pipeline.is_none();
        let overlapped = match overlap {
            true => Some(OverlappedReducer::new(opt.params(), options.overlap_bucket_bytes)?),
            false => None,
        };
        let mut bn = BatchNormState::new(&vs, v);
        let (start, history) = Replica {
            comm: &mut *comm,
            opt: &mut opt,
            bn: &mut bn,
            total_ranks,
            seed: spec.seed,
            effective: &effective,
            script: None,
        }
        .agree_on_start(
            options.resume_from.as_deref(),
            spec.init_from.is_some(),
            options.init_from.as_deref(),
        )?;
        Ok(Trainer {
            spec: spec.clone(),
            effective,
            data,
            _vs: vs,
            model,
            loss,
            opt,
            reducer,
            overlapped,
            bn,
            comm,
            options,
            faults: FaultInjection::default(),
            total_ranks,
            times: PhaseTimes::default(),
            history,
            start,
            spent: Spent {
                began,
                steps: Duration::ZERO,
                evaluation: Duration::ZERO,
                checkpoint: Duration::ZERO,
                reporting: Duration::ZERO,
            },
            links: None,
            stage_time: Default::default(),
        })
    }

    /// A pipeline stage's links to its worker's other stages ([`crate::pipeline::connect`] makes them with
    /// the ring `comm` is); required before training when [`TrainOptions::pipeline`] is set.
    pub fn with_stage_links(mut self, links: StageLinks) -> Self {
        self.links = Some(links);
        self
    }

    /// Injects `faults` (tests only).
    pub fn with_faults(mut self, faults: FaultInjection) -> Self {
        self.faults = faults;
        self
    }

    /// Whether phase times wait for the GPU (see [`TrainOptions::sync_phases`]).
    pub fn sync_phases(&mut self, on: bool) {
        self.options.sync_phases = on;
    }

    /// How many buckets the all-reduce overlapped with backward sums, when it does.
    pub fn overlapped_buckets(&self) -> Option<usize> {
        self.overlapped.as_ref().map(OverlappedReducer::bucket_count)
    }

    pub fn effective(&self) -> &Effective {
        &self.effective
    }

    fn virtual_ranks(&self) -> usize {
        self.options.virtual_ranks.max(1)
    }

    /// The rank that writes checkpoints and `result.json`: rank 0, and in a pipeline worker 0's first stage.
    fn is_root(&self) -> bool {
        self.comm.rank() == 0 && self.options.pipeline.as_ref().is_none_or(|p| p.stage == 0)
    }

    fn start_epoch(&self) -> u64 {
        self.start.next_iteration / self.effective.iterations_per_epoch.max(1)
    }

    /// One iteration: forward/backward of every virtual rank's batch, the gradient all-reduce, the update.
    /// On a GPU nothing waits for the device before the all-reduce: the loss and error counts stay on it
    /// and ride in the last gradient bucket, and the one read back to the host is the summed extras. With
    /// the overlapped reducer the last micro-batch's backward runs beside the all-reduce of its buckets.
    pub fn train_step(&mut self, iteration: u64, step_in_epoch: usize, permutation: &[i64]) -> Result<StepOutcome> {
        if self.options.pipeline.is_some() {
            return self.pipelined_step(iteration, step_in_epoch, permutation);
        }
        self.faults.crash_if_due(iteration, self.comm.rank());
        self.opt.zero_grad();
        let device = self.options.device;
        // f64 sums, as the ranks' f32 values would be summed on the host
        let mut loss_sum = Tensor::zeros([], (Kind::Double, device));
        let mut wrong = Tensor::zeros([], (Kind::Double, device));
        // an elastic job keeps each virtual rank's gradients apart, to be summed in rank order
        let in_rank_order = self.spec.is_elastic();
        let mut rows = Vec::new();
        let mut still_to_back_propagate = None;
        for j in 0..self.virtual_ranks() {
            let (loss, tally) = self.forward(iteration, j, step_in_epoch, permutation)?;
            loss_sum += loss.detach().to_kind(Kind::Double);
            wrong += tally.to_kind(Kind::Double);
            if self.overlapped.is_some() && j + 1 == self.virtual_ranks() {
                still_to_back_propagate = Some(loss);
                break;
            }
            self.backward(&loss)?;
            if in_rank_order {
                rows.push(flat_gradients(self.opt.params()).copy());
                self.opt.zero_grad();
            }
        }
        let stop = self.stop_requested(iteration);
        let extras = StepTally::pack_on_device(&loss_sum, &wrong, stop);
        let reduced = match (still_to_back_propagate, self.overlapped.as_mut()) {
            (Some(loss), Some(overlapped)) => {
                let divisor = self.total_ranks as f64;
                let done =
                    overlapped.backward_and_reduce(self.opt.params(), loss, &mut *self.comm, divisor, &extras)?;
                self.times.backward += done.backward;
                self.times.allreduce_total += done.communicating;
                done.reduced
            }
            _ if in_rank_order => {
                let first = self.comm.rank() * self.virtual_ranks();
                let (params, comm) = (self.opt.params(), &mut *self.comm);
                reduce_in_rank_order(params, &rows, first, self.total_ranks, comm, self.reducer.staging(), &extras)?
            }
            _ => self.reducer.reduce(self.opt.params(), &mut *self.comm, self.total_ranks as f64, &extras)?,
        };
        if self.overlapped.is_none() {
            self.times.allreduce_total += reduced.comm_time;
        }
        let all = StepTally::unpack(&reduced.extras);
        let rank_loss = loss_sum.double_value(&[]) / self.virtual_ranks() as f64;
        self.finish_step(iteration, &reduced, all, rank_loss)
    }

    /// The end of a step, its gradients and tallies summed over every rank: the update, and what it did.
    fn finish_step(
        &mut self,
        iteration: u64,
        reduced: &crate::gradients::Reduced,
        all: StepTally,
        rank_loss: f64,
    ) -> Result<StepOutcome> {
        self.times.allreduce += reduced.comm_time;
        let loss = all.loss_sum / self.total_ranks as f64;
        if !loss.is_finite() {
            return Err(JobError(format!(
                "the training loss became {loss} at iteration {iteration} (lr {}): stopping (checkpoints written before it, if any, are kept)",
                self.effective.lr_at(iteration)
            ))
            .into());
        }
        let lr = self.effective.lr_at(iteration);
        let started = self.clock();
        self.opt.step(lr, &reduced.grads);
        self.times.optimizer += self.clock() - started;
        self.times.steps += 1;
        Ok(StepOutcome { lr, loss, rank_loss, wrong: all.wrong, allreduce: reduced.comm_time, stop: all.stop })
    }

    /// The forward pass of virtual rank j's micro-batch, with that rank's BatchNorm statistics; returns its
    /// mean loss (still to back-propagate) and its error tally (see [`StepOutcome::wrong`]), as scalars on
    /// the device.
    fn forward(
        &mut self,
        iteration: u64,
        j: usize,
        step_in_epoch: usize,
        permutation: &[i64],
    ) -> Result<(Tensor, Tensor)> {
        let virtual_rank = self.comm.rank() * self.virtual_ranks() + j;
        self.bn.swap_in(j);
        let n = self.spec.per_worker_batch as usize;
        let indices = batch_indices(permutation, self.total_ranks, virtual_rank, step_in_epoch, n);
        let device = self.options.device;
        let (mut x, y) = self.data.train_batch(indices, device).map_err(data_error)?;
        self.faults.poison_if_due(iteration, &mut x[0]);
        let started = self.clock();
        let (model, loss_kind, classes) = (&mut self.model, self.loss, self.data.classes());
        let (loss, tally) = precision::forward_in(self.spec.precision, device, || {
            let out = model.forward(&x, true)?;
            loss_and_tally(loss_kind, classes, &out, &y)
        })
        .map_err(|e| JobError(format!("{e:#}")))?;
        self.times.forward += self.clock() - started;
        // backward reads no BatchNorm statistics: they are the forward pass's alone
        self.bn.swap_out(j);
        Ok((loss, tally))
    }

    /// Back-propagates one micro-batch's loss into the parameters' `.grad` (adding to what is there).
    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        let started = self.clock();
        loss.f_backward().map_err(|e| JobError(format!("backward failed: {e}")))?;
        self.times.backward += self.clock() - started;
        Ok(())
    }

    /// Now, for phase times: after waiting for the GPU when `sync_phases` asks for GPU times.
    fn clock(&self) -> Instant {
        if let (true, Device::Cuda(index)) = (self.options.sync_phases, self.options.device) {
            tch::Cuda::synchronize(index as i64);
        }
        Instant::now()
    }

    fn stop_requested(&self, iteration: u64) -> bool {
        self.faults.stop_due(iteration) || self.options.stop_file.as_ref().is_some_and(|f| f.exists())
    }

    /// Top-1 error and mean loss on the whole test split, split across processes, with rank 0's BatchNorm
    /// statistics (as PyTorch DDP evaluates); each rank's own statistics are put back afterwards.
    pub fn evaluate(&mut self) -> Result<(f64, f64)> {
        if self.options.pipeline.is_some() {
            return self.pipelined_evaluate();
        }
        let (own, range) = self.begin_evaluation()?;
        let mut mine = EvalTally::default();
        let evaluated = tch::no_grad(|| -> Result<()> {
            // summed where the model runs and read once at the end: a GPU is not waited for batch by batch
            let on_device = (Kind::Double, self.options.device);
            let (mut wrong, mut loss_sum) = (Tensor::zeros([], on_device), Tensor::zeros([], on_device));
            let mut start = range.start;
            while start < range.end {
                let size = self.options.eval_batch.min(range.end - start);
                let (x, y) = self.data.test_batch(start, size, self.options.device).map_err(data_error)?;
                let (model, loss_kind, classes) = (&mut self.model, self.loss, self.data.classes());
                let (loss, tally) = precision::forward_in(self.spec.precision, self.options.device, || {
                    loss_and_tally(loss_kind, classes, &model.forward(&x, false)?, &y)
                })
                .map_err(|e| JobError(format!("{e:#}")))?;
                wrong += tally.to_kind(Kind::Double);
                loss_sum += loss.to_kind(Kind::Double) * size as f64;
                mine.seen += size as f32;
                start += size;
            }
            mine.wrong = wrong.double_value(&[]) as f32;
            mine.loss_sum = loss_sum.double_value(&[]) as f32;
            Ok(())
        });
        evaluated?;
        let mut counts = mine.pack();
        self.comm.all_reduce_sum(&mut counts)?;
        let all = EvalTally::unpack(counts);
        self.bn.restore(&own);
        let seen = f64::from(all.seen).max(1.0);
        Ok((self.error_from(f64::from(all.wrong), seen), f64::from(all.loss_sum) / seen))
    }

    /// Rank 0's BatchNorm statistics put in for evaluation (this rank's own returned, to put back after),
    /// and this process's share of the test split.
    fn begin_evaluation(&mut self) -> Result<(Vec<f32>, std::ops::Range<usize>)> {
        let own = self.bn.snapshot();
        self.bn.load_rank0(&mut *self.comm)?;
        let (p, world) = (self.comm.rank(), self.comm.world_size());
        let len = self.data.test_len();
        Ok((own, p * len / world..(p + 1) * len / world))
    }

    /// The error reported for an error tally over `samples`: the error rate for class labels, the root mean
    /// squared error for values.
    fn error_from(&self, tally: f64, samples: f64) -> f64 {
        match self.data.labels {
            Labels::Classes(_) => tally / samples.max(1.0),
            Labels::Values { .. } => (tally / samples.max(1.0)).sqrt(),
        }
    }

    /// Every rank's BatchNorm running statistics (name-sorted buffers, flattened), gathered on all ranks.
    /// Indexed by virtual rank: rank r's table is `[r * len .. (r + 1) * len]`.
    pub fn gather_batch_norm(&mut self) -> Result<Vec<f32>> {
        Ok(self.bn.gather(&mut *self.comm, self.total_ranks)?)
    }

    /// A checkpoint from which training resumes at `next_iteration` (see [`Replica::save`]); every rank calls it.
    fn write_checkpoint(&mut self, next_iteration: u64, partial: Option<PartialEpoch>) -> Result<()> {
        let started = Instant::now();
        let saved = self.save_checkpoint(next_iteration, partial);
        self.spent.checkpoint += started.elapsed();
        saved
    }

    fn save_checkpoint(&mut self, next_iteration: u64, partial: Option<PartialEpoch>) -> Result<()> {
        if self.options.pipeline.is_some() {
            return self.save_pipelined_checkpoint(next_iteration, partial);
        }
        let (out, history) = (self.options.out_dir.clone(), self.history.clone());
        self.replica().save(out.as_deref(), next_iteration, partial, &history)
    }

    /// What a checkpoint is made of and read into: the collective, the optimizer, the BatchNorm tables and
    /// an uploaded model's module.
    fn replica(&mut self) -> Replica<'_> {
        Replica {
            comm: &mut *self.comm,
            opt: &mut self.opt,
            bn: &mut self.bn,
            total_ranks: self.total_ranks,
            seed: self.spec.seed,
            effective: &self.effective,
            script: match &self.model {
                Network::Scripted(scripted) => Some(&scripted.module),
                // a composite model's modules are downloaded as its weights (model.safetensors), by name
                Network::BuiltIn(_) | Network::Composite(_) => None,
            },
        }
    }
}

/// What one rank adds to the gradient all-reduce besides its gradients, which comes back summed over all
/// ranks: the loss summed over its micro-batches, its misclassified samples, and whether it asks to stop.
#[derive(Debug, Clone, Copy)]
struct StepTally {
    loss_sum: f64,
    wrong: f64,
    stop: bool,
}

impl StepTally {
    /// It rides in the gradients' f32 buffer on the device (see [`GradientReducer::reduce`]): `stop` goes
    /// as 1 or 0, so its sum is the number of ranks asking, and any is enough.
    fn pack_on_device(loss_sum: &Tensor, wrong: &Tensor, stop: bool) -> Tensor {
        let stop = Tensor::from(f32::from(u8::from(stop))).to_device(loss_sum.device());
        Tensor::stack(&[loss_sum.to_kind(Kind::Float), wrong.to_kind(Kind::Float), stop], 0)
    }

    fn unpack(summed: &[f32]) -> StepTally {
        let at = |i: usize| summed.get(i).copied().unwrap_or(0.0);
        StepTally { loss_sum: f64::from(at(0)), wrong: f64::from(at(1)), stop: at(2) > 0.0 }
    }
}

/// One rank's share of the test split, summed over ranks by an all-reduce. Kept in f32, the all-reduce's
/// element type, from the start.
#[derive(Debug, Clone, Copy, Default)]
struct EvalTally {
    wrong: f32,
    seen: f32,
    loss_sum: f32,
}

impl EvalTally {
    fn pack(self) -> [f32; 3] {
        [self.wrong, self.seen, self.loss_sum]
    }

    fn unpack(summed: [f32; 3]) -> EvalTally {
        EvalTally { wrong: summed[0], seen: summed[1], loss_sum: summed[2] }
    }
}

/// The loss the spec asks for, or the labels' default; a loss that does not fit the labels is the job's error.
pub(crate) fn training_loss(asked: Option<Loss>, labels: Labels) -> Result<Loss, String> {
    match (asked, labels) {
        (None, Labels::Classes(_)) => Ok(Loss::CrossEntropy),
        (None, Labels::Values { .. }) => Ok(Loss::Mse),
        (Some(Loss::CrossEntropy), Labels::Classes(_)) => Ok(Loss::CrossEntropy),
        (Some(loss @ (Loss::Mse | Loss::Huber)), Labels::Values { .. }) => Ok(loss),
        (Some(Loss::CrossEntropy), Labels::Values { .. }) => {
            Err("loss cross_entropy needs class labels (integers); this dataset's y holds values: use mse or huber"
                .into())
        }
        (Some(_), Labels::Classes(_)) => {
            Err("loss mse and huber need value labels (floats); this dataset's y holds class indices".into())
        }
    }
}

/// A batch's mean loss, and its error tally: misclassified samples for class labels; for values, the sum
/// over samples of each sample's mean squared error. A model whose output does not fit the labels (of
/// `classes` classes: the data set's, counted once at load, so no step reads labels back from the device)
/// is an error that names both shapes.
pub(crate) fn loss_and_tally(loss: Loss, classes: i64, out: &Tensor, y: &Tensor) -> Result<(Tensor, Tensor)> {
    let batch = y.size()[0];
    match loss {
        Loss::CrossEntropy => {
            let fits = out.dim() == 2 && out.size()[0] == batch && out.size()[1] >= classes;
            if !fits {
                bail!(
                    "the model's output has shape {:?}; class scores for {batch} samples must be [{batch}, C] with C \
                     at least the data set's {classes} classes",
                    out.size()
                );
            }
            let value = out.log_softmax(-1, Kind::Float).nll_loss(y);
            let wrong = out.argmax(-1, false).ne_tensor(y).sum(Kind::Double);
            Ok((value, wrong))
        }
        Loss::Mse | Loss::Huber => {
            if out.numel() != y.numel() {
                bail!("the model's output has shape {:?} where the labels have {:?}", out.size(), y.size());
            }
            let out = out.to_kind(Kind::Float).reshape(y.size().as_slice());
            let value = match loss {
                Loss::Huber => out.huber_loss(y, Reduction::Mean, 1.0),
                _ => out.mse_loss(y, Reduction::Mean),
            };
            let outputs = (y.numel() as i64 / batch.max(1)) as f64;
            let squared = (out.detach() - y).square().sum(Kind::Double) / outputs;
            Ok((value, squared))
        }
    }
}

fn join(errors: &[ringtrain_core::FieldError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// A loader's error as the rank's: a job error (not retried: a damaged data set fails every attempt alike),
/// except where the store was unavailable for now, which another attempt may not meet.
fn data_error(err: anyhow::Error) -> anyhow::Error {
    let text = format!("{err:#}");
    match ringtrain_data::stream::is_transient(&text) {
        true => anyhow::anyhow!(text),
        false => JobError(text).into(),
    }
}
