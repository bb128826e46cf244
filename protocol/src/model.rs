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
}

/// Why the check refused a model: `field` is the upload's query parameter or part at fault (`body` for the
/// file itself, `inputs`, `dataset`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRefusal {
    pub field: String,
    pub reason: String,
}
