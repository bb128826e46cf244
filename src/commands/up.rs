//! `ringtrain up`: the quickstart. The server on 127.0.0.1:8080 with the embedded SQLite database in the data
//! directory, plus one agent offering this machine's devices (its GPUs, or one CPU slot per core), in one
//! process. It prints the admin token and a ready-to-paste curl line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use ringtrain_store::{generate_token, hash_token, NewToken, Role};

use super::serve::{self, Server};
use ringtrain_agent::Agent;
use ringtrain_protocol::timing;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "RINGTRAIN_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where the database, uploads, checkpoints and the ranks' files are kept.
    #[arg(long, env = "RINGTRAIN_DATA_DIR", default_value = "ringtrain-data")]
    data_dir: PathBuf,
    /// Use this admin token (default: the one generated on the first start, kept in DATA_DIR/admin-token).
    #[arg(long, env = "RINGTRAIN_BOOTSTRAP_TOKEN", hide_env_values = true)]
    bootstrap_token: Option<String>,
    /// GPUs to offer: all, none, or indices such as 0,1.
    #[arg(long, default_value = "all")]
    gpus: String,
    /// CPU slots to offer (default: the number of cores when no GPU is offered).
    #[arg(long)]
    cpus: Option<u32>,
    /// libtorch threads per rank process.
    #[arg(long)]
    threads: Option<i32>,
    /// A folder (or `s3://BUCKET/PREFIX`) under which `idx:` and `shards:` data sets may lie (repeat for
    /// several; none: they are refused).
    #[arg(long = "idx-root", env = "RINGTRAIN_IDX_ROOTS", value_delimiter = ',')]
    idx_roots: Vec<std::path::PathBuf>,
    /// The endpoint of the S3-compatible store holding `shards:s3://` data sets (default: AWS's); its
    /// credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
    #[arg(long, env = "RINGTRAIN_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// The most the local agent's cache of data sets and models may hold, in GiB (0: no limit): a bucket's
    /// data set larger than it streams through it.
    #[arg(long, env = "RINGTRAIN_CACHE_MAX_GIB", default_value_t = ringtrain_agent::cache::DEFAULT_MAX_GIB)]
    cache_max_gib: f64,
    /// Each CPU slot's memory in MiB, which jobs are admitted against and each rank's cgroup enforces
    /// (default: this machine's memory shared among the slots).
    #[arg(long, env = "RINGTRAIN_SLOT_MEMORY_MIB", value_parser = clap::value_parser!(u64).range(1..))]
    slot_memory_mib: Option<u64>,
    #[command(flatten)]
    limits: super::limits::LimitArgs,
    #[command(flatten)]
    sandbox: super::serve::SandboxArgs,
}

pub fn run(args: Args) -> ExitCode {
    super::block_on("up", up(args))
}

