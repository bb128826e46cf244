//! `ringtrain-bench submit`: how long a user waits from `POST /v1/jobs` to the first iteration the API
//! reports, through a running server and its agents (e.g. `ringtrain up`), next to the reference: the same
//! spec's k rank processes started directly (`ringtrain train --rank r --world k --rendezvous ...`, as an
//! agent starts them) until rank 0's first metrics line. The difference is what the platform adds
//! (queueing, placement, the agents, the metrics relay).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use ringtrain_client::ApiClient;
use ringtrain_protocol::rank::RankCommand;

#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// The server's base URL.
    #[arg(long, env = "RINGTRAIN_SERVER", default_value = "http://127.0.0.1:8080")]
    server: String,
    /// A member or admin token.
    #[arg(long, env = "RINGTRAIN_TOKEN", hide_env_values = true)]
    token: String,
    #[command(flatten)]
    transport: ringtrain_client::Transport,
    /// The job spec submitted each run (it is cancelled once its first iteration is reported).
    #[arg(long, default_value = "examples/fashion-mnist-lenet5.json")]
    spec: PathBuf,
    /// Timed runs of each.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// One submission's milestones, in seconds after the submit.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Milestones {
    scheduled: f64,
    running: f64,
    first_iteration: f64,
}

pub fn run(args: &SubmitArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.spec).with_context(|| format!("cannot read {}", args.spec.display()))?;
    let spec: Value = serde_json::from_str(&text).context("the spec is not JSON")?;
    let workers = spec["workers"].as_u64().unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut platform = Vec::new();
    for _ in 0..args.runs.max(1) {
        platform.push(runtime.block_on(submit_once(args, &spec))?);
    }
    let mut direct = Vec::new();
    for _ in 0..args.runs.max(1) {
        direct.push(first_line_direct(&args.spec, workers)?);
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let platform_median = median(platform.iter().map(|m| m.first_iteration).collect());
    let direct_median = median(direct.clone());
    if args.json {
        let report = json!({"bench": "submit", "server": args.server, "spec": args.spec, "workers": workers,
            "runs": platform, "direct_first_line_s": direct,
            "median_first_iteration_s": platform_median, "median_direct_s": direct_median,
            "median_overhead_s": platform_median - direct_median});
        println!("{report}");
        return Ok(());
    }
    println!("submit -> first iteration reported, through {} ({}, k = {workers})", args.server, args.spec.display());
    println!(
        "{:>4} {:>14} {:>12} {:>20} | {:>32}",
        "run",
        "scheduled ms",
        "running ms",
        "first iteration s",
        format!("{workers} rank processes alone: first line s")
    );
    for (i, (m, d)) in platform.iter().zip(&direct).enumerate() {
        println!(
            "{:>4} {:>14.1} {:>12.1} {:>20.2} | {:>32.2}",
            i + 1,
            m.scheduled * 1e3,
            m.running * 1e3,
            m.first_iteration,
            d
        );
    }
    println!(
        "median: {platform_median:.2} s through the platform, {direct_median:.2} s for the ranks alone: the platform adds \
         {:.2} s",
        platform_median - direct_median
    );
    Ok(())
}

async fn submit_once(args: &SubmitArgs, spec: &Value) -> Result<Milestones> {
    let api = ApiClient::with_transport(&args.server, &args.token, &args.transport)?;
    let submitted = Instant::now();
    let job = api.post::<Value>("/v1/jobs", spec).await?;
    let id = job["id"].as_str().context("no job id in the answer")?.to_string();
    let metrics = format!("/v1/jobs/{id}/metrics?kind=iteration&limit=1");
    let first_iteration = loop {
        let page = api.get::<Value>(&metrics).await?;
        if page["points"].as_array().is_some_and(|p| !p.is_empty()) {
            break submitted.elapsed().as_secs_f64();
        }
        if submitted.elapsed() > Duration::from_secs(600) {
            bail!("job {id}: no iteration reported within 600 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let events = api.get::<Value>(&format!("/v1/jobs/{id}/events")).await?;
    let at = |state: &str| -> Option<DateTime<Utc>> {
        events["events"].as_array()?.iter().find(|e| e["to_state"] == state)?["at"].as_str()?.parse().ok()
    };
    let since_queued = |state: &str| match (at("queued"), at(state)) {
        (Some(q), Some(s)) => (s - q).num_microseconds().unwrap_or(0) as f64 / 1e6,
        _ => f64::NAN,
    };
    let milestones =
        Milestones { scheduled: since_queued("scheduled"), running: since_queued("running"), first_iteration };
    api.post::<Value>(&format!("/v1/jobs/{id}/cancel"), &json!({})).await?;
    // Let the cancelled ranks go, so the next run finds the devices free.
    wait_for_free_devices(&api).await?;
    Ok(milestones)
}

/// Waits until no job of the pool holds a device (the nodes' live assignments are gone).
async fn wait_for_free_devices(api: &ApiClient) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let running = api.get::<Value>("/v1/jobs?state=running&limit=1").await?;
        let scheduled = api.get::<Value>("/v1/jobs?state=scheduled&limit=1").await?;
        let busy = |page: &Value| page["jobs"].as_array().is_some_and(|j| !j.is_empty());
        if !busy(&running) && !busy(&scheduled) {
            // A cancelled placement's ranks stop within a poll round-trip; give them that.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the pool stayed busy for 60 s: run this against an otherwise idle server");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Seconds from starting the k rank processes (`ringtrain train --rank r --world k --rendezvous ...`, as an
/// agent starts them) to rank 0's first metrics line.
fn first_line_direct(spec: &Path, workers: u64) -> Result<f64> {
    let out = tempfile_dir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let exe = super::product();
    let started = Instant::now();
    let mut ranks = Vec::new();
    for rank in 0..workers {
        let command = RankCommand {
            spec: spec.to_path_buf(),
            rank: rank as usize,
            world: workers as usize,
            rendezvous: format!("127.0.0.1:{port}"),
            out: Some(out.join(format!("rank-{rank}"))),
            ..Default::default()
        };
        let child = Command::new(&exe)
            .args(command.args())
            .stdout(if rank == 0 { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start ringtrain train")?;
        ranks.push(child);
    }
    let mut line = String::new();
    let stdout = ranks[0].stdout.take().context("no stdout")?;
    let read = std::io::BufReader::new(stdout).read_line(&mut line);
    let elapsed = started.elapsed().as_secs_f64();
    for mut rank in ranks {
        let _ = rank.kill();
        let _ = rank.wait();
    }
    let _ = std::fs::remove_dir_all(&out);
    if read.unwrap_or(0) == 0 {
        bail!("rank 0 printed nothing");
    }
    Ok(elapsed)
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("ringtrain-bench-submit-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}
