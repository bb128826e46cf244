//! The `ringtrain` binary: one executable for every role (server, agent, rank, tools).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod commands;

#[derive(Debug, Parser)]
#[command(
    name = "ringtrain",
    version,
    about = "Training as a service: Goyal et al.'s large-minibatch SGD on a shared worker pool"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the effective hyperparameters and the learning-rate schedule of a job spec as JSON.
    Schedule(commands::schedule::Args),
    /// Serve the REST API (Postgres or embedded SQLite).
    Serve(commands::serve::Args),
    /// Train: one rank of a job (--rank/--world/--rendezvous), or K local rank processes (--local K).
    Train(commands::train::Args),
    /// Benchmarks, printed next to their reference (`--json` for one object per measurement).
    #[command(subcommand)]
    Bench(commands::bench::Bench),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Schedule(args) => commands::schedule::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Bench(bench) => commands::bench::run(bench),
    }
}
