//! The training job as users write it (JSON), with the defaults of Goyal et al. 2017, §5.1.
//!
//! Parsing rejects unknown fields and wrong JSON types; [`JobSpec::validate`] reports every range or
//! consistency problem. [`JobSpec::from_json`] does both and reports every problem of both kinds at once
//! ([`crate::reading`]).
//!
//! Over 450 lines because it is the whole document a user writes, one struct per section, each field with
//! its default and its doc (which the API's schema repeats); checks are in [`crate::validate`], the
//! schedule the spec implies in [`crate::schedule`].

use serde::{Deserialize, Serialize};

use crate::dataset::DatasetRef;
use crate::error::FieldError;
use crate::ids::{CheckpointId, JobId, ModelId};

/// A training job: what to train, on what, with which recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Free-form label shown in the run history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub model: ModelSpec,
    /// `fashion-mnist`, `synthetic[:N]`, `idx:PATH`, `shards:PATH`, or the id of an uploaded dataset.
    pub dataset: DatasetRef,
    /// `shards:` data sets only: the side, in pixels, every image is cropped and resized to (training:
    /// Goyal's random-resized crop and flip; evaluation: the centre crop). Default 224, ImageNet's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_size: Option<u32>,
    /// `shards:` data sets only: how training images are augmented. Default Goyal's (random-resized crop
    /// and flip; test images centre-cropped); `none` keeps whole images for training and test alike, for
    /// small images a crop of 8% would ruin, or to compare with the same images held in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub augment: Option<Augment>,
    /// Use only the first N training samples (before the per-epoch shuffle); all of them when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_samples: Option<u64>,
    /// Evaluate on only the first N test samples; all of them when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_samples: Option<u64>,
    /// k: the number of ranks trained in data parallel; the math of the run (global batch kn, the lr it
    /// scales to, BatchNorm over n per rank) depends on it alone.
    #[serde(default = "defaults::workers")]
    pub workers: u32,
    /// The devices the job holds (default: `workers`, one rank each). Must divide `workers`: each device's
    /// process then plays workers/devices virtual ranks (micro-batches of n with their own BatchNorm
    /// statistics, gradients accumulated), so the run is the k-worker run on fewer devices, only slower. A
    /// range makes the job elastic (see [`Devices`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Devices>,
    /// Devices each worker's process spans (default 1). More than one cuts the model into that many
    /// pipeline stages, one per device, where `placement` says; the job then holds devices ×
    /// devices_per_worker devices.
    #[serde(default = "defaults::one", skip_serializing_if = "defaults::is_one")]
    pub devices_per_worker: u32,
    /// Where a worker's model is cut into its `devices_per_worker` stages (see [`Placement`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// n: samples per rank per iteration. BatchNorm statistics are computed over these n samples.
    #[serde(default = "defaults::per_worker_batch")]
    pub per_worker_batch: u32,
    #[serde(default = "defaults::epochs")]
    pub epochs: u32,
    #[serde(default)]
    pub lr: LrSpec,
    #[serde(default)]
    pub optimizer: OptimizerSpec,
    /// Start the last BatchNorm of every residual block with gamma = 0 (Goyal §5.1).
    #[serde(default = "defaults::yes")]
    pub bn_zero_init_last: bool,
    /// Seeds weights and the per-epoch shuffle; the same seed gives the same run.
    #[serde(default)]
    pub seed: u64,
    /// Write a checkpoint every this many epochs (0: only the final one).
    #[serde(default = "defaults::checkpoint_every_epochs")]
    pub checkpoint_every_epochs: u32,
    /// Emit a metrics line every this many iterations.
    #[serde(default = "defaults::log_every_iterations")]
    pub log_every_iterations: u32,
    /// How often a failed attempt is retried from its last checkpoint.
    #[serde(default = "defaults::max_restarts")]
    pub max_restarts: u32,
    /// Orders jobs within a team's queue; higher first.
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub device: DeviceKind,
    /// The arithmetic of forward and backward (see [`Precision`]).
    #[serde(default)]
    pub precision: Precision,
    /// Stops a run that has gone wrong early (see [`GuardSpec`]).
    #[serde(default)]
    pub guard: GuardSpec,
    /// The training loss (see [`Loss`]); default: `cross_entropy` for class labels, `mse` for values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<Loss>,
    /// Start from another job's checkpoint (a fork: fine-tuning, or going on with a changed schedule); see
    /// [`InitFrom`]. Absent: weights initialised from `seed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<InitFrom>,
}

