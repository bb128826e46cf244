//! `ringtrain-bench elastic`: what elasticity buys a borrower. On a server and one agent of S CPU
//! slots started here (default: one per core), two teams are guaranteed S/2 each. A borrower team's S-worker
//! job takes the whole pool (S/2 slots beyond its guarantee); once it has trained a while, the owner of the
//! other S/2 submits an S/2-worker job and reclaims them. Run twice, side by side: the borrower elastic
//! (`devices: {"min": 1}`: shrunk to S/2, grown back to S) and fixed (`devices: S`: today's
//! stop-and-requeue, waiting for its whole gang). The figures: the borrower's wall time and iterations
//! trained while reclaimed, the seconds each stop cost it (from its last progress before the stop to its
//! first after it), and how long the owner waited for its devices.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtrain_client::ApiClient;
use serde_json::{json, Value};

use super::soak::cluster::SoakCluster;

#[derive(Debug, clap::Args)]
pub struct ElasticArgs {
    /// The borrower's model: lenet5, resnet8 or resnet20 (Fashion-MNIST).
    #[arg(long, default_value = "lenet5")]
    model: String,
    /// Training samples of the borrower's epochs (3 epochs); the owner's job trains one epoch of half as many.
    #[arg(long, default_value_t = 60_000)]
    train_samples: u32,
    /// CPU slots of the agent (an even number; default: this machine's cores, at least 2). More slots than
    /// cores share the cores: what one job gains the other then loses.
    #[arg(long)]
    slots: Option<u32>,
    /// Seconds the borrower trains before the owner reclaims.
    #[arg(long, default_value_t = 5)]
    reclaim_after_s: u64,
    /// The elastic job's grow interval (the server's --grow-interval-seconds).
    #[arg(long, default_value_t = 5)]
    grow_interval_s: u64,
    /// Where the server and agent keep their files (default: a temporary folder, removed after).
    #[arg(long)]
    work_dir: Option<std::path::PathBuf>,
    /// One JSON object per scenario instead of a table.
    #[arg(long)]
    json: bool,
}

/// One scenario's figures.
#[derive(Debug, Clone, serde::Serialize)]
struct Outcome {
    scenario: &'static str,
    borrower_wall_s: f64,
    /// Iterations the borrower trained between the owner's submission and the owner's job ending.
    iterations_while_reclaimed: i64,
    /// For each stop: seconds from the borrower's last progress before it to its first after it.
    stop_costs_s: Vec<f64>,
    /// The borrower's device counts, placement by placement.
    devices: Vec<i64>,
    owner_wait_s: f64,
    borrower_device_seconds: f64,
}

pub fn run(args: &ElasticArgs) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
    let slots = args.slots.unwrap_or(cores.max(2) / 2 * 2);
    anyhow::ensure!(slots >= 2 && slots % 2 == 0, "--slots must be an even number of at least 2, not {slots}");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let root = match &args.work_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("ringtrain-bench-elastic-{}", std::process::id())),
    };
    let mut outcomes = Vec::new();
    for (scenario, devices) in [("elastic", json!({"min": 1})), ("fixed", json!(slots))] {
        let dir = root.join(scenario);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("server"))?;
        outcomes.push(runtime.block_on(scenario_run(args, slots, scenario, devices, &dir))?);
    }
    if args.work_dir.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    if args.json {
        for outcome in &outcomes {
            println!("{}", serde_json::to_string(outcome)?);
        }
        return Ok(());
    }
    println!(
        "a {slots}-worker {} borrower reclaimed after {} s by a {}-device job, on {slots} CPU slots of {cores} cores \
         (fixed = today's stop-and-requeue)",
        args.model,
        args.reclaim_after_s,
        slots / 2
    );
    println!(
        "{:<9} {:>14} {:>18} {:>20} {:>14} {:>12} {:>16}",
        "borrower", "wall s", "iterations while", "stop cost s", "devices", "owner waited", "device-seconds"
    );
    println!("{:<9} {:>14} {:>18} {:>20} {:>14} {:>12} {:>16}", "", "", "reclaimed", "(each stop)", "", "s", "");
    for o in &outcomes {
        let costs: Vec<String> = o.stop_costs_s.iter().map(|c| format!("{c:.1}")).collect();
        let devices: Vec<String> = o.devices.iter().map(i64::to_string).collect();
        println!(
            "{:<9} {:>14.1} {:>18} {:>20} {:>14} {:>12.1} {:>16.0}",
            o.scenario,
            o.borrower_wall_s,
            o.iterations_while_reclaimed,
            costs.join(", "),
            devices.join("→"),
            o.owner_wait_s,
            o.borrower_device_seconds
        );
    }
    Ok(())
}

