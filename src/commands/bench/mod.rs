//! `ringtrain bench`: what measures the user's own machine, printed beside the reference it is judged
//! against, as a table or (`--json`) one JSON object per measurement. Benchmarks that set up a platform,
//! inject faults, fill databases or compare with PyTorch are `ringtrain-bench`'s (bench/), which starts
//! this binary as a process where it needs one.
//!
//! - `allreduce`: algbw and busbw (nccl-tests definitions) of the TCP ring, next to this machine's memcpy
//!   bandwidth, or of NCCL on GPUs, with exactness checked.
//! - `train`: samples/s and time per step by phase, for k ranks next to one rank without communication
//!   (CPU), or GPU ranks over NCCL (the PyTorch reference runs next to it in scripts/device/check.sh); on a
//!   `shards:` data set, the loader decodes beside the steps (`ringtrain-bench data --train` runs it so).
//! - `pipeline`: a ResNet cut into stages against the unsplit model (throughput, bubble, transfers).

mod allreduce;
mod pipeline;
mod train;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use ringtrain_worker::{Collective, RendezvousConfig, RingCollective, ShmCollective, ShmSegment};

pub use allreduce::AllreduceArgs;
pub use pipeline::PipelineArgs;
pub use train::TrainArgs;

#[derive(Debug, clap::Subcommand)]
pub enum Bench {
    /// All-reduce bandwidth: the TCP ring (k ranks as threads on 127.0.0.1) or NCCL (k GPU processes).
    Allreduce(AllreduceArgs),
    /// Training throughput and time per step by phase.
    Train(TrainArgs),
    /// A ResNet cut into pipeline stages (threads joined by TCP links) against the unsplit model: throughput,
    /// bubble and transfer per step.
    Pipeline(PipelineArgs),
}

pub fn run(bench: Bench) -> ExitCode {
    let outcome = match bench {
        Bench::Allreduce(args) => allreduce::run(&args),
        Bench::Train(args) => train::run(&args),
        Bench::Pipeline(args) => pipeline::run(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn parse_size(text: &str) -> Result<usize> {
    let upper = text.trim().to_ascii_uppercase();
    let (digits, unit) = upper.split_at(upper.find(|c: char| !c.is_ascii_digit()).unwrap_or(upper.len()));
    let n: usize = digits.parse().with_context(|| format!("bad size {text:?}"))?;
    let scale = match unit {
        "" | "B" => 1,
        "KB" | "K" => 1 << 10,
        "MB" | "M" => 1 << 20,
        "GB" | "G" => 1 << 30,
        other => anyhow::bail!("unknown unit {other:?} in {text:?}"),
    };
    Ok(n * scale)
}

fn free_address() -> Result<std::net::SocketAddr> {
    // below the ephemeral range, where no other process's bind(:0) takes it before rank 0 binds it
    Ok(std::net::SocketAddr::from(([127, 0, 0, 1], crate::commands::launch::free_local_port()?)))
}

/// Runs `body` on `world` ranks connected in a ring (threads), returning rank 0's result.
pub(crate) fn on_ring<T: Send + 'static>(
    world: usize,
    body: impl Fn(&mut dyn Collective) -> Result<T> + Send + Sync + Clone + 'static,
) -> Result<T> {
    on_threads(world, |config| Ok(Box::new(RingCollective::connect(config)?)), body)
}

/// Runs `body` on `world` ranks (threads) summing through one shared memory segment of `slot_elems`-float
/// slots, returning rank 0's result.
pub(crate) fn on_shared_memory<T: Send + 'static>(
    world: usize,
    slot_elems: usize,
    body: impl Fn(&mut dyn Collective) -> Result<T> + Send + Sync + Clone + 'static,
) -> Result<T> {
    let segment = std::sync::Arc::new(std::sync::Mutex::new(ShmSegment::create(world, slot_elems)?));
    let connect = move |config: &RendezvousConfig| -> Result<Box<dyn Collective>> {
        let mine = segment.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.share()?;
        Ok(Box::new(ShmCollective::connect(config, mine)?))
    };
    on_threads(world, connect, body)
}

/// Runs `body` on `world` ranks (threads), each joined by `connect` (which runs the rendezvous), returning
/// rank 0's result.
pub(crate) fn on_threads<T: Send + 'static>(
    world: usize,
    connect: impl Fn(&RendezvousConfig) -> Result<Box<dyn Collective>> + Send + Sync + Clone + 'static,
    body: impl Fn(&mut dyn Collective) -> Result<T> + Send + Sync + Clone + 'static,
) -> Result<T> {
    let address = free_address()?;
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (body, connect) = (body.clone(), connect.clone());
            std::thread::spawn(move || -> Result<T> {
                let config = RendezvousConfig {
                    address,
                    rank,
                    world,
                    join_timeout: Duration::from_secs(30),
                    io_timeout: Duration::from_secs(120),
                    secret: None,
                };
                let mut comm = connect(&config)?;
                body(comm.as_mut())
            })
        })
        .collect();
    let mut results: Vec<Result<T>> =
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))).collect();
    for r in results.iter().skip(1) {
        if let Err(e) = r {
            anyhow::bail!("a rank failed: {e:#}");
        }
    }
    results.swap_remove(0)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1MB").unwrap(), 1 << 20);
        assert_eq!(parse_size("256mb").unwrap(), 256 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("3XB").is_err());
    }
}
