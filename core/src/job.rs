//! The job life cycle, shared by the store, the API and the scheduler.

use std::fmt;

use serde::{Deserialize, Serialize};

pub use crate::ids::JobId;

/// `queued -> scheduled -> running -> succeeded | failed | cancelled`; a preempted or failed-but-retryable
/// attempt goes back to `queued` and resumes from its last checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Scheduled,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    /// Ended at a checkpoint by a study's search (successive halving: not among the best at a rung), its
    /// figures and checkpoints kept; the search resumes it if a later result puts it among the best.
    Stopped,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Queued,
        JobState::Scheduled,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Scheduled => "scheduled",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Stopped => "stopped",
        }
    }

    /// A job in a terminal state never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled | JobState::Stopped)
    }

    /// Whether the life cycle allows going from `self` to `next`.
    pub fn can_become(self, next: JobState) -> bool {
        use JobState::*;
        match (self, next) {
            (Queued, Scheduled | Cancelled | Failed | Stopped) => true,
            // back to the queue: preempted, or the agent lost its lease before the ranks started
            (Scheduled, Running | Queued | Failed | Cancelled | Stopped) => true,
            // back to the queue: preempted or retrying from the last checkpoint
            (Running, Succeeded | Failed | Cancelled | Queued | Stopped) => true,
            _ => false,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for JobState {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        JobState::ALL.into_iter().find(|s| s.as_str() == text).ok_or_else(|| {
            format!("unknown state {text:?}; expected one of queued, scheduled, running, succeeded, failed, cancelled, stopped")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_are_final() {
        for from in JobState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in JobState::ALL {
                assert!(!from.can_become(to), "{from} -> {to} must be refused");
            }
        }
    }

    #[test]
    fn states_round_trip_through_text() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>().unwrap(), state);
        }
        assert!("done".parse::<JobState>().is_err());
    }
}
