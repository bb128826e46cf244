//! `ringtrain jobs ...`: the team's jobs from the terminal. Human output by default, `--json` for scripts;
//! the exit status is 0 only on success, and a refusal prints the API's reason with its field paths.

mod again;
mod annotate;
mod data;
mod logs;
pub mod manage;
mod watch;
mod weights;

pub use manage::table;

use std::process::ExitCode;

use super::block_on;

#[derive(Debug, clap::Subcommand)]
pub enum Jobs {
    /// Submit a spec file (`--dry-run`: what the scheduler would do with it; `--watch`: follow it).
    Submit(manage::SubmitArgs),
    /// The team's jobs, newest first; queued ones with their place and reason.
    List(manage::ListArgs),
    /// One job: state, progress of its placements, why it waits, its result.
    Show(manage::ShowArgs),
    /// Cancel a job that has not ended.
    Cancel(manage::ShowArgs),
    /// Queue a failed or cancelled job again: it resumes from its newest checkpoint.
    Resume(manage::ShowArgs),
    /// Submit a new job starting from the weights of a checkpoint of this one (fine-tune, or go on with a
    /// changed schedule: `--set epochs=5 --set lr.base=0.01`).
    Fork(again::ForkArgs),
    /// Add tags to a job (`--remove`: take them off); `jobs list --tag` finds it by them.
    Tag(annotate::TagArgs),
    /// Set a job's note; `jobs list --search` finds it by its words.
    Note(annotate::NoteArgs),
    /// Follow a job until it ends: progress, loss, lr, throughput, test error.
    Watch(watch::WatchArgs),
    /// What a job's ranks printed (stderr, and stdout lines that are not metric reports).
    Logs(logs::LogsArgs),
    /// What its ranks reported: one JSON object per line, or `--csv`.
    Metrics(data::MetricsArgs),
    /// The learning-rate schedule it trains with, per epoch.
    Schedule(data::ScheduleArgs),
    /// Download its trained weights: TorchScript (`-o model.pt`, an uploaded model) or a safetensors state
    /// dict (`-o model.safetensors`), from the final checkpoint or `--checkpoint ID`.
    Weights(weights::WeightsArgs),
}

pub fn run(jobs: Jobs) -> ExitCode {
    match jobs {
        Jobs::Submit(args) => block_on_job("jobs submit", manage::submit(&args)),
        Jobs::List(args) => block_on("jobs list", manage::list(&args)),
        Jobs::Show(args) => block_on("jobs show", manage::show(&args)),
        Jobs::Cancel(args) => block_on("jobs cancel", manage::cancel(&args)),
        Jobs::Resume(args) => block_on("jobs resume", again::resume(&args)),
        Jobs::Fork(args) => block_on("jobs fork", again::fork(&args)),
        Jobs::Tag(args) => block_on("jobs tag", annotate::tag(&args)),
        Jobs::Note(args) => block_on("jobs note", annotate::note(&args)),
        Jobs::Watch(args) => block_on_job("jobs watch", watch::watch(&args)),
        Jobs::Logs(args) => block_on("jobs logs", logs::logs(&args)),
        Jobs::Metrics(args) => block_on("jobs metrics", data::metrics(&args)),
        Jobs::Schedule(args) => block_on("jobs schedule", data::schedule(&args)),
        Jobs::Weights(args) => block_on("jobs weights", weights::weights(&args)),
    }
}

/// Runs a command that ends by reporting whether the job succeeded: exit status 0 only when it ran and the
/// job succeeded.
fn block_on_job(who: &str, command: impl std::future::Future<Output = anyhow::Result<bool>>) -> ExitCode {
    let mut succeeded = false;
    let code = block_on(who, async {
        succeeded = command.await?;
        Ok(())
    });
    if code == ExitCode::SUCCESS && !succeeded {
        ExitCode::FAILURE
    } else {
        code
    }
}
