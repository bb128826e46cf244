//! `ringtrain-bench soak`: the whole platform under injected faults, on each database in turn. The server
//! and `--agents` agents run as child processes on this machine; `--teams` teams submit `--jobs` short
//! Fashion-MNIST jobs (three specs in turn, each also run once undisturbed first, as the reference); while
//! they run, faults are injected in a seeded random order (rank and agent `kill -9`, a server `kill -9` and
//! restart, the database taken away; see `faults`). Then every job must have ended `succeeded` exactly
//! once, with every rank's every iteration and epoch reported, its curves and result bit-for-bit the
//! undisturbed run's; and no node may ever have run more ranks than its slots, nor one placement's rank
//! twice. It prints the figures (jobs, faults, restarts, lost iterations, API latency during the soak)
//! and fails when anything above did not hold.
//!
//! Over 450 lines because this is the soak's whole course, in the order it runs (set up, reference runs,
//! faults, the wait, the checks, the report); its parts live beside it: the processes in `cluster`, the
//! faults in `faults`, what is watched while it runs in `watch`, the checks in `verdict`.

pub(super) mod cluster;
mod faults;
mod verdict;
mod watch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtrain_client::ApiClient;
use serde::Serialize;
use serde_json::{json, Value};

use cluster::SoakCluster;
use faults::{Fault, FaultKind, Rng};
use verdict::JobRecord;
use watch::{BookingWatch, LatencyProbe};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DatabaseKind {
    Sqlite,
    Postgres,
}

#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// The databases to soak, one after the other: sqlite (a file in the work folder) and postgres (a
    /// fresh database on --postgres-url's server, dropped afterwards).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres")]
    databases: Vec<DatabaseKind>,
    /// A Postgres server (any database on it): the soak creates its own database there.
    #[arg(long, env = "RINGTRAIN_BENCH_POSTGRES_URL", default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    postgres_url: String,
    /// Jobs submitted, the three specs in turn, the teams in turn.
    #[arg(long, default_value_t = 30)]
    jobs: usize,
    /// Teams, each with an equal share of the slots as its CPU guarantee (at least 2).
    #[arg(long, default_value_t = 3)]
    teams: usize,
    /// `ringtrain agent` processes (nodes).
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// CPU slots per agent.
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Iterations per epoch of each job are train-samples / (workers x 16).
    #[arg(long, default_value_t = 6000)]
    train_samples: u32,
    /// `kill -9` of a random live rank process.
    #[arg(long, default_value_t = 8)]
    rank_kills: usize,
    /// `kill -9` of a random agent, started again 1-4 s later.
    #[arg(long, default_value_t = 2)]
    agent_kills: usize,
    /// `kill -9` of the server, started again on the same address after 2-6 s.
    #[arg(long, default_value_t = 1)]
    server_restarts: usize,
    /// The database taken away: Postgres connections terminated, or SQLite's write lock held 5 s.
    #[arg(long, default_value_t = 2)]
    database_drops: usize,
    /// Mean seconds between two faults (each wait is drawn from 0.5x to 1.5x of it).
    #[arg(long, default_value_t = 3.0)]
    fault_every_s: f64,
    /// Seeds the fault order, the targets and the waits.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the processes' folders and logs go (default: a fresh temporary folder, removed when the soak
    /// passes).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Seconds to wait for every job to end before the soak fails.
    #[arg(long, default_value_t = 1800)]
    timeout_s: u64,
    /// One JSON object per database instead of a table.
    #[arg(long)]
    json: bool,
}

/// The database a soak runs on.
#[derive(Debug)]
pub enum Database {
    Sqlite { path: PathBuf },
    Postgres { admin_url: String, name: String, url: String },
}

