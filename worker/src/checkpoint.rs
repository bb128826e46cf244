//! Checkpoints: what one contains, how the ranks agree on where to start from one, and how rank 0 writes
//! it.
//!
//! Contents: `model.safetensors` (weights, identical on every rank, with rank 0's BatchNorm statistics),
//! `optimizer.safetensors` (momentum buffers, identical on every rank), `batch_norm.safetensors` (the
//! running statistics of EVERY rank, since they differ by rank), `state.json` (epochs done, next iteration,
//! the lr of the last step, curves so far, and for a checkpoint taken mid-epoch that epoch's running sums).
//! The only randomness after initialisation is the per-epoch shuffle, a pure function of (seed, epoch), so
//! no RNG state beyond the iteration is needed to resume bit for bit.
//!
//! Every rank takes part in both directions ([`Replica::agree_on_start`], [`Replica::save`]) because the
//! BatchNorm statistics are spread over the ranks; only rank 0 reads and writes files. It writes
//! atomically: everything goes into `epoch-NNNN.tmp/`, which is then renamed to `epoch-NNNN/`, and the
//! `latest` file (itself replaced by rename) names it. A crash at any point leaves the previous checkpoint
//! intact.
//!
//! Over 450 lines with its tests (454 of code): what a checkpoint holds, how the ranks agree on it and
//! how rank 0 writes it change together.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use ringtrain_core::Effective;
use ringtrain_protocol::rank::{checkpoint_files, CheckpointName};
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::batch_norm::BatchNormState;
use crate::collective::{from_host, to_host, Collective, CommResult};
use crate::metrics::EpochRecord;
use crate::models::scripted::ScriptModule;
use crate::optim::Sgd;

/// The file naming the newest complete checkpoint folder: the agent reads it too, so it is the protocol's.
pub use ringtrain_protocol::rank::LATEST;

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

/// The folder's name (`protocol::rank::CheckpointName`): `epoch-0007`, or `epoch-0007-iter-0000000450`
/// mid-epoch. Names sort in training order.
fn dir_name(state: &CheckpointState) -> String {
    let next_iteration = state.partial.as_ref().map(|_| state.next_iteration);
    CheckpointName { epochs_done: state.epochs_done, next_iteration }.to_string()
}

/// The TorchScript file of an uploaded model's weights in a checkpoint folder (with rank 0's BatchNorm
/// statistics), loadable with `torch.jit.load`.
pub const SCRIPT_FILE: &str = checkpoint_files::SCRIPT;

pub fn write(root: &Path, state: &CheckpointState, tensors: &CheckpointTensors) -> Result<PathBuf> {
    write_with(root, state, tensors, &|_| Ok(()))
}

/// [`write`], with `extra` writing more files into the folder before it is complete.
pub fn write_with(
    root: &Path,
    state: &CheckpointState,
    tensors: &CheckpointTensors,
    extra: &dyn Fn(&Path) -> Result<()>,
) -> Result<PathBuf> {
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    let name = dir_name(state);
    let tmp = root.join(format!("{name}.tmp"));
    let done = root.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    for (file, named) in [
        (checkpoint_files::MODEL, &tensors.model),
        (checkpoint_files::OPTIMIZER, &tensors.optimizer),
        (checkpoint_files::BATCH_NORM, &tensors.batch_norm),
    ] {
        if !named.is_empty() {
            Tensor::write_safetensors(named, tmp.join(file)).with_context(|| format!("cannot write {file}"))?;
        }
    }
    extra(&tmp)?;
    std::fs::write(tmp.join(checkpoint_files::STATE), serde_json::to_vec_pretty(state)?)?;
    if done.exists() {
        std::fs::remove_dir_all(&done)?;
    }
    std::fs::rename(&tmp, &done)?;
    write_atomically(&root.join(LATEST), name.as_bytes())?;
    prune(root, KEEP)?;
    Ok(done)
}

/// Keeps the newest `keep` checkpoints.
fn prune(root: &Path, keep: usize) -> Result<()> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_dir() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| CheckpointName::parse(n).is_some())
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
    ensure!(dir.is_dir(), "{} names {}, which does not exist", pointer.display(), dir.display());
    Ok(Some(dir))
}

pub fn read(dir: &Path) -> Result<(CheckpointState, CheckpointTensors)> {
    let state: CheckpointState = serde_json::from_slice(
        &std::fs::read(dir.join(checkpoint_files::STATE))
            .with_context(|| format!("{} has no {}", dir.display(), checkpoint_files::STATE))?,
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
        model: load(checkpoint_files::MODEL)?,
        optimizer: load(checkpoint_files::OPTIMIZER)?,
        batch_norm: load(checkpoint_files::BATCH_NORM)?,
    };
    Ok((state, tensors))
}

