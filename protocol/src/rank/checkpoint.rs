//! A rank's checkpoint folders: their names (formatted by the worker, parsed by the server and the agent)
//! and the files in them.

/// A trainer checkpoint folder's name: `epoch-0007` for a checkpoint after 7 epochs, `epoch-0007-iter-
/// 0000000450` for one taken mid-epoch (a preempted or stopped job), before iteration 450. Names sort in
/// training order. The worker formats it; the server (checking an upload's `name`) and the agent
/// (unpacking a resume archive) parse it, and only the canonical form parses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointName {
    pub epochs_done: u64,
    /// Set for a mid-epoch checkpoint: the first iteration not yet trained.
    pub next_iteration: Option<u64>,
}

impl CheckpointName {
    /// The name as the worker writes it, or None for anything else (padding, signs or words included).
    pub fn parse(name: &str) -> Option<CheckpointName> {
        let rest = name.strip_prefix("epoch-")?;
        let number = |digits: &str| digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse().ok()).flatten();
        let parsed = match rest.split_once("-iter-") {
            Some((epochs, iteration)) => {
                CheckpointName { epochs_done: number(epochs)?, next_iteration: Some(number(iteration)?) }
            }
            None => CheckpointName { epochs_done: number(rest)?, next_iteration: None },
        };
        (parsed.to_string() == name).then_some(parsed)
    }
}

impl std::fmt::Display for CheckpointName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.next_iteration {
            None => write!(f, "epoch-{:04}", self.epochs_done),
            Some(iteration) => write!(f, "epoch-{:04}-iter-{iteration:010}", self.epochs_done),
        }
    }
}

/// The files of a checkpoint folder, as the worker writes them.
pub mod checkpoint_files {
    /// The model's weights (safetensors, by the names its state dict gives them).
    pub const MODEL: &str = "model.safetensors";
    /// The optimizer's momentum buffers.
    pub const OPTIMIZER: &str = "optimizer.safetensors";
    /// Each rank's BatchNorm statistics.
    pub const BATCH_NORM: &str = "batch_norm.safetensors";
    /// Where training stood (epochs, iteration, the partial epoch's tallies).
    pub const STATE: &str = "state.json";
    /// An uploaded model's TorchScript module with the checkpoint's weights (uploaded models only).
    pub const SCRIPT: &str = "model.pt";
    /// Every file a checkpoint folder may hold: an archive with anything else is refused.
    pub const ALL: &[&str] = &[MODEL, OPTIMIZER, BATCH_NORM, STATE, SCRIPT];
}

/// What an agent reads of a checkpoint's `state.json` (the worker's `CheckpointState` holds more): where
/// training stood, which the server records with the uploaded checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct CheckpointProgress {
    /// Epochs fully trained.
    pub epochs_done: u64,
    /// The first iteration not yet trained.
    pub next_iteration: u64,
}

#[cfg(test)]
mod tests {
    use super::{CheckpointName, CheckpointProgress};

    #[test]
    fn an_agent_reads_where_a_checkpoint_stood_from_the_workers_state() {
        let state =
            r#"{"epochs_done": 3, "next_iteration": 450, "last_lr": 0.1, "seed": 7, "world": 2, "history": []}"#;
        let progress: CheckpointProgress = serde_json::from_str(state).unwrap();
        assert_eq!(progress, CheckpointProgress { epochs_done: 3, next_iteration: 450 });
        assert!(serde_json::from_str::<CheckpointProgress>(r#"{"epochs_done": 3}"#).is_err());
    }

    #[test]
    fn checkpoint_names_round_trip_and_nothing_else_parses() {
        let epoch = CheckpointName { epochs_done: 7, next_iteration: None };
        let mid = CheckpointName { epochs_done: 7, next_iteration: Some(450) };
        assert_eq!(epoch.to_string(), "epoch-0007");
        assert_eq!(mid.to_string(), "epoch-0007-iter-0000000450");
        assert_eq!(CheckpointName::parse("epoch-0007"), Some(epoch));
        assert_eq!(CheckpointName::parse("epoch-0007-iter-0000000450"), Some(mid));
        let long = CheckpointName { epochs_done: 123_456, next_iteration: Some(12_345_678_901) };
        assert_eq!(CheckpointName::parse(&long.to_string()), Some(long));
        for bad in [
            "epoch-7",
            "epoch-00007",
            "epoch-0007-iter-450",
            "epoch-+007",
            "epoch-0007-iter-",
            "epoch-",
            "epoch-0007/..",
            "epoch-\nssh-ed25519",
            "latest",
            "epoch-0007-iter-0000000450-attempt-2",
            "epoch-99999999999999999999",
        ] {
            assert_eq!(CheckpointName::parse(bad), None, "{bad:?}");
        }
        assert!("epoch-0002" < "epoch-0002-iter-0000000001" && "epoch-0002-iter-0000000001" < "epoch-0003");
    }
}