/// How a worker's model is spread over its devices, one pipeline stage per device: a built-in ResNet is
/// cut after the layers `cuts` names, in the network's order (`layer2`, after the second layer, or a block,
/// `layer2.1`: one cut fewer than `devices_per_worker`); a composite uploaded model's modules are placed by
/// `stages`, the modules of each stage (one list per device; see [`crate::composite`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cuts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<Vec<String>>,
}

/// `devices`: a count, or a range that makes the job *elastic*: `{"min": 1, "max": 8}` (`max`
/// defaults to `workers`). An elastic job runs on any divisor of `workers` within the range: the scheduler
/// starts it on the most that fit, shrinks it (a stop at a checkpoint and a restart on fewer) rather than
/// stopping it when its devices are reclaimed, grows it onto idle devices, and restarts it on what is left
/// when a node is lost. Its k, global batch, schedule and curve are the submitted run's on every count:
/// each device's process plays workers / count virtual ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Devices {
    Fixed(u32),
    Range(DeviceRange),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRange {
    #[serde(default = "defaults::one")]
    pub min: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
}

impl From<u32> for Devices {
    fn from(count: u32) -> Self {
        Devices::Fixed(count)
    }
}

/// A count or a range, with one message for anything else (serde's untagged enums say only that nothing
/// matched).
impl<'de> Deserialize<'de> for Devices {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Expected;
        impl<'de> serde::de::Visitor<'de> for Expected {
            type Value = Devices;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a device count, or a range such as {\"min\": 1, \"max\": 8}")
            }
            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Devices, E> {
                u32::try_from(value)
                    .map(Devices::Fixed)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(value), &self))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Devices, A::Error> {
                DeviceRange::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Devices::Range)
            }
        }
        deserializer.deserialize_any(Expected)
    }
}

/// Where a forked job's weights come from: a checkpoint of a job of the same team that trains the same
/// model. The job takes the checkpoint's weights and BatchNorm statistics (rank 0's, for every rank), not
/// its momentum, iteration or schedule: its own spec's schedule runs from iteration 0, so the lr, warmup and
/// global batch may all differ from the run it forks. (Momentum buffers and an iteration count mean nothing
/// under another schedule or batch; a run resumed as it was is `POST /v1/jobs/{id}/resume`.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitFrom {
    /// The checkpoint's id (`GET /v1/jobs/{id}/checkpoints`).
    pub checkpoint: CheckpointId,
}

/// Early stops for runs that cannot recover, so they do not hold devices to the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardSpec {
    /// Stop (failed, not retried: a rerun would do the same) when an epoch of at least 50 iterations that lies
    /// wholly after the warmup ends with a training error at chance level (within 0.02 of 1 - 1/classes): the
    /// network has collapsed,
    /// typically every ReLU dead after too large an lr, with a finite loss. The last checkpoint is kept.
    #[serde(default = "defaults::yes")]
    pub collapse: bool,
    /// A finished or running job of the same team whose training-error curve this run must stay near: at
    /// each epoch (compared by epoch, as the global batches differ) the server checks this run's training
    /// error against the reference's, and a run worse by more than `tolerance` stops (failed, not retried,
    /// checkpoints kept). A study sets it on its points when asked to guard them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_job: Option<JobId>,
    /// How much worse than the reference's training error (absolute, 0 to 1) an epoch may end.
    #[serde(default = "defaults::guard_tolerance")]
    pub tolerance: f64,
    /// Compare only epochs that end after the warmup (during it, a large-batch run is expected to trail).
    #[serde(default = "defaults::yes")]
    pub after_warmup: bool,
}

