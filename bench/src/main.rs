//! `ringtrain-bench`: ringtrain's benchmarks that are not the product's. Each prints its figures beside
//! the reference it is judged against (`--json`: one object per measurement). Those that need a platform
//! start the `ringtrain` binary (`--ringtrain`) as processes: a server, agents, ranks; none links libtorch.
//! What measures the user's own machine stays in the product (`ringtrain bench allreduce|train`).

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "ringtrain-bench", version, about = "ringtrain's benchmarks: platforms under load and faults, \
    databases at scale, PyTorch side by side", long_about = None)]
struct Cli {
    /// The `ringtrain` binary the benchmarks start (default: the one beside this executable, else `ringtrain`
    /// on the PATH).
    #[arg(long, env = "RINGTRAIN_EXE", global = true)]
    ringtrain: Option<PathBuf>,
    #[command(subcommand)]
    bench: commands::Bench,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    commands::set_product(cli.ringtrain);
    commands::run(cli.bench)
}