/// Writes `bytes` to `path` by way of `path.tmp` and a rename, so that a reader, or a crash, never sees half
/// a file.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Where every rank starts training: the same on all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StartPoint {
    /// The first global iteration to take: 0, or where the checkpoint was taken.
    pub next_iteration: u64,
    /// The interrupted epoch's running sums when resuming mid-epoch (zeros otherwise).
    pub partial: PartialEpoch,
}

/// What one rank holds that a checkpoint saves and a resume restores, borrowed from the trainer for one
/// exchange between the ranks.
pub(crate) struct Replica<'a> {
    pub comm: &'a mut dyn Collective,
    pub opt: &'a mut Sgd,
    pub bn: &'a mut BatchNormState,
    /// k: every rank of the job, virtual ones included.
    pub total_ranks: usize,
    pub seed: u64,
    pub effective: &'a Effective,
    /// An uploaded model, saved as TorchScript in each checkpoint besides the safetensors weights.
    pub script: Option<&'a ScriptModule>,
}

impl Replica<'_> {
    fn is_root(&self) -> bool {
        self.comm.rank() == 0
    }

    /// Rank 0 reads the newest checkpoint under `resume_from` (if any), then broadcasts the start point, the
    /// weights (so that without a checkpoint every rank starts from rank 0's initialisation) and, when
    /// resuming, the momentum buffers and every rank's BatchNorm statistics. A fork (`forked`, on every
    /// rank: the spec has `init_from`) that does not resume starts at iteration 0 from the weights of the
    /// newest checkpoint under `init_from` (rank 0's), with its BatchNorm statistics on every rank and fresh
    /// momentum. Returns the start point and, on rank 0, the epoch records so far.
    pub(crate) fn agree_on_start(
        &mut self,
        resume_from: Option<&Path>,
        forked: bool,
        init_from: Option<&Path>,
    ) -> Result<(StartPoint, Vec<EpochRecord>)> {
        let loaded = match resume_from.filter(|_| self.is_root()) {
            Some(root) => latest(root)?.map(|dir| read(&dir)).transpose()?,
            None => None,
        };
        // a placement that resumes the fork's own checkpoint has no use for where the fork began
        let initial = match (forked && self.is_root() && loaded.is_none(), init_from) {
            (true, Some(root)) => {
                let dir = latest(root)?.context("the starting checkpoint (init_from) holds no checkpoint")?;
                Some(read(&dir)?.1.model)
            }
            (true, None) => bail!("the spec's init_from names a starting checkpoint, but this rank was given none"),
            (false, _) => None,
        };
        let start = broadcast_start(&mut *self.comm, loaded.as_ref().map(|(state, _)| state))?;
        let mut history = Vec::new();
        if let Some((state, tensors)) = &loaded {
            self.check(state)?;
            for p in self.opt.params() {
                let saved = find(&tensors.model, &p.name)?;
                tch::no_grad(|| p.tensor.shallow_clone().copy_(saved));
            }
            self.opt.load_state(&tensors.optimizer)?;
            history = state.history.clone();
        }
        if let Some(model) = &initial {
            self.load_weights(model)?;
        }
        let params: Vec<&Tensor> = self.opt.params().iter().map(|p| &p.tensor).collect();
        broadcast_from_root(&mut *self.comm, &params)?;

        if start.next_iteration > 0 {
            let momentum = self.opt.state();
            broadcast_from_root(&mut *self.comm, &momentum.iter().map(|(_, t)| t).collect::<Vec<_>>())?;
            self.opt.set_last_lr(last_lr(self.effective, start.next_iteration));
            let mut all = vec![0.0f32; self.bn.len() * self.total_ranks];
            if let Some((_, tensors)) = &loaded {
                self.read_batch_norm(&tensors.batch_norm, &mut all)?;
            }
            self.comm.broadcast(&mut all, 0)?;
            self.bn.scatter(&all, self.comm.rank());
        } else if forked && self.bn.len() > 0 {
            let mut all = vec![0.0f32; self.bn.len() * self.total_ranks];
            if let Some(model) = &initial {
                self.spread_batch_norm(model, &mut all)?;
            }
            self.comm.broadcast(&mut all, 0)?;
            self.bn.scatter(&all, self.comm.rank());
        }
        Ok((start, history))
    }

    /// A fork's starting weights, each checked against the shape this model gives it (a tensor of another
    /// shape would otherwise be broadcast into it silently).
    fn load_weights(&self, model: &[(String, Tensor)]) -> Result<()> {
        for p in self.opt.params() {
            let saved = find(model, &p.name).context("the starting checkpoint (init_from) is of another model")?;
            ensure!(
                saved.size() == p.tensor.size(),
                "the starting checkpoint's {} has shape {:?}, this model's {:?}: it is of another model or data shape",
                p.name,
                saved.size(),
                p.tensor.size()
            );
            tch::no_grad(|| p.tensor.shallow_clone().copy_(saved));
        }
        Ok(())
    }

    /// The BatchNorm statistics of a checkpoint's model file (rank 0's, by buffer name) as every rank's,
    /// laid out as [`BatchNormState::gather`] lays them.
    fn spread_batch_norm(&self, model: &[(String, Tensor)], all: &mut [f32]) -> Result<()> {
        let b = self.bn.len();
        for (offset, (name, t)) in offsets(self.bn.buffers()) {
            let saved = find(model, name)?;
            let n = t.numel();
            ensure!(
                saved.numel() == n,
                "the starting checkpoint's {name} has {} values, this model's {n}",
                saved.numel()
            );
            for vr in 0..self.total_ranks {
                saved.to_kind(Kind::Float).contiguous().copy_data(&mut all[vr * b + offset..vr * b + offset + n], n);
            }
        }
        Ok(())
    }

    fn check(&self, state: &CheckpointState) -> Result<()> {
        ensure!(
            state.seed == self.seed,
            "the checkpoint was made with seed {}, the spec says {}",
            state.seed,
            self.seed
        );
        ensure!(
            state.world == self.total_ranks,
            "the checkpoint has {} ranks' BN statistics, this run has {}",
            state.world,
            self.total_ranks
        );
        Ok(())
    }

    /// Every rank's saved statistics (`rank{r}.{buffer}`), laid out as [`BatchNormState::gather`] lays them.
    fn read_batch_norm(&self, saved: &[(String, Tensor)], all: &mut [f32]) -> Result<()> {
        let b = self.bn.len();
        for vr in 0..self.total_ranks {
            for (offset, (name, t)) in offsets(self.bn.buffers()) {
                let tensor = find(saved, &format!("rank{vr}.{name}"))?;
                let n = t.numel();
                tensor.to_kind(Kind::Float).contiguous().copy_data(&mut all[vr * b + offset..vr * b + offset + n], n);
            }
        }
        Ok(())
    }

    /// Writes a checkpoint from which training resumes at `next_iteration` (an epoch boundary, or mid-epoch
    /// with the interrupted epoch's `partial` sums) under `out_dir/checkpoints`. Every rank calls it, to
    /// gather the BatchNorm statistics; only rank 0 writes, and only when there is an `out_dir`.
    pub(crate) fn save(
        &mut self,
        out_dir: Option<&Path>,
        next_iteration: u64,
        partial: Option<PartialEpoch>,
        history: &[EpochRecord],
    ) -> Result<()> {
        let Some(out) = out_dir else {
            self.snapshot(next_iteration, partial, history, false)?;
            return Ok(());
        };
        let Some((state, tensors, all_bn)) = self.snapshot(next_iteration, partial, history, true)? else {
            return Ok(());
        };
        let b = self.bn.len();
        let bn = &*self.bn;
        let script = self.script;
        // the TorchScript file carries rank 0's statistics, as model.safetensors does; this rank's own are
        // put back afterwards
        let save_script = |dir: &Path| -> Result<()> {
            let Some(module) = script else { return Ok(()) };
            let own = bn.snapshot();
            bn.restore(&all_bn[..b]);
            let saved = module.save(&dir.join(SCRIPT_FILE));
            bn.restore(&own);
            saved
        };
        write_with(&out.join("checkpoints"), &state, &tensors, &save_script)?;
        Ok(())
    }

    /// Gathers every rank's BatchNorm tables (a collective: every rank calls it) and, on rank 0 when
    /// `keep`, returns what a checkpoint of this point holds, with the gathered tables.
    pub(crate) fn snapshot(
        &mut self,
        next_iteration: u64,
        partial: Option<PartialEpoch>,
        history: &[EpochRecord],
        keep: bool,
    ) -> Result<Option<(CheckpointState, CheckpointTensors, Vec<f32>)>> {
        let all_bn = self.bn.gather(&mut *self.comm, self.total_ranks)?;
        if !(keep && self.is_root()) {
            return Ok(None);
        }
        let b = self.bn.len();
        let mut model: Vec<(String, Tensor)> =
            self.opt.params().iter().map(|p| (p.name.clone(), p.tensor.detach().copy())).collect();
        let mut batch_norm = Vec::new();
        for (offset, (name, t)) in offsets(self.bn.buffers()) {
            let shape = t.size();
            let n = t.numel();
            // the model file carries rank 0's statistics: the ones evaluation uses
            model.push((name.clone(), Tensor::from_slice(&all_bn[offset..offset + n]).view(shape.as_slice())));
            for vr in 0..self.total_ranks {
                let at = vr * b + offset;
                batch_norm
                    .push((format!("rank{vr}.{name}"), Tensor::from_slice(&all_bn[at..at + n]).view(shape.as_slice())));
            }
        }
        let state = CheckpointState {
            epochs_done: next_iteration / self.effective.iterations_per_epoch.max(1),
            next_iteration,
            last_lr: last_lr(self.effective, next_iteration),
            seed: self.seed,
            world: self.total_ranks,
            history: history.to_vec(),
            partial,
        };
        let tensors = CheckpointTensors { model, optimizer: self.opt.state(), batch_norm };
        Ok(Some((state, tensors, all_bn)))
    }
}

