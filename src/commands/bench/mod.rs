//! `ringtrain bench`: measurements printed side by side with the reference they are judged against, as a
//! table or (`--json`) one JSON object per measurement.
//!
//! - `allreduce`: algbw and busbw (nccl-tests definitions) of the TCP ring, next to this machine's memcpy
//!   bandwidth, or of NCCL on GPUs, with exactness checked.
//! - `train`: samples/s and time per step by phase, for k ranks next to one rank without communication
//!   (CPU), or GPU ranks over NCCL (the PyTorch reference runs next to it in scripts/device/check.sh).
//! - `scheduler`, `api`: the placement policy's pass time and the REST API under load.
//! - `metrics`, `history`: the database at scale (10^7 metric points, 10^6 jobs) and the API's reads of it.
//! - `submit`: submit -> first iteration through the platform, next to the ranks alone.
//! - `elastic`: a borrower reclaimed by the owner of half the pool, elastic next to stop-and-requeue.
//! - `scale-search`: the lr scaling search next to the full grid of multipliers it prunes.
//! - `pytorch`, `seeds`: ringtrain against plain PyTorch figure by figure, and accuracy over several seeds.
//! - `data`: the input pipeline from JPEG shards against PyTorch's DataLoader with torchvision.
//! - `soak`: the platform under injected faults (kill -9 of ranks, agents and the server; the database
//!   taken away), checked for lost or doubled work, with its restarts, lost iterations and API latency.

mod allreduce;
mod data;
mod elastic;
mod pytorch;
mod scale_search;
mod seeds;
mod services;
mod soak;
mod store_scale;
mod submit;
mod train;

use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use ringtrain_worker::{Collective, RendezvousConfig, RingCollective, ShmCollective, ShmSegment};

pub use allreduce::AllreduceArgs;
pub use data::DataArgs;
pub use elastic::ElasticArgs;
pub use pytorch::PytorchArgs;
pub use scale_search::ScaleSearchArgs;
pub use seeds::SeedsArgs;
pub use services::{ApiArgs, SchedulerArgs};
pub use soak::SoakArgs;
pub use store_scale::{HistoryArgs, MetricsArgs};
pub use train::TrainArgs;

#[derive(Debug, clap::Subcommand)]
pub enum Bench {
    /// All-reduce bandwidth: the TCP ring (k ranks as threads on 127.0.0.1) or NCCL (k GPU processes).
    Allreduce(AllreduceArgs),
    /// Training throughput and time per step by phase.
    Train(TrainArgs),
    /// Time of one placement-policy pass on a synthetic cluster (pure CPU, no database).
    Scheduler(SchedulerArgs),
    /// Submit -> first iteration reported, through a running server and its agents (e.g. `ringtrain up`), next
    /// to the same spec's k rank processes started directly.
    Submit(submit::SubmitArgs),
    /// REST API load: job submissions per second with p50/p99 latency, and `GET /v1/jobs` page latency with a
    /// large run history, against a running `ringtrain serve` (use Postgres for the figures that matter).
    Api(ApiArgs),
    /// Metrics at scale: 10^7 points of one job written as the API writes reports, then the reads the API
    /// makes of them (pages, the cursor, downsampled curves, every rank's progress), on Postgres.
    Metrics(MetricsArgs),
    /// The run history at scale: 10^6 jobs of one team, then the pages `GET /v1/jobs` reads (newest, deep
    /// through the cursor, by state, name prefix, tag and text), on Postgres.
    History(HistoryArgs),
    /// Elastic against stop-and-requeue: a borrower's job over the whole pool reclaimed by the owner of half of it,
    /// elastic (shrunk and grown back) and fixed (stopped and requeued), side by side.
    Elastic(ElasticArgs),
    /// The lr scaling search (successive halving over multipliers from the square-root to the linear rule)
    /// next to the full grid of the same points: the choice against the grid's best, and the device-hours.
    ScaleSearch(ScaleSearchArgs),
    /// ringtrain against plain PyTorch on this machine, figure by figure in one run: the all-reduce against
    /// Gloo, a training step against eager and DDP, and a spec end to end against the same recipe in PyTorch.
    Pytorch(PytorchArgs),
    /// Accuracy over several seeds: a spec's final test error per seed and as mean ± sd, ringtrain (each
    /// initialisation asked for) against the same recipe in plain PyTorch, with the paired difference.
    Seeds(SeedsArgs),
    /// The input pipeline: images/s per core decoded and augmented into batches from JPEG shards, ringtrain's
    /// loader against PyTorch's DataLoader with torchvision on the same shards.
    Data(DataArgs),
    /// Fault-injection soak: a server and agents on this machine, jobs of several teams, random kill -9 of
    /// ranks, agents and the server, and the database taken away; checks nothing was lost or done twice.
    Soak(SoakArgs),
}

pub fn run(bench: Bench) -> ExitCode {
    let outcome = match bench {
        Bench::Allreduce(args) => allreduce::run(&args),
        Bench::Train(args) => train::run(&args),
        Bench::Scheduler(args) => services::scheduler(&args),
        Bench::Api(args) => services::api(&args),
        Bench::Submit(args) => submit::run(&args),
        Bench::Metrics(args) => store_scale::metrics(&args),
        Bench::History(args) => store_scale::history(&args),
        Bench::Soak(args) => soak::run(&args),
        Bench::Elastic(args) => elastic::run(&args),
        Bench::ScaleSearch(args) => scale_search::run(&args),
        Bench::Pytorch(args) => pytorch::run(&args),
        Bench::Seeds(args) => seeds::run(&args),
        Bench::Data(args) => data::run(&args),
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
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
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
