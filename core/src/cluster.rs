//! The states of the worker pool's pieces: a node (`up` or `lost`) and an assignment (one rank of one
//! placement on one device), with the transitions the agent protocol allows; and the text of a device kind.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::spec::DeviceKind;

/// Writes the `as_str`/`Display`/`FromStr` trio of a state enum from one list of (variant, text) pairs.
macro_rules! state_text {
    ($ty:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = String;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                $ty::ALL.iter().copied().find(|s| s.as_str() == text).ok_or_else(|| {
                    let names: Vec<&str> = $ty::ALL.iter().map(|s| s.as_str()).collect();
                    format!("unknown {} {text:?}; expected one of {}", stringify!($ty), names.join(", "))
                })
            }
        }
    };
}

state_text!(DeviceKind { Cpu => "cpu", Gpu => "gpu" });

/// Whether a node's agent is heard from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Heartbeating: its devices can be placed on.
    Up,
    /// No heartbeat for the node timeout: its ranks are written off (a heartbeat brings it back up).
    Lost,
}

state_text!(NodeState { Up => "up", Lost => "lost" });

/// One rank's assignment: `pending` (placed) → `delivered` (an agent's poll picked it up) → `running` →
/// `done | failed | cancelled`. The server may also end it (`cancelled` while pending; `failed` when its node
/// is lost). While live (pending, delivered or running) it holds its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AssignmentState {
    Pending,
    Delivered,
    Running,
    Done,
    Failed,
    Cancelled,
}

state_text!(AssignmentState {
    Pending => "pending",
    Delivered => "delivered",
    Running => "running",
    Done => "done",
    Failed => "failed",
    Cancelled => "cancelled",
});

impl AssignmentState {
    /// The states that hold a device.
    pub const LIVE: [AssignmentState; 3] =
        [AssignmentState::Pending, AssignmentState::Delivered, AssignmentState::Running];

    pub fn is_live(self) -> bool {
        Self::LIVE.contains(&self)
    }

    /// What an agent may report: delivered → running → done | failed | cancelled (a delivered rank may also
    /// fail to start, or be stopped before it started).
    pub fn agent_may_report(self, next: AssignmentState) -> bool {
        use AssignmentState::*;
        matches!((self, next), (Delivered, Running | Failed | Cancelled) | (Running, Done | Failed | Cancelled))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_text() {
        for state in AssignmentState::ALL {
            assert_eq!(state.as_str().parse::<AssignmentState>().unwrap(), *state);
        }
        for state in NodeState::ALL {
            assert_eq!(state.as_str().parse::<NodeState>().unwrap(), *state);
        }
        let err = "gone".parse::<NodeState>().unwrap_err();
        assert!(err.contains("up, lost"), "{err}");
    }

    #[test]
    fn agents_only_move_live_assignments_forward() {
        use AssignmentState::*;
        assert!(Delivered.agent_may_report(Running) && Running.agent_may_report(Done));
        for from in AssignmentState::ALL.iter().filter(|s| !s.is_live()) {
            for to in AssignmentState::ALL {
                assert!(!from.agent_may_report(*to), "{from} -> {to}");
            }
        }
        assert!(!Pending.agent_may_report(Running), "a pending rank was never handed to an agent");
        assert!(!Running.agent_may_report(Delivered));
    }
}