/// The lr of the step before `next_iteration`, if any: the denominator of the next momentum correction.
fn last_lr(effective: &Effective, next_iteration: u64) -> Option<f64> {
    next_iteration.checked_sub(1).map(|t| effective.lr_at(t))
}

/// Broadcasts rank 0's start point bit for bit: the next iteration and the f64 sums travel as 16-bit pieces,
/// each exact in the f32 broadcast.
fn broadcast_start(comm: &mut dyn Collective, state: Option<&CheckpointState>) -> CommResult<StartPoint> {
    let (next, partial) =
        state.map_or((0, PartialEpoch::default()), |s| (s.next_iteration, s.partial.unwrap_or_default()));
    let mut header = [next, partial.loss_sum.to_bits(), partial.wrong_sum.to_bits(), partial.seconds.to_bits()]
        .iter()
        .flat_map(|&word| pack_u64(word))
        .collect::<Vec<f32>>();
    comm.broadcast(&mut header, 0)?;
    let words: Vec<u64> = header.chunks(4).map(unpack_u64).collect();
    Ok(StartPoint {
        next_iteration: words[0],
        partial: PartialEpoch {
            loss_sum: f64::from_bits(words[1]),
            wrong_sum: f64::from_bits(words[2]),
            seconds: f64::from_bits(words[3]),
        },
    })
}