impl Default for GuardSpec {
    fn default() -> Self {
        GuardSpec { collapse: true, reference_job: None, tolerance: defaults::guard_tolerance(), after_warmup: true }
    }
}

/// The model: a built-in one by `name` (with its options), or a team's uploaded TorchScript model by
/// `uploaded` (its id from POST /v1/models). Exactly one of the two. (A flat struct rather than a tagged
/// enum, so errors inside the options keep their exact path.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<ModelName>,
    /// `mlp` only: the hidden layer widths (default [256, 128]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<u32>>,
    /// An uploaded TorchScript model of the team (trained on an uploaded dataset holding its inputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploaded: Option<ModelId>,
    /// `mlp` and `lenet5` only: how their weights start (default `goyal`, the best measured; see
    /// [`InitScheme`]). The ResNets always start by Goyal's rule; an uploaded model from its own weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitScheme>,
}

/// How a built-in model without BatchNorm (LeNet-5, the MLP) initialises its weights. Measured over five
/// seeds each on Fashion-MNIST (docs/user-guide.md, "Accuracy over several seeds"): `goyal` and `pytorch`
/// within a tenth of a point of plain PyTorch on both models, `tch` the worst; `goyal` is the default (the
/// recipe's rule, the smallest spread).
/// How a `shards:` data set's training images are augmented (`augment`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Augment {
    /// Goyal et al. §5.1 (from Szegedy et al.): a random-resized crop (8% to all of the image, aspect 3/4
    /// to 4/3) resized to `image_size`, flipped half the time; keyed by seed, epoch and sample.
    #[default]
    Goyal,
    /// None: the whole image resized to `image_size`, for training and test alike (an image of that size
    /// is used as it is). Measured on Fashion-MNIST: 9.63% against 9.42% from memory; the evaluation crop
    /// for both instead lost a 2-pixel border and ended at 10.20%.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InitScheme {
    /// Goyal et al. §5.1: He-normal weights (convolutions by fan-out, as the ResNets; hidden fully
    /// connected layers by fan-in), the last fully connected layer N(0, 0.01), every bias 0. The default.
    #[default]
    Goyal,
    /// PyTorch's own layer defaults (weights and biases uniform in ±1/√fan_in): the same starting
    /// distributions as a plain PyTorch script of the same model, for comparing against one.
    Pytorch,
    /// tch's defaults (Kaiming-uniform weights with the ReLU gain, ±√(6/fan_in); convolution biases 0,
    /// linear biases ±1/√fan_in): what ringtrain used before 2026-12-06, to re-run a spec from then.
    Tch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelName {
    /// Fully connected network with ReLU between layers.
    Mlp,
    Lenet5,
    /// He et al. CIFAR-style ResNets (3 stages of basic blocks; 1, 3 or 9 blocks per stage). ResNet-8 is
    /// the smallest with BatchNorm: what the Goyal study template trains on a CPU.
    Resnet8,
    Resnet20,
    Resnet56,
    /// ImageNet-style ResNet with bottleneck blocks.
    Resnet50,
}

impl ModelSpec {
    pub fn new(name: ModelName) -> Self {
        ModelSpec { name: Some(name), hidden: None, uploaded: None, init: None }
    }

    /// An uploaded model.
    pub fn uploaded(id: ModelId) -> Self {
        ModelSpec { name: None, hidden: None, uploaded: Some(id), init: None }
    }

    /// The MLP's hidden widths once the default is applied (empty for other models).
    pub fn hidden_widths(&self) -> Vec<u32> {
        match self.name {
            Some(ModelName::Mlp) => self.hidden.clone().unwrap_or_else(defaults::mlp_hidden),
            _ => Vec::new(),
        }
    }

