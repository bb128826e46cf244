//! Where a rank's wall time went, as `result.json` reports it and a job's view shows it.

use serde::{Deserialize, Serialize};

/// Where a rank's time went, in seconds: what a whole run spends besides its training steps. The
/// parts after `start_up_s` add up to `wall_seconds`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
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
}