/// A u64 as four 16-bit pieces, each exact in an f32.
fn pack_u64(value: u64) -> [f32; 4] {
    [0, 16, 32, 48].map(|shift| ((value >> shift) & 0xFFFF) as f32)
}

fn unpack_u64(pieces: &[f32]) -> u64 {
    pieces.iter().zip([0, 16, 32, 48]).fold(0, |acc, (&p, shift)| acc | ((p as u64) << shift))
}

/// Copies rank 0's `tensors` to every rank, as one message.
fn broadcast_from_root(comm: &mut dyn Collective, tensors: &[&Tensor]) -> CommResult<()> {
    let mut host = Vec::new();
    to_host(tensors.iter().copied(), &mut host);
    comm.broadcast(&mut host, 0)?;
    from_host(&host, tensors.iter().copied());
    Ok(())
}

/// Each buffer with where its values start in a table.
fn offsets(buffers: &[(String, Tensor)]) -> Vec<(usize, &(String, Tensor))> {
    let mut offset = 0;
    buffers
        .iter()
        .map(|entry| {
            let at = offset;
            offset += entry.1.numel();
            (at, entry)
        })
        .collect()
}

fn find<'a>(named: &'a [(String, Tensor)], name: &str) -> Result<&'a Tensor> {
    named
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .with_context(|| format!("the checkpoint has no tensor {name}"))
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

    #[test]
    fn u64_pieces_round_trip_through_f32() {
        for value in [0, 1, 0xFFFF, 0x1_0000, u64::MAX, 0.1f64.to_bits(), 123_456_789_012_345] {
            assert_eq!(unpack_u64(&pack_u64(value)), value);
        }
    }

    #[test]
    fn writes_atomically_through_a_tmp_file() {
        let dir = std::env::temp_dir().join(format!("ringtrain-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("result.json");
        write_atomically(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        assert!(!dir.join("result.json.tmp").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
