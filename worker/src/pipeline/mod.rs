//! Pipeline parallelism: one worker's model cut into stages, each stage a process (a device) of its own,
//! activations passed forward and their gradients back between neighbouring stages, micro-batches
//! flowing through the stages so they work at once.
//!
//! The micro-batches are the worker's virtual ranks: each keeps its own n samples and its own BatchNorm
//! statistics in every stage, so the split worker trains exactly what the unsplit one does (the recipe's
//! kn normalisation, per-rank BatchNorm, warmup and momentum correction are untouched). Each stage holds
//! only its own weights (see [`crate::models::build_stage`]), computes their gradients, and sums them with
//! the same stage of the other workers.
//!
//! [`link`]: the tensors between stages; [`schedule`]: the order of a step's forward and backward passes;
//! [`stage`]: a stage that trains; [`state`]: a worker's state gathered from its stages and handed back.

pub mod link;
pub mod schedule;
pub mod stage;
pub mod state;

use crate::collective::{connect_rings, CommResult, RendezvousConfig, RingCollective};
pub use link::{StageLinks, Traffic};
pub use schedule::{one_forward_one_backward, StageStep};
pub use stage::{Stage, StepDone};

/// Joins rank `config.rank` = w·S + s of a pipelined job (worker w's stage s; `config.world` = W·S) to
/// both of its groups in one rendezvous: the ring of stage s across the W workers, which sums that stage's
/// gradients, and the chain of worker w's S stages, which passes activations and gradients.
pub fn connect(config: &RendezvousConfig, stages: usize) -> CommResult<(RingCollective, StageLinks)> {
    let stages = stages.max(1);
    let workers = config.world / stages;
    let (worker, stage) = (config.rank / stages, config.rank % stages);
    let across_workers = (0..stages).map(|s| (0..workers).map(|w| w * stages + s).collect());
    let along_stages = (0..workers).map(|w| (w * stages..(w + 1) * stages).collect());
    let rings: Vec<Vec<usize>> = across_workers.chain(along_stages).collect();
    let mut links = connect_rings(config, &rings)?;
    let chain = links[stages + worker].take();
    let ring = links[stage].take();
    let data_parallel = RingCollective::over(worker, workers, ring, config.io_timeout);
    Ok((data_parallel, StageLinks::over(stage, stages, worker * stages, chain, config.io_timeout)?))
}

#[cfg(test)]
mod tests;
