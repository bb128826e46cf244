//! What `ringtrain model check` (the process the server starts to look at an uploaded TorchScript model,
//! so that a hostile or broken file never touches the server's own process) prints on stdout: a
//! [`ModelReport`] with exit status 0, or a [`ModelRefusal`] with [`EXIT_REFUSED`].

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The exit status of `ringtrain model check` for a model it refuses (the reason is on stdout).
pub const EXIT_REFUSED: u8 = 2;

/// What the check found in a model that passed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelReport {
    /// Trainable parameter elements.
    pub parameters: u64,
    /// Trainable parameter tensors.
    pub parameter_tensors: u64,
    /// Buffers (BatchNorm's running statistics and any other state without gradients).
    pub buffers: u64,
    /// Whether the model holds BatchNorm layers (their statistics are kept per rank).
    pub batch_norm: bool,
    /// The inputs `forward` takes, in order: the data set's tensors `x.NAME`.
    pub inputs: Vec<String>,
    /// The output's shape for a batch of two samples of the data set it was checked with.
    pub output_shape: Vec<i64>,
    /// `classes` (integer labels) or `values` (float labels).
    pub labels: String,
    /// What a training step took in memory, measured by the check; absent for models checked before it
    /// measured, or where the kernel would not say (admission then cannot tell and does not refuse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ModelMemory>,
    /// A composite model's modules (an archive of TorchScript modules joined by its `composite.json`), in
    /// the order they run; empty for a model of one file. A job places them on its worker's devices with
    /// `placement.stages`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<ModuleReport>,
}

/// One module of a composite model, as its check found it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModuleReport {
    pub name: String,
    /// What its `forward` takes, in order: the data set's inputs (`x.NAME`) or earlier modules' outputs.
    pub inputs: Vec<String>,
    /// Trainable parameter elements.
    pub parameters: u64,
    pub batch_norm: bool,
    /// The output's shape for a batch of two samples.
    pub output_shape: Vec<i64>,
    /// What the module's own training step took in memory (its forward and backward alone, its inputs
    /// given), measured as the whole model's; admission adds up a stage's modules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ModelMemory>,
}

/// A model's memory, as its check measured it: what it holds, and what one training step takes at two
/// batch sizes, from which any batch's step is extrapolated (a step's activations grow with the batch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelMemory {
    /// Bytes of every parameter and buffer of the model.
    pub weights_bytes: u64,
    /// Bytes of the trainable parameters: training holds a gradient and a momentum buffer of this size too.
    pub trainable_bytes: u64,
    /// The part of a step's peak that does not grow with the batch.
    pub step_fixed_bytes: u64,
    /// What a step's peak grows by per sample of the batch (the batch itself, the activations kept for
    /// the backward pass, temporaries).
    pub step_per_sample_bytes: u64,
    /// The steps measured: at each batch size, the peak resident memory above what the process held before
    /// the step (parameters and gradients already allocated, as in training).
    pub measured: Vec<MeasuredStep>,
}

/// One measured training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MeasuredStep {
    pub batch: u64,
    pub peak_bytes: u64,
}

impl ModelMemory {
    /// Fits `fixed + per_sample * batch` through two measured steps (the smaller batch first). A larger
    /// batch that measured less (the allocator's noise on a small model) gives no per-sample part.
    pub fn from_steps(weights_bytes: u64, trainable_bytes: u64, small: MeasuredStep, large: MeasuredStep) -> Self {
        let grown = large.peak_bytes.saturating_sub(small.peak_bytes);
        let per_sample = grown / large.batch.saturating_sub(small.batch).max(1);
        let fixed = small.peak_bytes.saturating_sub(per_sample.saturating_mul(small.batch));
        ModelMemory {
            weights_bytes,
            trainable_bytes,
            step_fixed_bytes: fixed,
            step_per_sample_bytes: per_sample,
            measured: vec![small, large],
        }
    }

    /// A training step's peak at `batch` samples, extrapolated from the measured steps.
    pub fn step_bytes(&self, batch: u64) -> u64 {
        self.step_fixed_bytes.saturating_add(self.step_per_sample_bytes.saturating_mul(batch))
    }
}

/// Why the check refused a model: `field` is the upload's query parameter or part at fault (`body` for the
/// file itself, `inputs`, `dataset`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRefusal {
    pub field: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::{MeasuredStep, ModelMemory};

    #[test]
    fn a_step_is_extrapolated_through_the_two_measured_batches() {
        let small = MeasuredStep { batch: 2, peak_bytes: 3_000 };
        let large = MeasuredStep { batch: 16, peak_bytes: 17_000 };
        let memory = ModelMemory::from_steps(100, 80, small, large);
        assert_eq!((memory.step_fixed_bytes, memory.step_per_sample_bytes), (1_000, 1_000));
        assert_eq!(memory.step_bytes(2), 3_000);
        assert_eq!(memory.step_bytes(16), 17_000);
        assert_eq!(memory.step_bytes(1_000), 1_001_000);
        // the larger batch measuring less is noise: no per-sample part, the smaller step's peak is fixed
        let noisy = ModelMemory::from_steps(100, 80, small, MeasuredStep { batch: 16, peak_bytes: 2_000 });
        assert_eq!((noisy.step_fixed_bytes, noisy.step_per_sample_bytes), (3_000, 0));
        assert_eq!(memory.step_bytes(u64::MAX), u64::MAX, "saturates, never wraps");
    }
}