    /// Whether `init` applies: the built-in models without BatchNorm.
    pub fn takes_init(&self) -> bool {
        matches!(self.name, Some(ModelName::Mlp | ModelName::Lenet5))
    }

    /// Whether a built-in model has BatchNorm layers (and so per-rank statistics); an uploaded model's
    /// are found when it is loaded.
    pub fn has_batch_norm(&self) -> bool {
        matches!(self.name, Some(ModelName::Resnet8 | ModelName::Resnet20 | ModelName::Resnet56 | ModelName::Resnet50))
    }

    /// What to call the model in logs and tables: the built-in name, or `uploaded:ID`.
    pub fn label(&self) -> String {
        match (self.name, self.uploaded) {
            (Some(name), _) => {
                serde_json::to_value(name).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
            }
            (None, Some(id)) => format!("uploaded:{id}"),
            (None, None) => "none".to_string(),
        }
    }
}

/// The training loss. Class labels (integers) take `cross_entropy` and report the error rate; value labels
/// (floats) take `mse` or `huber` (delta 1) and report the root mean squared error in the error fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    CrossEntropy,
    Mse,
    Huber,
}

impl Loss {
    /// Whether this loss regresses values (rather than classifying).
    pub fn regresses(self) -> bool {
        matches!(self, Loss::Mse | Loss::Huber)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    #[default]
    Cpu,
    Gpu,
}

/// `fp32`: everything in float32. `bf16`: forward and backward under autocast (convolutions and matrix
/// products in bfloat16, reductions and the loss in float32), with float32 master weights, float32 gradients,
/// all-reduce and optimizer, and BatchNorm statistics kept in float32. Works on CPUs and GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Fp32,
    Bf16,
}

/// The learning-rate rules: scaling with the global batch, warmup and decay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrSpec {
    /// The lr that is right for `reference_batch` samples per iteration (Goyal: 0.1 for 256).
    #[serde(default = "defaults::base_lr")]
    pub base: f64,
    #[serde(default = "defaults::reference_batch")]
    pub reference_batch: u32,
    #[serde(default)]
    pub scaling: Scaling,
    /// In place of the scaling rule: lr = base × multiplier, whatever the batch (what a scaling search hands
    /// back; warmup still rises from `base`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    /// Upper bound on every lr of the schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    #[serde(default)]
    pub warmup: WarmupSpec,
    #[serde(default)]
    pub decay: DecaySpec,
}

impl Default for LrSpec {
    fn default() -> Self {
        LrSpec {
            base: defaults::base_lr(),
            reference_batch: defaults::reference_batch(),
            scaling: Scaling::default(),
            multiplier: None,
            max: None,
            warmup: WarmupSpec::default(),
            decay: DecaySpec::default(),
        }
    }
}

/// How the lr grows with the global batch kn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scaling {
    /// lr = base * kn / reference_batch (Goyal's rule).
    #[default]
    Linear,
    /// lr = base * sqrt(kn / reference_batch).
    Sqrt,
    /// lr = base.
    None,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupSpec {
    #[serde(default)]
    pub kind: WarmupKind,
    /// Length of the warmup in epochs (fractions allowed); default 5, or 0 for `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<f64>,
}

impl WarmupSpec {
    pub const DEFAULT_EPOCHS: f64 = 5.0;

