//! Test-only fault injection: the failures the tests provoke in one rank (a crash, bad data, a stop request)
//! at a chosen global iteration, kept out of the training options so that a real run never carries them.

use tch::Tensor;

/// Faults to inject into this process; the default injects none.
#[derive(Debug, Default, Clone)]
pub struct FaultInjection {
    /// Abort this process (like a crash or kill -9: no clean-up, no unwinding) when it is about to take this
    /// global iteration.
    pub crash_at_iteration: Option<u64>,
    /// Feed this process NaN inputs at this global iteration (bad data).
    pub nan_inputs_at_iteration: Option<u64>,
    /// Ask every rank to stop at this global iteration, as if the stop file had appeared.
    pub stop_at_iteration: Option<u64>,
}

impl FaultInjection {
    /// Aborts the process when a crash is due at `iteration`.
    pub(crate) fn crash_if_due(&self, iteration: u64, rank: usize) {
        if self.crash_at_iteration == Some(iteration) {
            eprintln!("rank {rank}: crashing at iteration {iteration} (fault injection)");
            std::process::abort();
        }
    }

    /// Turns `inputs` into NaNs when bad data is due at `iteration`.
    pub(crate) fn poison_if_due(&self, iteration: u64, inputs: &mut Tensor) {
        if self.nan_inputs_at_iteration == Some(iteration) {
            *inputs *= f64::NAN;
        }
    }

    /// Whether a stop request is due at `iteration`.
    pub(crate) fn stop_due(&self, iteration: u64) -> bool {
        self.stop_at_iteration == Some(iteration)
    }
}
