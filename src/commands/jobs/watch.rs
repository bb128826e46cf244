//! `ringtrain jobs watch ID`: a job's progress in the terminal (a progress bar over its iterations, the
//! loss, lr, throughput and last test error), until it ends. Exit status 0 when it succeeded.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use uuid::Uuid;

use crate::commands::connection::Connection;

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// The job's id.
    pub id: Uuid,
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
    let id = args.id;
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
        (done / per_epoch).min(epochs)
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
    if let Some(why) = job["pending_reason"]["message"].as_str() {
        line += &format!(": {why}");
    }
    if let Some(basis) = job["estimated_start"]["basis"].as_str() {
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