    /// The warmup length in epochs once the default is applied.
    pub fn resolved_epochs(&self) -> f64 {
        match self.kind {
            WarmupKind::None => self.epochs.unwrap_or(0.0),
            _ => self.epochs.unwrap_or(Self::DEFAULT_EPOCHS),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WarmupKind {
    /// Start at no warmup: the scaled lr from the first iteration.
    None,
    /// Hold `base` during the warmup, then jump to the scaled lr (Goyal's comparison point).
    Constant,
    /// Rise linearly per iteration from `base` to the scaled lr (Goyal's recipe).
    #[default]
    Gradual,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecaySpec {
    #[serde(default)]
    pub kind: DecayKind,
    /// Epochs at which a step decay multiplies the lr by `factor`. Default: 1/3, 2/3 and 8/9 of the
    /// epochs, rounded (30/60/80 for 90 epochs, as in Goyal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milestones: Option<Vec<u32>>,
    #[serde(default = "defaults::decay_factor")]
    pub factor: f64,
}

impl Default for DecaySpec {
    fn default() -> Self {
        DecaySpec { kind: DecayKind::default(), milestones: None, factor: defaults::decay_factor() }
    }
}

impl DecaySpec {
    /// The step-decay milestones once the default is applied (empty unless the kind is `step`).
    pub fn resolved_milestones(&self, epochs: u32) -> Vec<u32> {
        match (self.kind, &self.milestones) {
            (DecayKind::Step, Some(given)) => given.clone(),
            (DecayKind::Step, None) => {
                let mut ms: Vec<u32> = [1.0 / 3.0, 2.0 / 3.0, 8.0 / 9.0]
                    .iter()
                    .map(|f| (f64::from(epochs) * f).round() as u32)
                    .filter(|&m| m > 0 && m < epochs)
                    .collect();
                ms.dedup();
                ms
            }
            _ => Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayKind {
    #[default]
    Step,
    /// Half-cosine from the scaled lr (after warmup) down towards 0 at the last iteration.
    Cosine,
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSpec {
    #[serde(default = "defaults::momentum")]
    pub momentum: f64,
    #[serde(default = "defaults::yes")]
    pub nesterov: bool,
    #[serde(default)]
    pub momentum_form: MomentumForm,
    #[serde(default = "defaults::weight_decay")]
    pub weight_decay: f64,
    /// Apply weight decay to BatchNorm gamma/beta too (Goyal: no).
    #[serde(default)]
    pub bn_weight_decay: bool,
    /// Apply weight decay to biases (Goyal: yes; only BN parameters are exempt).
    #[serde(default = "defaults::yes")]
    pub bias_weight_decay: bool,
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        OptimizerSpec {
            momentum: defaults::momentum(),
            nesterov: true,
            momentum_form: MomentumForm::default(),
            weight_decay: defaults::weight_decay(),
            bn_weight_decay: false,
            bias_weight_decay: true,
        }
    }
}

/// Where the lr enters the momentum update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MomentumForm {
    /// u = m*u + g; w -= lr*u (PyTorch's SGD).
    Pytorch,
    /// u = m*u + lr*g; w -= u, with u scaled by lr_{t+1}/lr_t whenever the lr changes (Goyal eq. 10
    /// with momentum correction).
    #[default]
    Goyal,
}

mod defaults {
    pub fn workers() -> u32 {
        1
    }
    pub fn is_one(value: &u32) -> bool {
        *value == 1
    }

    pub fn one() -> u32 {
        1
    }
    pub fn per_worker_batch() -> u32 {
        32
    }
    pub fn epochs() -> u32 {
        90
    }
    pub fn yes() -> bool {
        true
    }
    pub fn checkpoint_every_epochs() -> u32 {
        1
    }
    pub fn log_every_iterations() -> u32 {
        20
    }
    pub fn max_restarts() -> u32 {
        3
    }
    pub fn mlp_hidden() -> Vec<u32> {
        vec![256, 128]
    }
    pub fn base_lr() -> f64 {
        0.1
    }
    pub fn reference_batch() -> u32 {
        256
    }
    pub fn decay_factor() -> f64 {
        0.1
    }
    pub fn momentum() -> f64 {
        0.9
    }
    pub fn weight_decay() -> f64 {
        1e-4
    }
    pub fn guard_tolerance() -> f64 {
        0.02
    }
}

impl JobSpec {
    /// Parses and validates a spec: a JSON syntax error (with its line and column), or every structural
    /// and validation problem at once ([`crate::reading`]).
    pub fn from_json(text: &str) -> Result<JobSpec, Vec<FieldError>> {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(value) => Self::from_value(&value),
            // not JSON, or a number no JSON value holds (1e309): read as a spec, its one error has a path
            Err(_) => {
                let spec = Self::parse(text).map_err(|e| vec![e])?;
                spec.validate()?;
                Ok(spec)
            }
        }
    }

    /// Parses without validating ranges: rejects malformed JSON, wrong types and unknown fields.
    pub fn parse(text: &str) -> Result<JobSpec, FieldError> {
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let path = err.path().to_string();
            let path = if path == "." { String::new() } else { path };
            let message = err.inner().to_string();
            // Keep the line and column for malformed JSON; for a wrong value the path says where.
            let reason = if err.inner().is_data() { strip_position(&message) } else { message };
            FieldError::new(path, reason)
        })
    }

    /// The global batch kn.
    pub fn global_batch(&self) -> u64 {
        u64::from(self.workers) * u64::from(self.per_worker_batch)
    }

    /// The pipeline stages of each worker: `devices_per_worker`.
    pub fn stages(&self) -> u32 {
        self.devices_per_worker.max(1)
    }

    /// Where each worker's model is cut, when it is (see [`Placement`]).
    pub fn pipeline_cuts(&self) -> Option<&[String]> {
        self.placement.as_ref().map(|p| p.cuts.as_slice()).filter(|cuts| self.stages() > 1 && !cuts.is_empty())
    }

    /// Which modules of a composite uploaded model each stage runs, when they are placed (see [`Placement`]).
    pub fn pipeline_modules(&self) -> Option<&[Vec<String>]> {
        self.placement.as_ref().map(|p| p.stages.as_slice()).filter(|stages| self.stages() > 1 && !stages.is_empty())
    }

    /// The devices the job holds in all: each worker process's `devices_per_worker`.
    pub fn total_devices(&self) -> u32 {
        self.device_count().saturating_mul(self.stages())
    }

    /// The worker processes the job runs (`devices`, or one per worker); each spans `devices_per_worker`
    /// devices.
    pub fn device_count(&self) -> u32 {
        self.allowed_device_counts().last().copied().unwrap_or(self.workers)
    }

    /// The device counts the job may run on, ascending: its one count, or for an elastic job every divisor
    /// of `workers` within its range (each count playing workers / count virtual ranks, so the run is the
    /// same on any of them).
    pub fn allowed_device_counts(&self) -> Vec<u32> {
        match self.devices {
            None => vec![self.workers],
            Some(Devices::Fixed(count)) => vec![count],
            Some(Devices::Range(range)) => {
                let max = range.max.unwrap_or(self.workers).min(self.workers);
                (range.min.max(1)..=max).filter(|count| self.workers % count == 0).collect()
            }
        }
    }

    /// The device counts the job may hold, ascending: [`JobSpec::allowed_device_counts`] with each worker
    /// process's `devices_per_worker` devices (what the scheduler places).
    pub fn allowed_total_device_counts(&self) -> Vec<u32> {
        self.allowed_device_counts().into_iter().map(|count| count.saturating_mul(self.stages())).collect()
    }

    /// Whether the job may run on several device counts (`devices` is a range).
    pub fn is_elastic(&self) -> bool {
        matches!(self.devices, Some(Devices::Range(_)))
    }

    /// The ranks each device's process plays (workers / devices; 1 unless `devices` is set below `workers`),
    /// on the most devices the job may hold.
    pub fn virtual_ranks(&self) -> u32 {
        (self.workers / self.device_count().max(1)).max(1)
    }

    /// This spec with another world size k (for "what if k changes" previews), on one device per worker.
    pub fn with_workers(&self, workers: u32) -> JobSpec {
        JobSpec { workers, devices: None, ..self.clone() }
    }
}

/// Drops serde_json's trailing " at line L column C".
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(pos) if message[pos..].contains(" column ") => message[..pos].to_string(),
        _ => message.to_string(),
    }
}
