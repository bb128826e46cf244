//! Where a rank's wall time went, as `result.json` reports it and a job's view shows it.

use serde::{Deserialize, Serialize};

/// Where a rank's time went, in seconds: what a whole run spends besides its training steps. The
/// parts after `start_up_s` add up to `wall_seconds`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
// a result written before a part was measured reads that part as 0
#[serde(default)]
pub struct Timeline {
    /// From the rank's start (its command's entry) to its first step: loading the data, building the model,
    /// the rendezvous, a resume. Not part of `wall_seconds`.
    pub start_up_s: f64,
    /// Training steps: forward, backward, the all-reduce and the update.
    pub train_steps_s: f64,
    /// The end-of-epoch evaluations.
    pub evaluation_s: f64,
    /// Writing checkpoints (rank 0), and waiting for it (the others).
    pub checkpoint_s: f64,
    /// Writing metrics lines.
    pub reporting_s: f64,
    /// The rest: each epoch's shuffle, the collapse guard, bookkeeping.
    pub other_s: f64,
    /// A run split into pipeline stages: where each stage of the first worker spent its training steps.
    /// Empty for a run of whole models.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageTime>,
    /// A run split into S pipeline stages with v micro-batches a step: the share of a step the schedule
    /// leaves each stage idle while the pipeline fills and drains, (S−1)/(v+S−1); what the stages'
    /// `waiting_share` is measured against (the rest of their waiting is their imbalance). 0 otherwise.
    #[serde(skip_serializing_if = "is_zero")]
    pub bubble_share: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// One pipeline stage's training steps, as shares of its step time: computing (its forward and backward
/// passes), waiting for a neighbour's activations or gradients, and sending its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StageTime {
    pub stage: u32,
    pub busy_share: f64,
    pub waiting_share: f64,
    pub sending_share: f64,
    /// Bytes it sent to its neighbours per step (activations forward, gradients back).
    pub bytes_sent_per_step: f64,
}

impl StageTime {
    /// From a stage's totals over `steps` steps, in seconds (and bytes).
    pub fn from_totals(
        stage: u32,
        compute_s: f64,
        waiting_s: f64,
        sending_s: f64,
        bytes: f64,
        steps: u64,
    ) -> StageTime {
        let total = (compute_s + waiting_s + sending_s).max(f64::MIN_POSITIVE);
        StageTime {
            stage,
            busy_share: compute_s / total,
            waiting_share: waiting_s / total,
            sending_share: sending_s / total,
            bytes_sent_per_step: bytes / steps.max(1) as f64,
        }
    }
}

/// The share of a step that S pipeline stages at v micro-batches leave each stage idle: (S−1)/(v+S−1).
pub fn bubble_share(stages: usize, micro_batches: usize) -> f64 {
    let filling = stages.saturating_sub(1) as f64;
    filling / (micro_batches as f64 + filling).max(1.0)
}
