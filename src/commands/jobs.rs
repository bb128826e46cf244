//! `ringtrain jobs watch ID`: a job's progress in the terminal (a progress bar over its iterations, the
//! loss, lr, throughput and last test error), until it ends. Exit status 0 when it succeeded.
//! `ringtrain jobs logs ID`: what its ranks printed, optionally following it until it ends.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use uuid::Uuid;

use ringtrain_client::ApiClient;

#[derive(Debug, clap::Subcommand)]
pub enum Jobs {
    /// Follow a job until it ends: progress, loss, lr, throughput, test error.
    Watch(WatchArgs),
    /// What a job's ranks printed (stderr, and stdout lines that are not metric reports).
    Logs(LogsArgs),
}

/// Where the server is and who asks.
#[derive(Debug, clap::Args)]
pub struct Connection {
    /// The server's base URL.
    #[arg(long, env = "RINGTRAIN_SERVER", default_value = "http://127.0.0.1:8080")]
    server: String,
    /// A token of the job's team.
    #[arg(long, env = "RINGTRAIN_TOKEN", hide_env_values = true)]
    token: String,
    #[command(flatten)]
    transport: ringtrain_client::Transport,
}

impl Connection {
    fn client(&self) -> Result<ApiClient> {
        Ok(ApiClient::with_transport(&self.server, &self.token, &self.transport)?)
    }
}

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// The job's id.
    id: Uuid,
    #[command(flatten)]
    connection: Connection,
    /// Seconds between updates.
    #[arg(long, default_value_t = 1.0)]
    every_s: f64,
}

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The job's id.
    id: Uuid,
    #[command(flatten)]
    connection: Connection,
    /// Only this rank's lines.
    #[arg(long)]
    rank: Option<u32>,
    /// Only this placement's lines (the `placement` of the job's events).
    #[arg(long)]
    placement: Option<u32>,
    /// Only lines containing this text (case-sensitive).
    #[arg(long)]
    grep: Option<String>,
    /// Keep printing new lines until the job has ended.
    #[arg(long, short)]
    follow: bool,
}

pub fn run(jobs: Jobs) -> ExitCode {
    match jobs {
        Jobs::Watch(args) => {
            let mut succeeded = false;
            let code = super::block_on("jobs watch", async {
                succeeded = watch(&args).await?;
                Ok(())
            });
            if code == ExitCode::SUCCESS && !succeeded {
                ExitCode::FAILURE
            } else {
                code
            }
        }
        Jobs::Logs(args) => super::block_on("jobs logs", logs(&args)),
    }
}

/// Prints the job's lines page by page (`[rank R, placement P] line`), and with `--follow` goes on until
/// the job has ended and no line is left.
async fn logs(args: &LogsArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = args.id;
    let mut filters = String::new();
    if let Some(rank) = args.rank {
        filters += &format!("&rank={rank}");
    }
    if let Some(placement) = args.placement {
        filters += &format!("&attempt={placement}");
    }
    if let Some(text) = &args.grep {
        filters += &format!("&q={}", form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>());
    }
    let mut since = 0;
    loop {
        // the job's state before its lines: a line stored after this read is still fetched below
        let ended = args.follow
            && matches!(
                api.get::<Value>(&format!("/v1/jobs/{id}")).await?["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            );
        let page = api.get::<Value>(&format!("/v1/jobs/{id}/logs?since={since}&limit=5000{filters}")).await?;
        let lines = page["lines"].as_array().cloned().unwrap_or_default();
        let mut out = std::io::stdout().lock();
        for line in &lines {
            let _ = writeln!(
                out,
                "[rank {}, placement {}] {}",
                line["rank"],
                line["attempt"],
                line["line"].as_str().unwrap_or("")
            );
        }
        since = page["next_since"].as_i64().unwrap_or(since);
        if lines.len() == 5000 {
            continue;
        }
        if !args.follow || ended {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What the watcher has seen so far.
#[derive(Default)]
struct Progress {
    next_iteration: i64,
    last: Option<Value>,
    test_error: Option<f64>,
}

async fn watch(args: &WatchArgs) -> Result<bool> {
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