async fn scenario_run(
    args: &ElasticArgs,
    slots: u32,
    scenario: &'static str,
    devices: Value,
    dir: &std::path::Path,
) -> Result<Outcome> {
    let env = vec![
        ("RINGTRAIN_MIN_RUN_BEFORE_PREEMPTION_SECONDS".to_string(), "0".to_string()),
        ("RINGTRAIN_GROW_INTERVAL_SECONDS".to_string(), args.grow_interval_s.to_string()),
    ];
    let cluster = SoakCluster::start_with(dir, None, 1, slots, env).await?;
    let owner = team(&cluster, "owner", slots / 2).await?;
    let borrower = team(&cluster, "borrower", slots / 2).await?;
    let mut spec = job_spec(&args.model, args.train_samples, slots, 3);
    spec["name"] = json!(format!("borrower-{scenario}"));
    spec["devices"] = devices;
    let started = Instant::now();
    let borrower_id = submit(&borrower, &spec).await?;

    // it trains a while before the reclaim; then the owner wants its 2 slots
    let mut timeline: Vec<(f64, String, i64)> = Vec::new();
    let mut claimed_at: Option<f64> = None;
    let mut owner_id: Option<String> = None;
    let (mut owner_running_at, mut owner_ended_at) = (None, None);
    let deadline = started + Duration::from_secs(3600);
    loop {
        let now = started.elapsed().as_secs_f64();
        let job: Value = borrower.get(&format!("/v1/jobs/{borrower_id}")).await?;
        let state = job["state"].as_str().unwrap_or("?").to_string();
        let done = job["progress"]["iterations_done"].as_i64().or(timeline.last().map(|t| t.2)).unwrap_or(0);
        timeline.push((now, state.clone(), done));
        if owner_id.is_none() && now >= args.reclaim_after_s as f64 && state == "running" {
            let mut claim = job_spec(&args.model, args.train_samples / 2, slots / 2, 1);
            claim["name"] = json!("owner-reclaims");
            owner_id = Some(submit(&owner, &claim).await?);
            claimed_at = Some(now);
        }
        if let Some(id) = &owner_id {
            let owned: Value = owner.get(&format!("/v1/jobs/{id}")).await?;
            let progressed = owned["progress"]["iterations_done"].as_i64().unwrap_or(0) > 0;
            if owner_running_at.is_none() && (progressed || owned["state"] == "succeeded") {
                owner_running_at = Some(now);
            }
            if owner_ended_at.is_none()
                && ["succeeded", "failed", "cancelled"].contains(&owned["state"].as_str().unwrap_or(""))
            {
                owner_ended_at = Some(now);
            }
        }
        match state.as_str() {
            "succeeded" => break,
            "failed" | "cancelled" => bail!("the borrower ended {state}: {}", job["error"]),
            _ => {}
        }
        if Instant::now() > deadline {
            bail!("the borrower did not finish within an hour");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let job: Value = borrower.get(&format!("/v1/jobs/{borrower_id}")).await?;
    let placements = job["placements"].as_array().cloned().unwrap_or_default();
    let (claimed, running, ended) = (
        claimed_at.context("the owner never submitted: the borrower finished first (train longer)")?,
        owner_running_at.unwrap_or(wall),
        owner_ended_at.unwrap_or(wall),
    );
    let at = |t: f64| timeline.iter().take_while(|p| p.0 <= t).last().map_or(0, |p| p.2);
    Ok(Outcome {
        scenario,
        borrower_wall_s: wall,
        iterations_while_reclaimed: at(ended) - at(claimed),
        stop_costs_s: stop_costs(&timeline),
        devices: placements.iter().map(|p| p["devices"].as_i64().unwrap_or(0)).collect(),
        owner_wait_s: running - claimed,
        borrower_device_seconds: job["result"]["device_seconds"].as_f64().unwrap_or(f64::NAN),
    })
}

/// For every time the borrower left `running`: from the last progress it made before to the first after.
fn stop_costs(timeline: &[(f64, String, i64)]) -> Vec<f64> {
    let mut costs = Vec::new();
    let mut i = 1;
    while i < timeline.len() {
        if timeline[i - 1].1 == "running" && timeline[i].1 != "running" {
            let before = timeline[i - 1].2;
            let last_progress =
                timeline[..i].iter().rev().take_while(|p| p.2 == before).last().map_or(timeline[i - 1].0, |p| p.0);
            match timeline[i..].iter().find(|p| p.2 > before) {
                Some(after) => costs.push(after.0 - last_progress),
                None => break,
            }
        }
        i += 1;
    }
    costs
}

fn job_spec(model: &str, train_samples: u32, workers: u32, epochs: u32) -> Value {
    json!({
        "model": {"name": model},
        "dataset": "fashion-mnist",
        "train_samples": train_samples,
        "test_samples": 1000,
        "workers": workers,
        "per_worker_batch": 32,
        "epochs": epochs,
        "lr": {"base": 0.05, "reference_batch": 64, "warmup": {"kind": "gradual", "epochs": 0.5}},
        "checkpoint_every_epochs": 1,
        "log_every_iterations": 5,
        "seed": 3
    })
}

async fn team(cluster: &SoakCluster, name: &str, cpus: u32) -> Result<ApiClient> {
    let team: Value =
        cluster.admin.post("/v1/teams", &json!({"name": name, "gpu_quota": 0, "cpu_quota": cpus})).await?;
    let id = team["id"].as_str().context("no team id")?;
    let token: Value =
        cluster.admin.post(&format!("/v1/teams/{id}/tokens"), &json!({"role": "member", "label": name})).await?;
    Ok(ApiClient::new(&cluster.url, token["token"].as_str().context("no token")?)?)
}

async fn submit(api: &ApiClient, spec: &Value) -> Result<String> {
    let job: Value = api.post("/v1/jobs", spec).await?;
    Ok(job["id"].as_str().context("no job id")?.to_string())
}
