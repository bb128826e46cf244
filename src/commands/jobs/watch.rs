//! `ringtrain jobs watch ID`: a job's progress in the terminal (a progress bar over its iterations, the
//! loss, lr, throughput and last test error), until it ends. Exit status 0 when it succeeded.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Result;
use ringtrain_core::JobState;
use ringtrain_views::jobs::records::MetricPoint;
use ringtrain_views::jobs::JobView;

use crate::commands::connection::Connection;
use crate::commands::ids::{resolve, IdArg, Kind};

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// The job's id, or the start of it (`76acc08f`).
    pub id: IdArg,
    #[command(flatten)]
    pub connection: Connection,
    /// Seconds between updates.
    #[arg(long, default_value_t = 1.0)]
    pub every_s: f64,
}

/// What the watcher has seen so far.
#[derive(Default)]
struct Progress {
    next_iteration: i64,
    last: Option<MetricPoint>,
    test_error: Option<f64>,
}

pub async fn watch(args: &WatchArgs) -> Result<bool> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?.to_string();
    let tty = std::io::stdout().is_terminal();
    let mut progress = Progress::default();
    let mut last_line = String::new();
    loop {
        let job = api.job(&id).await?;
        let query = format!("kind=iteration&rank=0&from_iteration={}&limit=10000", progress.next_iteration);
        if let Some(last) = api.job_metrics(&id, &query).await?.points.pop() {
            progress.next_iteration = last.iteration + 1;
            progress.last = Some(last);
        }
        let epochs = api.job_metrics(&id, "kind=epoch&rank=0&limit=10000").await?;
        if let Some(last) = epochs.points.last() {
            progress.test_error = last.number("test_error");
        }
        let line = render(&job, &progress);
        if tty {
            print!("\r\x1b[2K{line}");
        } else if line != last_line {
            println!("{line}");
        }
        let _ = std::io::stdout().flush();
        last_line = line;
        if matches!(job.state, JobState::Succeeded | JobState::Failed | JobState::Cancelled) {
            if tty {
                println!();
            }
            print_outcome(&job);
            return Ok(job.state == JobState::Succeeded);
        }
        tokio::time::sleep(Duration::from_secs_f64(args.every_s.max(0.1))).await;
    }
}

const BAR: usize = 30;

fn render(job: &JobView, progress: &Progress) -> String {
    let effective = job.effective.as_ref();
    let total = effective.map_or(0, |e| e.total_iterations as i64).max(1);
    let per_epoch = effective.map_or(1, |e| e.iterations_per_epoch as i64).max(1);
    let epochs = effective.map_or(0, |e| i64::from(e.epochs));
    let done = progress.next_iteration.min(total);
    let filled = (done as usize * BAR) / total as usize;
    let mut line = format!(
        "[{}{}] {:>3}% it {done}/{total} epoch {}/{epochs}",
        "#".repeat(filled),
        "-".repeat(BAR - filled),
        done * 100 / total,
        // the epoch under way, counted from 1 as the web page counts it
        (done / per_epoch + 1).min(epochs.max(1))
    );
    if let Some(last) = &progress.last {
        line += &format!(
            " loss {:.4} lr {:.4} {:.0} samples/s",
            last.number("loss").unwrap_or(f64::NAN),
            last.number("lr").unwrap_or(f64::NAN),
            last.number("samples_per_s").unwrap_or(0.0)
        );
    }
    if let Some(error) = progress.test_error {
        line += &format!(" test error {:.2}%", error * 100.0);
    }
    line += &format!(" | {}", job.state.as_str());
    if job.attempt > 1 {
        line += &format!(" (attempt {})", job.attempt);
    }
    if job.preemptions > 0 {
        line += &format!(" ({} preemption(s))", job.preemptions);
    }
    // while queued: where it stands and why, as the scheduler's policy says
    if let Some(position) = job.queue_position {
        line += &format!(" #{position} in queue");
    }
    let why = job.pending_reason.as_ref().map(|reason| reason.message.as_str());
    if let Some(why) = why {
        line += &format!(": {why}");
    }
    // the estimate's basis often repeats the reason in other words: say it once
    let words = |text: &str| text.chars().filter(|c| c.is_alphanumeric()).collect::<String>();
    let basis = job.estimated_start.as_ref().map(|estimate| estimate.basis.as_str());
    if let Some(basis) = basis.filter(|b| why.is_none_or(|w| words(w) != words(b))) {
        line += &format!(" (start: {basis})");
    }
    line
}

fn print_outcome(job: &JobView) {
    match (&job.state, &job.result) {
        (JobState::Succeeded, Some(result)) => {
            println!(
                "succeeded: final test error {:.2}%, {:.1} s over {} placement(s), {:.1} device-seconds, {:.0} samples/s",
                result.final_test_error.unwrap_or(f64::NAN) * 100.0,
                result.wall_seconds.unwrap_or(f64::NAN),
                result.history.as_ref().map_or(1, Vec::len),
                result.device_seconds.unwrap_or(f64::NAN),
                result.samples_per_s.unwrap_or(f64::NAN)
            );
        }
        (state, _) => println!("{}: {}", state.as_str(), job.error.as_deref().unwrap_or("")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{render, Progress};
    use crate::commands::jobs::manage::tests::job_view;

    #[test]
    fn epochs_count_from_one_and_a_reason_is_said_once() {
        // 300 samples in global batches of 30: 10 iterations an epoch, 30 in three epochs
        let spec = json!({"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "train_samples": 300,
            "workers": 2, "per_worker_batch": 15, "epochs": 3,
            "lr": {"base": 0.1, "reference_batch": 30, "warmup": {"kind": "none"}}});
        let spec = ringtrain_core::read_spec(&spec).unwrap().spec;
        let effective = ringtrain_core::Effective::new(&spec, 300).unwrap();
        let job = job_view(json!({"state": "running", "effective": effective}));
        let first = render(&job, &Progress { next_iteration: 4, ..Progress::default() });
        assert!(first.contains("epoch 1/3"), "{first}");
        let end = render(&job, &Progress { next_iteration: 30, ..Progress::default() });
        assert!(end.contains("epoch 3/3"), "{end}");
        let queued = job_view(json!({"state": "queued", "queue_position": 1,
            "pending_reason": {"code": "starting_next_pass",
                "message": "devices are free for it; the next scheduler pass starts it"},
            "estimated_start": {"kind": "now", "seconds": 0.0, "at": null, "jobs": [],
                "basis": "devices are free for it: the next scheduler pass starts it"}}));
        let line = render(&queued, &Progress::default());
        assert_eq!(line.matches("the next scheduler pass").count(), 1, "{line}");
    }
}
