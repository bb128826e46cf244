//! The `ringtrain` binary: one executable for every role (server, agent, rank, tools).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod commands;
mod telemetry;

#[derive(Debug, Parser)]
#[command(
    name = "ringtrain",
    version,
    about = "Training as a service: Goyal et al.'s large-minibatch SGD on a shared worker pool"
)]
struct Cli {
    /// How log lines (on stderr) are written.
    #[arg(long, global = true, value_enum, env = "RINGTRAIN_LOG_FORMAT", default_value = "text")]
    log_format: telemetry::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the effective hyperparameters and the learning-rate schedule of a job spec as JSON.
    Schedule(commands::schedule::Args),
    /// The quickstart: server (embedded SQLite) and a local agent with this machine's devices.
    Up(commands::up::Args),
    /// Serve the REST API and run the scheduler (Postgres or embedded SQLite).
    Serve(Box<commands::serve::Args>),
    /// Run a node agent: offer this machine's devices to a server and run the ranks it places here.
    Agent(commands::agent::Args),
    /// Train: one rank of a job (--rank/--world/--rendezvous), or K local rank processes (--local K).
    Train(commands::train::Args),
    /// Save a server and token for the commands below (`RINGTRAIN_SERVER`/`RINGTRAIN_TOKEN` still win).
    Login(commands::login::Args),
    /// Jobs from the terminal: submit, list, show, cancel, watch, logs, metrics, schedule, weights.
    #[command(subcommand)]
    Jobs(commands::jobs::Jobs),
    /// Studies: many jobs from one base spec, compared in one table (`study goyal`: Goyal's Table 1 in
    /// miniature).
    #[command(subcommand)]
    Study(commands::study::Study),
    /// The team's uploaded data sets (safetensors): upload, list, delete.
    #[command(subcommand)]
    Datasets(commands::datasets::Datasets),
    /// The team's uploaded TorchScript models: upload, list, delete; `check` one against a data set as the
    /// server does on upload.
    #[command(subcommand)]
    Models(commands::models::Models),
    /// A spec's schedule for several worker counts side by side (nothing is submitted).
    Preview(commands::pool::PreviewArgs),
    /// The worker pool.
    #[command(subcommand)]
    Nodes(commands::pool::Nodes),
    /// Teams and their quotas.
    #[command(subcommand)]
    Teams(commands::pool::Teams),
    /// A team's tokens.
    #[command(subcommand)]
    Tokens(commands::pool::Tokens),
    /// On the server host, straight on its database: `reset-token` when the platform admin's is lost.
    #[command(subcommand)]
    Admin(commands::admin::Admin),
    /// Print a shell completion script: `ringtrain completions bash > /etc/bash_completion.d/ringtrain`.
    Completions { shell: clap_complete::Shell },
    /// What this binary and machine can do: libtorch, CUDA devices, cuDNN, NCCL, CPU threads, data sets.
    Doctor(commands::doctor::Args),
    /// Does this node compute and sum right: a known matrix product and a known all-reduce over shared
    /// memory (what node agents run at start and while idle; a failure sets the node aside).
    SelfTest(commands::self_test::Args),
    /// This machine measured: the all-reduce, a training step, the input pipeline (`--json` for one object
    /// per measurement). Platforms under load and faults, databases at scale and PyTorch side by side are
    /// the `ringtrain-bench` binary's.
    #[command(subcommand)]
    Bench(commands::bench::Bench),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match cli.command {
        Command::Schedule(args) => commands::schedule::run(args),
        Command::Up(args) => commands::up::run(args),
        Command::Serve(args) => commands::serve::run(*args),
        Command::Agent(args) => commands::agent::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Login(args) => commands::block_on("login", commands::login::run(args)),
        Command::Jobs(jobs) => commands::jobs::run(jobs),
        Command::Study(study) => commands::study::run(study),
        Command::Datasets(datasets) => commands::datasets::run(datasets),
        Command::Models(models) => commands::models::run(models),
        Command::Preview(args) => commands::block_on("preview", commands::pool::preview(&args)),
        Command::Nodes(nodes) => commands::block_on("nodes", commands::pool::nodes(&nodes)),
        Command::Teams(teams) => commands::block_on("teams", commands::pool::teams(&teams)),
        Command::Tokens(tokens) => commands::block_on("tokens", commands::pool::tokens(&tokens)),
        Command::Admin(admin) => commands::admin::run(admin),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "ringtrain", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Doctor(args) => commands::doctor::run(args),
        Command::SelfTest(args) => commands::self_test::run(args),
        Command::Bench(bench) => commands::bench::run(bench),
    }
}

#[cfg(test)]
mod tests {
    /// clap's own checks of every subcommand (unique argument and group names, valid defaults), which it
    /// otherwise makes only when that subcommand is first run.
    #[test]
    fn every_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