impl Database {
    async fn create(kind: DatabaseKind, args: &SoakArgs, dir: &Path) -> Result<Database> {
        use sqlx::Connection;
        match kind {
            DatabaseKind::Sqlite => Ok(Database::Sqlite { path: dir.join("server").join("ringtrain.db") }),
            DatabaseKind::Postgres => {
                let admin_url = args.postgres_url.clone();
                let mut admin = sqlx::PgConnection::connect(&admin_url)
                    .await
                    .with_context(|| "cannot connect to --postgres-url (is Postgres running?)")?;
                let name = format!("ringtrain_soak_{}", std::process::id());
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut admin).await?;
                sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await?;
                let (base, _) = admin_url.rsplit_once('/').context("--postgres-url must end in /DATABASE")?;
                let url = format!("{base}/{name}");
                Ok(Database::Postgres { admin_url, name, url })
            }
        }
    }

    /// What `serve --database-url` gets (None: its SQLite default in the data folder).
    fn server_url(&self) -> Option<String> {
        match self {
            Database::Sqlite { .. } => None,
            Database::Postgres { url, .. } => Some(url.clone()),
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Database::Sqlite { .. } => "sqlite",
            Database::Postgres { .. } => "postgres",
        }
    }

    async fn remove(&self) {
        use sqlx::Connection;
        if let Database::Postgres { admin_url, name, .. } = self {
            if let Ok(mut admin) = sqlx::PgConnection::connect(admin_url).await {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut admin).await;
            }
        }
    }
}

/// The figures of one soak, and everything that did not hold.
#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub database: &'static str,
    pub jobs: usize,
    pub succeeded: usize,
    pub faults_planned: usize,
    /// Injected, by kind.
    pub faults: BTreeMap<&'static str, usize>,
    pub fault_log: Vec<Fault>,
    /// Attempts beyond each job's first (a rank or agent killed), and preemptions.
    pub job_restarts: i64,
    pub preemptions: i64,
    pub lost_iterations: i64,
    pub total_iterations: i64,
    pub api_calls: usize,
    pub api_unanswered: usize,
    pub api_server_errors: usize,
    pub api_p50_ms: f64,
    pub api_p99_ms: f64,
    pub api_max_ms: f64,
    pub most_ranks_at_once: usize,
    pub slots: u32,
    pub attempt_overlaps: usize,
    pub wall_s: f64,
    pub work_dir: PathBuf,
    pub violations: Vec<String>,
}

pub fn run(args: &SoakArgs) -> Result<()> {
    if args.teams == 0 || args.agents == 0 || args.slots < 2 || args.jobs == 0 {
        bail!("--jobs, --teams and --agents must be at least 1, --slots at least 2 (the specs use 2 ranks)");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let root = match &args.work_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("ringtrain-soak-{}", std::process::id())),
    };
    let mut failed = 0;
    for kind in &args.databases {
        let dir = root.join(format!("{kind:?}").to_lowercase());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("server"))?;
        let report = runtime.block_on(soak(args, *kind, &dir))?;
        print(&report, args.json)?;
        if report.violations.is_empty() {
            if args.work_dir.is_none() {
                let _ = std::fs::remove_dir_all(&dir);
            }
        } else {
            failed += report.violations.len();
        }
    }
    if failed > 0 {
        bail!("the soak found {failed} violation(s) (listed above; logs in {})", root.display());
    }
    Ok(())
}

/// Three small Fashion-MNIST specs, each checkpointed every epoch and logging every iteration.
fn specs(train_samples: u32) -> Vec<Value> {
    // (seed 103 made the third collapse to chance from its second epoch, which the collapse guard now stops)
    [(2, vec![64], 101), (1, vec![64], 102), (2, vec![32, 32], 104)]
        .into_iter()
        .map(|(workers, hidden, seed)| {
            json!({
                "name": format!("soak-{seed}"),
                "model": {"name": "mlp", "hidden": hidden},
                "dataset": "fashion-mnist",
                "train_samples": train_samples,
                "test_samples": 500,
                "workers": workers,
                "per_worker_batch": 16,
                "epochs": 3,
                "lr": {"base": 0.1, "reference_batch": 32, "warmup": {"kind": "gradual", "epochs": 1.0}},
                "optimizer": {"momentum": 0.9},
                "seed": seed,
                "checkpoint_every_epochs": 1,
                "log_every_iterations": 1,
                "max_restarts": 20,
                "device": "cpu"
            })
        })
        .collect()
}

/// GET with retries through an outage (up to two minutes); a refusal (4xx) fails at once.
pub async fn get_retrying(api: &ApiClient, path: &str) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match api.get::<Value>(path).await {
            Ok(value) => return Ok(value),
            Err(err) if !err.is_final() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => bail!("{path}: {err}"),
        }
    }
}

async fn soak(args: &SoakArgs, kind: DatabaseKind, dir: &Path) -> Result<SoakReport> {
    let database = Database::create(kind, args, dir).await?;
    let outcome = soak_on(args, &database, dir).await;
    database.remove().await;
    outcome
}

