//! `ringtrain jobs watch ID`: a job's progress in the terminal (a progress bar over its iterations, the
//! loss, lr, throughput and last test error), until it ends. Exit status 0 when it succeeded.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;

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
    last: Option<Value>,
    test_error: Option<f64>,
}

pub async fn watch(args: &WatchArgs) -> Result<bool> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let tty = std::io::stdout().is_terminal();
    let mut progress = Progress::default();
    let mut last_line = String::new();
    loop {
        let job = api.get::<Value>(&format!("/v1/jobs/{id}")).await?;
        let iterations = api
            .get::<Value>(&format!(
                "/v1/jobs/{id}/metrics?kind=iteration&rank=0&from_iteration={}&limit=10000",
                progress.next_iteration
            ))
            .await?;
        if let Some(last) = iterations["points"].as_array().and_then(|p| p.last()) {
            progress.next_iteration = last["iteration"].as_i64().unwrap_or(0) + 1;
            progress.last = Some(last.clone());
        }
        let epochs = api.get::<Value>(&format!("/v1/jobs/{id}/metrics?kind=epoch&rank=0&limit=10000")).await?;
        if let Some(last) = epochs["points"].as_array().and_then(|p| p.last()) {
            progress.test_error = last["fields"]["test_error"].as_f64();
        }
        let state = job["state"].as_str().unwrap_or("?").to_string();
        let line = render(&job, &progress);
        if tty {
            print!("\r\x1b[2K{line}");
        } else if line != last_line {
            println!("{line}");
        }
        let _ = std::io::stdout().flush();
        last_line = line;
        if matches!(state.as_str(), "succeeded" | "failed" | "cancelled") {
            if tty {
                println!();
            }
            print_outcome(&job);
            return Ok(state == "succeeded");
        }
        tokio::time::sleep(Duration::from_secs_f64(args.every_s.max(0.1))).await;
    }
}

const BAR: usize = 30;

fn render(job: &Value, progress: &Progress) -> String {
    let state = job["state"].as_str().unwrap_or("?");
    let total = job["effective"]["total_iterations"].as_i64().unwrap_or(0).max(1);
    let per_epoch = job["effective"]["iterations_per_epoch"].as_i64().unwrap_or(1).max(1);
    let epochs = job["effective"]["epochs"].as_i64().unwrap_or(0);
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
        let fields = &last["fields"];
        line += &format!(
            " loss {:.4} lr {:.4} {:.0} samples/s",
            fields["loss"].as_f64().unwrap_or(f64::NAN),
            fields["lr"].as_f64().unwrap_or(f64::NAN),
            fields["samples_per_s"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(error) = progress.test_error {
        line += &format!(" test error {:.2}%", error * 100.0);
    }
    line += &format!(" | {state}");
    let attempt = job["attempt"].as_i64().unwrap_or(0);
    if attempt > 1 {
        line += &format!(" (attempt {attempt})");
    }
    if let Some(preemptions) = job["preemptions"].as_i64().filter(|&p| p > 0) {
        line += &format!(" ({preemptions} preemption(s))");
    }
    // while queued: where it stands and why, as the scheduler's policy says
    if let Some(position) = job["queue_position"].as_i64() {
        line += &format!(" #{position} in queue");
    }
    let why = job["pending_reason"]["message"].as_str();
    if let Some(why) = why {
        line += &format!(": {why}");
    }
    // the estimate's basis often repeats the reason in other words: say it once
    let words = |text: &str| text.chars().filter(|c| c.is_alphanumeric()).collect::<String>();
    if let Some(basis) = job["estimated_start"]["basis"].as_str().filter(|b| why.is_none_or(|w| words(w) != words(b))) {
        line += &format!(" (start: {basis})");
    }
    line
}

fn print_outcome(job: &Value) {
    let state = job["state"].as_str().unwrap_or("?");
    match state {
        "succeeded" => {
            let result = &job["result"];
            println!(
                "succeeded: final test error {:.2}%, {:.1} s over {} placement(s), {:.1} device-seconds, {:.0} samples/s",
                result["final_test_error"].as_f64().unwrap_or(f64::NAN) * 100.0,
                result["wall_seconds"].as_f64().unwrap_or(f64::NAN),
                result["history"].as_array().map_or(1, Vec::len),
                result["device_seconds"].as_f64().unwrap_or(f64::NAN),
                result["samples_per_s"].as_f64().unwrap_or(f64::NAN)
            );
        }
        _ => println!("{state}: {}", job["error"].as_str().unwrap_or("")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{render, Progress};

    #[test]
    fn epochs_count_from_one_and_a_reason_is_said_once() {
        let job = json!({"state": "running", "effective": {"total_iterations": 30, "iterations_per_epoch": 10,
            "epochs": 3}});
        let first = render(&job, &Progress { next_iteration: 4, ..Progress::default() });
        assert!(first.contains("epoch 1/3"), "{first}");
        let end = render(&job, &Progress { next_iteration: 30, ..Progress::default() });
        assert!(end.contains("epoch 3/3"), "{end}");
        let queued = json!({"state": "queued", "effective": {}, "queue_position": 1,
            "pending_reason": {"message": "devices are free for it; the next scheduler pass starts it"},
            "estimated_start": {"basis": "devices are free for it: the next scheduler pass starts it"}});
        let line = render(&queued, &Progress::default());
        assert_eq!(line.matches("the next scheduler pass").count(), 1, "{line}");
    }
}
