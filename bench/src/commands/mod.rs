//! The subcommands of `ringtrain-bench`, one module each (the soak's in its folder).
//!
//! - `scheduler`, `api`: the placement policy's pass time and the REST API under load.
//! - `metrics`, `history`: the database at scale (10^7 metric points, 10^6 jobs) and the API's reads of it.
//! - `submit`: submit -> first iteration through the platform, next to the ranks alone.
//! - `elastic`: a borrower reclaimed by the owner of half the pool, elastic next to stop-and-requeue.
//! - `scale-search`: the lr scaling search next to the full grid of multipliers it prunes.
//! - `pytorch`, `seeds`: ringtrain against plain PyTorch figure by figure, and accuracy over several seeds.
//! - `data`: the input pipeline from JPEG shards against PyTorch's DataLoader with torchvision.
//! - `soak`: the platform under injected faults (kill -9 of ranks, agents and the server; the database
//!   taken away), checked for lost or doubled work, with its restarts, lost iterations and API latency.

mod data;
mod elastic;
mod pytorch;
mod scale_search;
mod seeds;
mod services;
mod soak;
mod store_scale;
mod submit;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;

pub use data::DataArgs;
pub use elastic::ElasticArgs;
pub use pytorch::PytorchArgs;
pub use scale_search::ScaleSearchArgs;
pub use seeds::SeedsArgs;
pub use services::{ApiArgs, SchedulerArgs};
pub use soak::SoakArgs;
pub use store_scale::{HistoryArgs, MetricsArgs};

#[derive(Debug, clap::Subcommand)]
pub enum Bench {
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
    /// loader against PyTorch's DataLoader with torchvision on the same shards; `--train`: training from the
    /// shards against the same images held in memory.
    Data(DataArgs),
    /// Fault-injection soak: a server and agents on this machine, jobs of several teams, random kill -9 of
    /// ranks, agents and the server, and the database taken away; checks nothing was lost or done twice.
    Soak(SoakArgs),
}

pub fn run(bench: Bench) -> ExitCode {
    let outcome = match bench {
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
            eprintln!("ringtrain-bench: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

static PRODUCT: OnceLock<PathBuf> = OnceLock::new();

/// Which `ringtrain` binary [`product`] names: `given` (`--ringtrain`), else the one beside this executable
/// (cargo builds both into one target folder), else `ringtrain` on the PATH.
pub fn set_product(given: Option<PathBuf>) {
    let beside = || {
        let exe = std::env::current_exe().ok()?;
        let candidate = exe.with_file_name("ringtrain");
        candidate.is_file().then_some(candidate)
    };
    let _ = PRODUCT.set(given.or_else(beside).unwrap_or_else(|| PathBuf::from("ringtrain")));
}

/// The `ringtrain` binary the benchmarks start as processes.
pub fn product() -> PathBuf {
    PRODUCT.get().cloned().unwrap_or_else(|| PathBuf::from("ringtrain"))
}
