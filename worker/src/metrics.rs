//! What a rank reports: JSON lines on stdout while it trains, and `result.json` at the end.

use serde::{Deserialize, Serialize};

/// One metrics line. `iteration` is the 0-based global index of the iteration just taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Metric {
    Iteration {
        rank: usize,
        epoch: u64,
        iteration: u64,
        lr: f64,
        /// Mean training loss of this iteration over all k ranks.
        loss: f64,
        /// This rank's own mean loss (over its n samples, or v micro-batches).
        rank_loss: f64,
        /// Samples per second of the whole job (kn per iteration) since the previous line.
        samples_per_s: f64,
        /// Seconds spent in the gradient all-reduce since the previous line.
        allreduce_s: f64,
        /// `allreduce_s` over the wall time since the previous line: the share of time communication took
        /// (a chart can draw it without knowing how many iterations each line covers).
        allreduce_share: f64,
        /// CPU cores this rank process kept busy since the previous line (1.0: one core all the time).
        #[serde(default)]
        cpu_cores: f64,
        /// The most memory this rank process has held resident so far, in bytes.
        #[serde(default)]
        peak_rss_bytes: f64,
    },
    Epoch(EpochRecord),
}

/// The end-of-epoch figures (the same on every rank: they are all-reduced).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    pub rank: usize,
    pub epoch: u64,
    /// The last iteration of the epoch.
    pub iteration: u64,
    /// Mean training loss over the epoch.
    pub train_loss: f64,
    /// Fraction of training samples misclassified during the epoch (in training mode, as seen).
    pub train_error: f64,
    /// Top-1 error on the test split, with rank 0's BatchNorm statistics.
    pub test_error: f64,
    pub test_loss: f64,
    /// Seconds the epoch took (training and evaluation).
    pub seconds: f64,
}

/// `result.json`: everything about a finished run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub spec: ringtrain_core::JobSpec,
    pub effective: ringtrain_core::Effective,
    pub schedule: ringtrain_core::ScheduleView,
    pub epochs: Vec<EpochRecord>,
    pub final_test_error: f64,
    pub wall_seconds: f64,
    /// Training samples per second over the whole run (k·n per iteration).
    pub samples_per_s: f64,
    /// Fraction of training time spent in the gradient all-reduce.
    pub communication_fraction: f64,
    /// How many processes and virtual ranks per process made up the k ranks.
    pub processes: usize,
    pub virtual_ranks: usize,
    /// What the error fields hold.
    #[serde(default)]
    pub error_metric: ErrorMetric,
    /// Where rank 0's wall time went.
    #[serde(default)]
    pub timeline: Timeline,
}

/// Where rank 0's wall time went: the core's, so the server's job view reads it typed.
pub use ringtrain_core::Timeline;

/// What a run's error fields (`train_error`, `test_error`, `final_test_error`) measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorMetric {
    /// The share of misclassified samples (class labels).
    #[default]
    ErrorRate,
    /// The root mean squared error (value labels).
    Rmse,
}