async fn soak_on(args: &SoakArgs, database: &Database, dir: &Path) -> Result<SoakReport> {
    let mut cluster = SoakCluster::start(dir, database.server_url(), args.agents, args.slots).await?;
    let quota = (args.agents as u32 * args.slots / args.teams as u32).max(2);
    let mut teams = Vec::new();
    for t in 0..args.teams {
        let body = json!({"name": format!("soak-team-{t}"), "gpu_quota": 0, "cpu_quota": quota});
        let team: Value = cluster.admin.post("/v1/teams", &body).await?;
        let id = team["id"].as_str().context("no team id")?;
        let token: Value =
            cluster.admin.post(&format!("/v1/teams/{id}/tokens"), &json!({"role": "member", "label": "soak"})).await?;
        teams.push(ApiClient::new(&cluster.url, token["token"].as_str().context("no team token")?)?);
    }

    // The references: each spec once, with nothing disturbing it.
    let specs = specs(args.train_samples);
    let mut reference_ids = Vec::new();
    for spec in &specs {
        let job: Value = teams[0].post("/v1/jobs", spec).await?;
        reference_ids.push(job["id"].as_str().context("no job id")?.to_string());
    }
    let reference_jobs: Vec<(String, ApiClient)> =
        reference_ids.iter().map(|id| (id.clone(), teams[0].clone())).collect();
    wait_all_ended(&reference_jobs, Duration::from_secs(args.timeout_s)).await?;
    let mut references = Vec::new();
    for id in &reference_ids {
        let record = JobRecord::read(&teams[0], id).await?;
        if record.job["state"] != "succeeded" {
            bail!("the undisturbed reference run {id} ended {}: {}", record.job["state"], record.job["error"]);
        }
        references.push(record);
    }

    // The soak.
    let started = Instant::now();
    let bookings = BookingWatch::start(dir.to_path_buf(), args.slots);
    let probe = LatencyProbe::start(teams.clone());
    // Each job with its spec's index and its team's client (a team sees only its own jobs).
    let mut jobs: Vec<(String, usize, ApiClient)> = Vec::new();
    for i in 0..args.jobs {
        let mut spec = specs[i % specs.len()].clone();
        spec["name"] = json!(format!("soak-{i}"));
        let team = &teams[i % teams.len()];
        let job: Value = team.post("/v1/jobs", &spec).await?;
        jobs.push((job["id"].as_str().context("no job id")?.to_string(), i % specs.len(), team.clone()));
    }
    let owners: Vec<(String, ApiClient)> = jobs.iter().map(|(id, _, team)| (id.clone(), team.clone())).collect();
    let mut rng = Rng::new(args.seed);
    let counts = [
        (FaultKind::RankKill, args.rank_kills),
        (FaultKind::AgentKill, args.agent_kills),
        (FaultKind::ServerRestart, args.server_restarts),
        (FaultKind::DatabaseDrop, args.database_drops),
    ];
    let mut plan = faults::plan(&counts, &mut rng);
    let faults_planned = plan.len();
    plan.reverse(); // popped from the end
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    let mut injected: Vec<Fault> = Vec::new();
    let mut next_fault = Instant::now() + next_wait(args.fault_every_s, &mut rng);
    let mut next_check = Instant::now();
    loop {
        if Instant::now() >= next_check {
            if ended(&owners).await? {
                break;
            }
            next_check = Instant::now() + Duration::from_secs(2);
        }
        if Instant::now() > deadline {
            bail!("not every job ended within {} s (logs in {})", args.timeout_s, dir.display());
        }
        if let Some(kind) = plan.last().copied().filter(|_| Instant::now() >= next_fault) {
            if let Some(fault) = faults::inject(kind, &mut cluster, database, &owners, &mut rng, started).await? {
                eprintln!("soak {}: {:>6.1} s  {}: {}", database.label(), fault.at_s, kind.name(), fault.detail);
                injected.push(fault);
                plan.pop();
                next_fault = Instant::now() + next_wait(args.fault_every_s, &mut rng);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let wall_s = started.elapsed().as_secs_f64();
    let latency = probe.finish().await;
    let seen = bookings.finish();

    let mut report = SoakReport {
        database: database.label(),
        jobs: jobs.len(),
        succeeded: 0,
        faults_planned,
        faults: BTreeMap::new(),
        fault_log: injected.clone(),
        job_restarts: 0,
        preemptions: 0,
        lost_iterations: 0,
        total_iterations: 0,
        api_calls: latency.answered.len() + latency.unanswered,
        api_unanswered: latency.unanswered,
        api_server_errors: latency.server_errors,
        api_p50_ms: latency.quantile_ms(0.5),
        api_p99_ms: latency.quantile_ms(0.99),
        api_max_ms: latency.quantile_ms(1.0),
        most_ranks_at_once: seen.most_ranks,
        slots: args.slots * args.agents as u32,
        attempt_overlaps: seen.attempt_overlaps.len(),
        wall_s,
        work_dir: dir.to_path_buf(),
        violations: seen.violations.into_iter().collect(),
    };
    for fault in &injected {
        *report.faults.entry(fault.kind.name()).or_default() += 1;
    }
    // Each job's view and events, kept in the work folder to look into what went wrong.
    std::fs::create_dir_all(dir.join("jobs"))?;
    for (id, spec, team) in &jobs {
        let record = JobRecord::read(team, id).await?;
        let kept = json!({"job": record.job, "events": record.events, "checkpoints": record.checkpoints});
        std::fs::write(dir.join("jobs").join(format!("{id}.json")), serde_json::to_vec_pretty(&kept)?)?;
        report.violations.extend(verdict::problems(id, &record, &references[*spec]));
        report.violations.extend(verdict::unexplained_failures(id, &record, &injected));
        if record.job["state"] == "succeeded" {
            report.succeeded += 1;
        }
        let (restarts, preemptions) = verdict::restarts(&record);
        report.job_restarts += restarts;
        report.preemptions += preemptions;
        report.lost_iterations += verdict::lost_iterations(id, &record, &injected);
        report.total_iterations += record.job["effective"]["total_iterations"].as_i64().unwrap_or(0);
    }
    Ok(report)
}

fn next_wait(mean_s: f64, rng: &mut Rng) -> Duration {
    Duration::from_secs_f64(mean_s.max(0.0) * (0.5 + rng.unit()))
}

fn is_final_state(state: &Value) -> bool {
    state.as_str().and_then(|s| s.parse::<ringtrain_core::JobState>().ok()).is_some_and(|s| s.is_terminal())
}

/// Whether every job (each read with its owner's client) has ended; false while the server does not answer,
/// an error when it refuses.
async fn ended(jobs: &[(String, ApiClient)]) -> Result<bool> {
    for (id, owner) in jobs {
        match owner.get::<Value>(&format!("/v1/jobs/{id}")).await {
            Ok(job) if is_final_state(&job["state"]) => {}
            Ok(_) => return Ok(false),
            Err(err) if err.is_final() => bail!("reading job {id}: {err}"),
            Err(_) => return Ok(false),
        }
    }
    Ok(true)
}

async fn wait_all_ended(jobs: &[(String, ApiClient)], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !ended(jobs).await? {
        if Instant::now() > deadline {
            bail!("the reference runs did not end within {} s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

fn print(report: &SoakReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    let faults: Vec<String> = report.faults.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
    println!(
        "fault-injection soak on {} ({:.0} s, work folder {})",
        report.database,
        report.wall_s,
        report.work_dir.display()
    );
    println!("  jobs               {} submitted, {} succeeded", report.jobs, report.succeeded);
    println!(
        "  faults injected    {} of {} planned: {}",
        report.fault_log.len(),
        report.faults_planned,
        faults.join(", ")
    );
    println!(
        "  job restarts       {} attempts after a failure, {} preemptions",
        report.job_restarts, report.preemptions
    );
    println!(
        "  lost work          {} of {} iterations trained again ({:.1}%; a lower bound)",
        report.lost_iterations,
        report.total_iterations,
        100.0 * report.lost_iterations as f64 / report.total_iterations.max(1) as f64
    );
    println!(
        "  API during soak    p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} calls; {} unanswered (server down), {} 5xx",
        report.api_p50_ms,
        report.api_p99_ms,
        report.api_max_ms,
        report.api_calls,
        report.api_unanswered,
        report.api_server_errors
    );
    println!(
        "  ranks              at most {} alive at once on {} slots; {} job(s) briefly had two attempts alive",
        report.most_ranks_at_once, report.slots, report.attempt_overlaps
    );
    if report.violations.is_empty() {
        println!("  verdict            every job succeeded once, every metric once, results bit-for-bit the undisturbed runs', no double booking");
    } else {
        println!("  VIOLATIONS         {}", report.violations.len());
        for violation in &report.violations {
            println!("    - {violation}");
        }
    }
    Ok(())
}
