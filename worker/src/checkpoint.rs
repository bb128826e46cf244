//! Checkpoints, written by rank 0 only and atomically: everything goes into `epoch-NNNN.tmp/`, which is then
//! renamed to `epoch-NNNN/`, and the `latest` file (itself replaced by rename) names it. A crash at any
//! point leaves the previous checkpoint intact.
//!
//! Contents: `model.safetensors` (weights, identical on every rank), `optimizer.safetensors` (momentum
//! buffers, identical on every rank), `batch_norm.safetensors` (the running statistics of EVERY rank, since
//! they differ by rank), `state.json` (epochs done, next iteration, the lr of the last step, curves so far).
//! The only randomness after initialisation is the per-epoch shuffle, a pure function of (seed, epoch), so
//! no RNG state beyond the epoch is needed to resume bit for bit.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::metrics::EpochRecord;

pub const LATEST: &str = "latest";
const KEEP: usize = 2;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckpointState {
    /// Epochs fully trained; training resumes at this epoch.
    pub epochs_done: u64,
    /// The next global iteration.
    pub next_iteration: u64,
    /// The lr of the last step taken (the denominator of the next momentum correction).
    pub last_lr: Option<f64>,
    pub seed: u64,
    /// Total ranks k (virtual ranks included) that wrote it: its BN statistics are per rank.
    pub world: usize,
    pub history: Vec<EpochRecord>,
    /// Set when the checkpoint was taken mid-epoch (a stop on request): the interrupted epoch's sums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialEpoch>,
}

/// The running sums of an epoch interrupted by a stop, so that its record comes out as if it had not been.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct PartialEpoch {
    pub loss_sum: f64,
    pub wrong_sum: f64,
    /// Seconds the epoch ran before the stop.
    pub seconds: f64,
}

/// The named tensors of a checkpoint, by file.
#[derive(Debug, Default)]
pub struct CheckpointTensors {
    pub model: Vec<(String, Tensor)>,
    pub optimizer: Vec<(String, Tensor)>,
    pub batch_norm: Vec<(String, Tensor)>,
}

/// `epoch-0007` for a checkpoint after 7 epochs; `epoch-0007-iter-0000000450` for one taken mid-epoch,
/// before iteration 450. Names sort in training order.
fn dir_name(state: &CheckpointState) -> String {
    match state.partial {
        None => format!("epoch-{:04}", state.epochs_done),
        Some(_) => format!("epoch-{:04}-iter-{:010}", state.epochs_done, state.next_iteration),
    }
}

pub fn write(root: &Path, state: &CheckpointState, tensors: &CheckpointTensors) -> Result<PathBuf> {
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    let name = dir_name(state);
    let tmp = root.join(format!("{name}.tmp"));
    let done = root.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    for (file, named) in [
        ("model.safetensors", &tensors.model),
        ("optimizer.safetensors", &tensors.optimizer),
        ("batch_norm.safetensors", &tensors.batch_norm),
    ] {
        if !named.is_empty() {
            Tensor::write_safetensors(named, tmp.join(file)).with_context(|| format!("cannot write {file}"))?;
        }
    }
    std::fs::write(tmp.join("state.json"), serde_json::to_vec_pretty(state)?)?;
    if done.exists() {
        std::fs::remove_dir_all(&done)?;
    }
    std::fs::rename(&tmp, &done)?;
    let latest_tmp = root.join(format!("{LATEST}.tmp"));
    std::fs::write(&latest_tmp, &name)?;
    std::fs::rename(&latest_tmp, root.join(LATEST))?;
    prune(root, KEEP)?;
    Ok(done)
}

/// Keeps the newest `keep` checkpoints.
fn prune(root: &Path, keep: usize) -> Result<()> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("epoch-") && !n.ends_with(".tmp"))
        })
        .collect();
    dirs.sort();
    let excess = dirs.len().saturating_sub(keep);
    for dir in &dirs[..excess] {
        std::fs::remove_dir_all(dir)?;
    }
    Ok(())
}

/// The newest complete checkpoint under `root`, if any.
pub fn latest(root: &Path) -> Result<Option<PathBuf>> {
    let pointer = root.join(LATEST);
    if !pointer.exists() {
        return Ok(None);
    }
    let name = std::fs::read_to_string(&pointer)?;
    let dir = root.join(name.trim());
    anyhow::ensure!(dir.is_dir(), "{} names {}, which does not exist", pointer.display(), dir.display());
    Ok(Some(dir))
}

pub fn read(dir: &Path) -> Result<(CheckpointState, CheckpointTensors)> {
    let state: CheckpointState = serde_json::from_slice(
        &std::fs::read(dir.join("state.json")).with_context(|| format!("{} has no state.json", dir.display()))?,
    )?;
    let load = |file: &str| -> Result<Vec<(String, Tensor)>> {
        let path = dir.join(file);
        if path.exists() {
            Tensor::read_safetensors(&path).with_context(|| format!("cannot read {}", path.display()))
        } else {
            Ok(Vec::new())
        }
    };
    let tensors = CheckpointTensors {
        model: load("model.safetensors")?,
        optimizer: load("optimizer.safetensors")?,
        batch_norm: load("batch_norm.safetensors")?,
    };
    Ok((state, tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_atomically_keeps_two_and_reads_back() {
        let root = std::env::temp_dir().join(format!("ringtrain-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        assert!(latest(&root).unwrap().is_none());
        for epoch in 1..=3 {
            let state = CheckpointState {
                epochs_done: epoch,
                next_iteration: epoch * 10,
                last_lr: Some(0.1),
                seed: 1,
                world: 2,
                history: vec![],
                partial: None,
            };
            let tensors = CheckpointTensors {
                model: vec![("w".into(), Tensor::from_slice(&[epoch as f32]))],
                ..Default::default()
            };
            write(&root, &state, &tensors).unwrap();
        }
        let dir = latest(&root).unwrap().unwrap();
        assert!(dir.ends_with("epoch-0003"));
        let (state, tensors) = read(&dir).unwrap();
        assert_eq!(state.next_iteration, 30);
        assert_eq!(Vec::<f32>::try_from(&tensors.model[0].1).unwrap(), vec![3.0]);
        assert!(!root.join("epoch-0001").exists(), "only the newest two are kept");
        assert!(root.join("epoch-0002").exists());
        std::fs::remove_dir_all(root).unwrap();
    }
}