async fn up(args: Args) -> anyhow::Result<()> {
    super::private_dir(&args.data_dir)?;
    let token_file = args.data_dir.join("admin-token");
    let token = match &args.bootstrap_token {
        Some(token) => token.clone(),
        None => token_file_contents(&token_file)?,
    };
    let server = Server::start(&serve::Args {
        listen: args.listen,
        database_url: None,
        data_dir: args.data_dir.clone(),
        max_dataset_bytes: 512 << 20,
        max_model_bytes: 256 << 20,
        bootstrap_token: Some(token.clone()),
        idx_roots: args.idx_roots.clone(),
        s3_endpoint: args.s3_endpoint.clone(),
        // `up` is one machine: its own folder
        store: None,
        tls_cert: None,
        tls_key: None,
        limits: args.limits.clone(),
        sandbox: args.sandbox.clone(),
        // `up` is one machine: its own agent, no Slurm
        slurm: Default::default(),
    })
    .await?;
    let url = format!("http://{}", server.address);

    // The local agent's token, kept beside the database: the node "local" stays registered to it across
    // restarts (another token could not take the name over).
    let agent_token = token_file_contents(&args.data_dir.join("agent-token"))?;
    let store = &server.state.store;
    if store.find_token(&hash_token(&agent_token)).await?.is_none() {
        store
            .create_token(NewToken {
                token_hash: hash_token(&agent_token),
                role: Role::Agent,
                team_id: None,
                platform: false,
                label: Some("ringtrain up: local agent".into()),
                expires_at: None,
            })
            .await?;
    }
    let state = server.state.clone();
    let scheduler_paused = server.scheduler_paused.clone();
    let (stop_server, server_stops) = tokio::sync::oneshot::channel::<()>();
    let mut serving = tokio::spawn(server.run(async move {
        let _ = server_stops.await;
    }));
    let agent = Agent::register(&ringtrain_agent::Args {
        server: url.clone(),
        token: Some(agent_token),
        token_file: None,
        name: Some("local".into()),
        address: Some(std::net::Ipv4Addr::LOCALHOST.into()),
        gpus: args.gpus.clone(),
        cpus: args.cpus,
        work_dir: args.data_dir.join("agent"),
        cache_max_gib: args.cache_max_gib,
        slot_memory_mib: args.slot_memory_mib,
        hang_floor_s: ringtrain_agent::HANG_FLOOR.as_secs(),
        self_test_every_min: 30,
        threads: args.threads,
        heartbeat_s: timing::HEARTBEAT.as_secs(),
        lease_s: timing::LEASE.as_secs(),
        outage_grace_s: timing::OUTAGE_GRACE.as_secs(),
        idx_roots: args.idx_roots.clone(),
        s3_endpoint: args.s3_endpoint.clone(),
        transport: ringtrain_client::Transport::default(),
        rank_user: args.sandbox.rank_user.clone(),
        allow_unsandboxed: args.sandbox.allow_unsandboxed,
        slurm: false,
        exit_when_idle_s: None,
    })
    .await?;
    let node = agent.node();
    let mut agent_task = tokio::spawn(agent.run());
    print_welcome(&url, &token, &token_file, args.bootstrap_token.is_some());
    tokio::select! {
        served = &mut serving => {
            agent_task.abort();
            served.context("the server task failed")?
        }
        ran = &mut agent_task => ran.context("the agent task failed")?,
        () = serve::shutdown_signal() => {
            eprintln!("stopping: checkpointing the running jobs so that the next start resumes them \
                       (Ctrl-C again to stop at once)");
            // no pass may place the jobs again on the devices they are leaving
            scheduler_paused.store(true, std::sync::atomic::Ordering::SeqCst);
            tokio::select! {
                drained = checkpoint_running_jobs(&state, node, DRAIN) => match drained {
                    Ok(0) => {}
                    Ok(n) => eprintln!("{n} job(s) checkpointed; they resume on the next start"),
                    Err(err) => eprintln!("up: checkpointing the running jobs failed: {err:#}"),
                },
                () = serve::shutdown_signal() => eprintln!("stopping at once"),
            }
            let _ = stop_server.send(());
            agent_task.abort();
            serving.await.context("the server task failed")?
        }
    }
}

/// The longest `up` waits for its node's ranks to checkpoint and stop after Ctrl-C.
const DRAIN: Duration = Duration::from_secs(90);

/// Preempts every placement with a rank on `node`: its ranks stop after the same iteration with a
/// checkpoint of it, the job goes back to the queue without using a restart, and the next start resumes it
/// from exactly there. Waits, up to `within`, until no rank is left on the node; returns the placements
/// preempted.
async fn checkpoint_running_jobs(
    state: &ringtrain_api::AppState,
    node: ringtrain_core::NodeId,
    within: Duration,
) -> anyhow::Result<usize> {
    use ringtrain_core::AssignmentState;
    let store = &state.store;
    let live = store.node_assignments(node, &AssignmentState::LIVE).await?;
    let placements: std::collections::BTreeSet<_> = live.iter().map(|a| (a.job_id, a.attempt)).collect();
    let mut preempted = 0;
    for (job, attempt) in placements {
        let reason = "ringtrain up stopped; the job resumes from this checkpoint on the next start";
        preempted += usize::from(store.preempt_job(job, attempt, reason).await?.is_some());
    }
    // wakes the agent's poll, which tells the ranks to checkpoint and stop
    state.changed().await;
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if store.node_assignments(node, &AssignmentState::LIVE).await?.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(preempted)
}

/// A token kept in the data directory (readable by this user only), made on the first start.
fn token_file_contents(path: &std::path::Path) -> anyhow::Result<String> {
    if let Ok(token) = std::fs::read_to_string(path) {
        if !token.trim().is_empty() {
            return Ok(token.trim().to_string());
        }
    }
    let token = generate_token();
    super::write_secret(path, &format!("{token}\n"))?;
    Ok(token)
}

fn print_welcome(url: &str, token: &str, token_file: &std::path::Path, preset: bool) {
    let kept = if preset { String::new() } else { format!(" (kept in {})", token_file.display()) };
    println!("ringtrain is up at {url}: server, scheduler and a local agent.");
    println!("the web page: {url}/ (sign in with the admin token)");
    println!("admin token{kept}:\n  {token}\n");
    println!("submit a job:");
    println!("  export RINGTRAIN_TOKEN={token}");
    println!(
        "  curl -s -H \"Authorization: Bearer $RINGTRAIN_TOKEN\" -H 'Content-Type: application/json' \\\n    \
         --data @examples/fashion-mnist-lenet5.json {url}/v1/jobs"
    );
    println!("watch it:");
    println!("  ringtrain jobs watch JOB_ID --server {url}");
    println!("  curl -sN -H \"Authorization: Bearer $RINGTRAIN_TOKEN\" {url}/v1/jobs/JOB_ID/events   (SSE)");
    println!();
}
