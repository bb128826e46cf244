//! The node agent (`ringtrain agent`): the worker-side daemon. It registers this node's devices with the
//! server ([`devices`]), heartbeats, long-polls for the ranks placed here ([`client`]), runs one
//! `ringtrain train` process per rank and supervises it ([`rank`]: its files in [`files`], its output relayed
//! by [`relay`], its ending reported by [`report`]), and stops ranks the server says are over. If it cannot
//! heartbeat for longer than the lease, the server has requeued its jobs elsewhere, so it stops their ranks
//! itself.
//!
//! It talks to the server only over HTTP with its agent token, in the wire types of [`ringtrain_protocol`];
//! it never links libtorch (the rank processes do).
//!
//! Over 450 lines: registration and the loop (poll, start, stop, leave on SIGUSR1) share one state, the
//! ranks this node holds. Splitting the loop from registration is the next step when it grows.

mod buckets;
pub mod cache;
mod capabilities;
pub mod client;
mod confine;
pub mod devices;
mod files;
mod folders;
mod hang;
mod health;
/// How long a rank may show no progress before it counts as hung, unless `--hang-floor-s` says otherwise.
pub use hang::DEFAULT_FLOOR as HANG_FLOOR;
mod lines;
pub mod rank;
mod relay;
mod report;
mod shared_memory;
pub mod slurm_step;
mod streaming;
mod system_metrics;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ringtrain_core::{AssignmentId, AssignmentState, NodeId};
use ringtrain_protocol::{Poll, ResultReport, Work};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use client::Client;
use rank::{AgentContext, StopRequest};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The server's base URL.
    #[arg(long, env = "RINGTRAIN_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// The agent token (a platform admin makes one per node with POST /v1/agent-tokens). Prefer
    /// --token-file or the environment: a command line is visible to every user of the machine (`ps`).
    #[arg(long, env = "RINGTRAIN_AGENT_TOKEN", hide_env_values = true, required_unless_present = "token_file")]
    pub token: Option<String>,
    /// A file holding the agent token (first line).
    #[arg(long, conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// This node's name in the pool (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// The IP address other nodes reach this one at (default: the local address of the route to the server).
    #[arg(long)]
    pub address: Option<std::net::IpAddr>,
    /// GPUs to offer: all (those nvidia-smi lists), none, or indices such as 0,1.
    #[arg(long, default_value = "all")]
    pub gpus: String,
    /// CPU slots to offer, one rank each (default: the number of cores when no GPU is offered, else 0).
    #[arg(long)]
    pub cpus: Option<u32>,
    /// Where ranks' files (specs, checkpoints, downloaded datasets) are kept. A rank's folder is removed once
    /// it has ended and its checkpoint reached the server; the agent clears them all when it starts.
    #[arg(long, default_value = DEFAULT_WORK_DIR)]
    pub work_dir: PathBuf,
    /// The most the cache of downloaded datasets and models may hold, in GiB (0: no limit): the least
    /// recently used files are removed past it, never one a running rank uses.
    #[arg(long, env = "RINGTRAIN_CACHE_MAX_GIB", default_value_t = cache::DEFAULT_MAX_GIB)]
    pub cache_max_gib: f64,
    /// Each CPU slot's memory, in MiB: what the server admits a job's per-rank estimate against, and the
    /// memory limit of each rank's cgroup (plus the rank process's own runtime, which estimates leave out).
    /// Default: this machine's memory shared among the devices offered.
    #[arg(long, env = "RINGTRAIN_SLOT_MEMORY_MIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub slot_memory_mib: Option<u64>,
    /// Seconds a rank may show no progress (no new iteration report, no CPU time) before it counts as hung,
    /// is killed and its job resumes from its newest checkpoint; a rank whose reports come slowly gets 20
    /// of its median report intervals instead, and one whose process is not stopped twice its bound.
    #[arg(long, env = "RINGTRAIN_HANG_FLOOR_S", default_value_t = hang::DEFAULT_FLOOR.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..))]
    pub hang_floor_s: u64,
    /// Minutes between two self-tests of this node (a known matrix product and all-reduce) while no rank
    /// runs here; 0: only the one at start. A node that fails gets no new placements until a platform
    /// admin lifts its quarantine.
    #[arg(long, env = "RINGTRAIN_SELF_TEST_EVERY_MIN", default_value_t = 30)]
    pub self_test_every_min: u64,
    /// libtorch threads per rank process (default: 1 on CPU slots).
    #[arg(long)]
    pub threads: Option<i32>,
    /// Seconds between heartbeats.
    #[arg(long, default_value_t = ringtrain_protocol::timing::HEARTBEAT.as_secs())]
    pub heartbeat_s: u64,
    /// Stop every rank after this many seconds without a successful heartbeat when the server answers but
    /// refuses them (the server's lease: it has written this node off).
    #[arg(long, default_value_t = ringtrain_protocol::timing::LEASE.as_secs())]
    pub lease_s: u64,
    /// Keep ranks running for this many seconds while the server cannot be reached at all (a restart, a
    /// deploy, a database failover); when it answers again, ranks it no longer lists are stopped.
    #[arg(long, env = "RINGTRAIN_OUTAGE_GRACE_S", default_value_t = ringtrain_protocol::timing::OUTAGE_GRACE.as_secs())]
    pub outage_grace_s: u64,
    #[command(flatten)]
    pub transport: ringtrain_client::Transport,
    /// A folder under which `idx:PATH` datasets may be read on this node (repeat for several; none: no
    /// `idx:` job runs here). Checked on the resolved path, links followed.
    #[arg(long = "idx-root", env = "RINGTRAIN_IDX_ROOTS", value_delimiter = ',')]
    pub idx_roots: Vec<PathBuf>,
    /// The endpoint of the S3-compatible store holding `shards:s3://BUCKET/PREFIX` data sets (default:
    /// AWS's, by AWS_REGION). Its credentials come from this agent's environment (AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) and never reach a rank.
    #[arg(long, env = "RINGTRAIN_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// The account ranks run as when the agent runs as root (never root itself; default ringtrain-rank,
    /// which scripts/setup.sh creates). It must be able to run this binary and read libtorch.
    #[arg(long, env = "RINGTRAIN_RANK_USER")]
    pub rank_user: Option<String>,
    /// Run ranks even where this kernel cannot confine them (no Landlock or seccomp): only for a
    /// single-team install, where every model is trusted.
    #[arg(long, env = "RINGTRAIN_ALLOW_UNSANDBOXED")]
    pub allow_unsandboxed: bool,
    /// Run as a Slurm job step (`srun ringtrain agent --slurm ...` in an allocation): the node's name, CPU
    /// slots, GPUs and work folder come from Slurm's environment, the token is line SLURM_NODEID + 1 of
    /// --token-file (one per node), and the agent leaves once idle (--exit-when-idle-s, default 60).
    #[arg(long)]
    pub slurm: bool,
    /// Exit after this many seconds without a rank to run (a Slurm step's agent: the allocation goes back
    /// to Slurm with it).
    #[arg(long)]
    pub exit_when_idle_s: Option<u64>,
}

/// The agent's work folder unless told otherwise.
pub const DEFAULT_WORK_DIR: &str = "ringtrain-agent";

impl Args {
    /// The token given with --token (or the environment), or read from --token-file.
    pub fn agent_token(&self) -> Result<String> {
        match (&self.token, &self.token_file) {
            (Some(token), _) => Ok(token.clone()),
            (None, Some(file)) => {
                confine::check_token_file(file)?;
                let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
                let token = text.lines().next().unwrap_or("").trim().to_string();
                anyhow::ensure!(!token.is_empty(), "{} holds no token", file.display());
                Ok(token)
            }
            (None, None) => anyhow::bail!("give the agent token: --token-file FILE or RINGTRAIN_AGENT_TOKEN"),
        }
    }
}

/// Registers and runs the agent until the process ends.
pub async fn serve_node(args: Args) -> Result<()> {
    let args = if args.slurm { slurm_step::configure(args, |name| std::env::var(name).ok())? } else { args };
    let agent = Agent::register(&args).await?;
    agent.run().await
}

struct RankHandle {
    stop: watch::Sender<Option<StopRequest>>,
    task: JoinHandle<AssignmentState>,
    /// What it runs: the job, the placement's attempt, its rank.
    job: (ringtrain_core::JobId, i32, i32),
}

pub struct Agent {
    ctx: Arc<AgentContext>,
    node: NodeId,
    heartbeat: Duration,
    lease: Duration,
    outage_grace: Duration,
    ranks: HashMap<AssignmentId, RankHandle>,
    /// Leave after this long without a rank (a Slurm step's agent).
    exit_when_idle: Option<Duration>,
    /// Self-test again after this long, while idle (None: only at start).
    self_test_every: Option<Duration>,
    last_self_test: Instant,
    /// SIGUSR1 came (Slurm's grace signal before a time limit): every rank checkpoints and stops, no new
    /// work starts, and the agent leaves once its ranks have ended.
    leaving: bool,
    /// The placements whose rank 0 ran here when the agent began to leave: reported as stopped (to resume
    /// from their checkpoints) once this node offers no devices.
    leaving_placements: Vec<(ringtrain_core::JobId, i32)>,
    /// What this node registered as (for the re-registration without devices as it leaves).
    registered: (String, String),
    /// The last poll listed work for this node.
    work_listed: bool,
    /// Ranks that ended here, with the state reported for them: if the server still lists one (the report
    /// did not get through), it is reported again rather than taken for a rank lost in an agent restart.
    ended: HashMap<AssignmentId, AssignmentState>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("node", &self.node).field("ranks", &self.ranks.len()).finish()
    }
}

impl Agent {
    pub async fn register(args: &Args) -> Result<Agent> {
        let client = Client::new(&args.server, &args.agent_token()?, &args.transport)?;
        let wanted = devices::parse_gpus(&args.gpus).map_err(anyhow::Error::msg).context("--gpus")?;
        let mut offered = devices::gpus(wanted.as_deref());
        let cpus = args.cpus.unwrap_or(if offered.is_empty() { devices::cores() } else { 0 });
        // CPU slots are numbered after the GPUs: indices are unique per node.
        let first_cpu = offered.iter().map(|g| g.index + 1).max().unwrap_or(0);
        // each rank may use its device's share of this machine's memory (what the server admits jobs by),
        // or what the operator set for a slot
        let memory =
            devices::rank_memory(args.slot_memory_mib, offered.len() as u64 + u64::from(cpus), !offered.is_empty());
        offered.extend(devices::cpu_slots(cpus, memory.slot).into_iter().map(|mut d| {
            d.index += first_cpu;
            d
        }));
        anyhow::ensure!(!offered.is_empty(), "this node offers no device: give --cpus N or --gpus");
        if let (Some(limit), Some(total)) = (memory.limit, devices::memory_total()) {
            if limit.saturating_mul(offered.len() as u64) > total {
                tracing::warn!(
                    ranks = offered.len(),
                    each_mib = limit >> 20,
                    machine_mib = total >> 20,
                    "the ranks' memory limits add up to more than this machine has: lower --slot-memory-mib"
                );
            }
        }
        let exe = std::env::current_exe().context("cannot find the ringtrain executable")?;
        let offers_gpus = offered.iter().any(|d| d.kind == ringtrain_core::spec::DeviceKind::Gpu.to_string());
        let sandbox = confine::RankSandbox::prepare(
            args.rank_user.as_deref(),
            args.allow_unsandboxed,
            &exe,
            memory.limit,
            offers_gpus,
        )?;
        let report = capabilities::ask(&exe).await;
        match &report {
            Ok(report) => tracing::info!(capabilities = %capabilities::summary(report), "ringtrain doctor"),
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "ringtrain doctor failed"),
        }
        capabilities::check_offered_gpus(report.as_ref(), &offered)?;
        // tested before it is offered, and the result sent as soon as the node exists on the server
        let self_test = health::run(&exe).await;
        let name = args.name.clone().unwrap_or_else(devices::hostname);
        let address = args.address.unwrap_or_else(|| devices::address_towards(&args.server));
        // The server may still be starting: retry for a while.
        let mut tries = 0;
        let node = loop {
            match client.register(&name, &address.to_string(), &offered).await {
                Ok(node) => break node,
                Err(err) if err.status.is_none() && tries < 30 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(err) => return Err(err).context("cannot register this node"),
            }
        };
        health::report(&client, node.id, &self_test).await;
        let summary: Vec<String> = offered.iter().map(|d| format!("{} {}", d.kind, d.index)).collect();
        tracing::info!(node = %name, node_id = %node.id, server = %args.server, devices = %summary.join(", "), "registered");
        std::fs::create_dir_all(&args.work_dir)
            .with_context(|| format!("cannot create {}", args.work_dir.display()))?;
        // every tenant's cached data, models and checkpoints: the agent's alone (ranks get theirs passed open)
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&args.work_dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot make {} private", args.work_dir.display()))?;
        }
        let work_dir = std::fs::canonicalize(&args.work_dir)?;
        let (cache, folders) = tidy_work_dir(&work_dir, args.cache_max_gib)?;
        let ctx = AgentContext {
            client,
            node_id: node.id,
            node_name: name.clone(),
            address,
            work_dir,
            cache,
            folders,
            exe,
            threads: args.threads,
            idx_roots: args.idx_roots.clone(),
            buckets: buckets::Buckets::new(args.s3_endpoint.clone()),
            sandbox,
            segments: Default::default(),
            leaving: Default::default(),
            hang_floor: Duration::from_secs(args.hang_floor_s),
        };
        Ok(Agent {
            ctx: Arc::new(ctx),
            node: node.id,
            heartbeat: Duration::from_secs(args.heartbeat_s.max(1)),
            lease: Duration::from_secs(args.lease_s.max(2)),
            outage_grace: Duration::from_secs(args.outage_grace_s.max(args.lease_s).max(2)),
            ranks: HashMap::new(),
            exit_when_idle: args.exit_when_idle_s.map(Duration::from_secs),
            self_test_every: (args.self_test_every_min > 0).then(|| Duration::from_secs(args.self_test_every_min * 60)),
            last_self_test: Instant::now(),
            leaving: false,
            leaving_placements: Vec::new(),
            registered: (name.clone(), address.to_string()),
            work_listed: false,
            ended: HashMap::new(),
        })
    }

    /// The node this agent registered.
    pub fn node(&self) -> NodeId {
        self.node
    }

    pub async fn run(mut self) -> Result<()> {
        let heard = Arc::new(Mutex::new(Heard { ok: Instant::now(), refused: false }));
        tokio::spawn(heartbeats(self.ctx.client.clone(), self.node, self.heartbeat, heard.clone()));
        let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
            .context("cannot listen for SIGUSR1")?;
        let mut since = None;
        let mut idle_since = Instant::now();
        loop {
            self.collect_ended().await;
            if self.leaving && self.ranks.is_empty() {
                self.left().await;
                return Ok(());
            }
            // busy: ranks running, ended ones the server has not let go of yet, or work it listed for
            // this node that has not started (a rank waiting for rank 0's address)
            if !self.ranks.is_empty() || !self.ended.is_empty() || self.work_listed {
                idle_since = Instant::now();
            } else if self.self_test_every.is_some_and(|every| self.last_self_test.elapsed() >= every) {
                self.last_self_test = Instant::now();
                let report = health::run(&self.ctx.exe).await;
                health::report(&self.ctx.client, self.node, &report).await;
            }
            let mut wait = ringtrain_protocol::timing::MAX_POLL_WAIT;
            if let Some(limit) = self.exit_when_idle {
                let idle = idle_since.elapsed();
                if idle >= limit {
                    tracing::info!(idle_s = idle.as_secs(), "no rank to run: leaving (--exit-when-idle-s)");
                    return Ok(());
                }
                wait = wait.min(limit - idle + Duration::from_millis(100));
            }
            let heard_now = heard.lock().map(|h| *h).unwrap_or(Heard { ok: Instant::now(), refused: false });
            if let Some(why) = heard_now.stop_reason(self.lease, self.outage_grace) {
                if !self.ranks.is_empty() {
                    tracing::warn!(silent_s = heard_now.ok.elapsed().as_secs(), "{why}: stopping every rank");
                    self.stop_all(why);
                }
            }
            // The poll answers at once when anything changes (rank 0's address included), so the wait is
            // only the longest silence.
            let client = self.ctx.client.clone();
            let polled = tokio::select! {
                polled = client.poll(self.node, since, wait) => polled,
                _ = usr1.recv() => {
                    self.leave();
                    continue;
                }
            };
            match polled {
                Ok(poll) => {
                    since = Some(poll.version);
                    self.apply(poll).await;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "poll failed");
                    since = None;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    async fn collect_ended(&mut self) {
        let finished: Vec<AssignmentId> =
            self.ranks.iter().filter(|(_, r)| r.task.is_finished()).map(|(id, _)| *id).collect();
        for id in finished {
            if let Some(rank) = self.ranks.remove(&id) {
                let state = rank.task.await.unwrap_or(AssignmentState::Failed);
                self.ended.insert(id, state);
            }
        }
    }

    async fn apply(&mut self, poll: Poll) {
        self.work_listed = !poll.work.is_empty();
        let listed: std::collections::HashSet<AssignmentId> = poll
            .work
            .iter()
            .map(|w| w.assignment.id)
            .chain(poll.stop.iter().copied())
            .chain(poll.preempt.iter().copied())
            .collect();
        self.ended.retain(|id, _| listed.contains(id));
        // A rank the server no longer lists at all was written off (its node was declared lost while this
        // agent could not get through): its job runs elsewhere now, so it must not run on here.
        for (id, rank) in &self.ranks {
            if !listed.contains(id) && rank.stop.borrow().as_ref().is_none_or(|r| r.checkpoint_first) {
                let why = "the server no longer lists this rank (its node was declared lost)";
                let _ = rank.stop.send(Some(StopRequest { why: why.into(), checkpoint_first: false }));
            }
        }
        let preempt: Vec<(AssignmentId, bool)> = poll.preempt.iter().map(|id| (*id, true)).collect();
        for (id, checkpoint_first) in poll.stop.into_iter().map(|id| (id, false)).chain(preempt) {
            if let Some(state) = self.ended.get(&id) {
                report::end_assignment(&self.ctx, id, *state).await;
                continue;
            }
            match self.ranks.get(&id) {
                Some(rank) => {
                    let why = if checkpoint_first {
                        "the scheduler preempted this placement"
                    } else {
                        "the server stopped this placement"
                    };
                    let request = StopRequest { why: why.into(), checkpoint_first };
                    // Sent once (a repeat would wake the rank's supervisor for nothing), unless it escalates a
                    // checkpoint-and-stop to a stop at once.
                    let escalates = match &*rank.stop.borrow() {
                        None => true,
                        Some(previous) => previous.checkpoint_first && !checkpoint_first,
                    };
                    if escalates {
                        let _ = rank.stop.send(Some(request));
                    }
                }
                None => {
                    // Not running here (any more): just say it is over, which frees its device.
                    for from in [AssignmentState::Delivered, AssignmentState::Running] {
                        if self.ctx.client.set_assignment_state(id, from, AssignmentState::Cancelled).await.is_ok() {
                            break;
                        }
                    }
                }
            }
        }
        for work in poll.work {
            let id = work.assignment.id;
            if self.ranks.contains_key(&id) || self.leaving {
                continue;
            }
            if let Some(state) = self.ended.get(&id) {
                report::end_assignment(&self.ctx, id, *state).await;
                continue;
            }
            if work.assignment.state == AssignmentState::Running {
                // The server thinks it runs here, but this agent never started it: the agent restarted
                // and the rank died with its predecessor.
                self.report_lost(&work).await;
                continue;
            }
            if work.assignment.rank > 0 && work.rendezvous.is_none() {
                continue; // the poll that brings rank 0's address starts it
            }
            let (stop, receiver) = watch::channel(None);
            let job = (work.assignment.job_id, work.assignment.attempt, work.assignment.rank);
            let task = tokio::spawn(rank::run(self.ctx.clone(), work, receiver));
            self.ranks.insert(id, RankHandle { stop, task, job });
        }
    }

    async fn report_lost(&self, work: &Work) {
        let a = &work.assignment;
        let error = format!("rank {} on node {} was lost: its agent restarted", a.rank, self.ctx.node_name);
        let report = ResultReport::failed(a.attempt, error, true);
        let _ = self.ctx.client.report_result(a.job_id, &report).await;
        let _ = self.ctx.client.set_assignment_state(a.id, AssignmentState::Running, AssignmentState::Failed).await;
    }

    /// SIGUSR1: what Slurm sends `--slurm-grace-s` before a job's time limit (`--signal=USR1@N`). Every
    /// rank checkpoints and stops (the job goes back to the queue and resumes from that checkpoint), no new
    /// work starts here, and the agent leaves once its ranks have ended.
    fn leave(&mut self) {
        if self.leaving {
            return;
        }
        self.leaving = true;
        self.ctx.leaving.store(true, std::sync::atomic::Ordering::SeqCst);
        self.leaving_placements = self.ranks.values().filter(|r| r.job.2 == 0).map(|r| (r.job.0, r.job.1)).collect();
        tracing::warn!(ranks = self.ranks.len(), "SIGUSR1: this node leaves; its ranks checkpoint and stop");
        let why = "this node leaves (SIGUSR1: its Slurm job's time limit is near)";
        for rank in self.ranks.values() {
            let escalates = rank.stop.borrow().is_none();
            if escalates {
                let _ = rank.stop.send(Some(StopRequest { why: why.into(), checkpoint_first: true }));
            }
        }
    }

    /// Every rank stopped (with its checkpoint delivered): the node offers no devices any more, so the
    /// scheduler places nothing here, and then the placements whose rank 0 ran here go back to the queue
    /// to resume from those checkpoints (in that order: otherwise a placement could come straight back
    /// to this node).
    async fn left(&mut self) {
        let (name, address) = &self.registered;
        if let Err(err) = self.ctx.client.register(name, address, &[]).await {
            tracing::warn!(error = %err, "cannot withdraw this node's devices; the server finds it lost soon");
        }
        for (job, attempt) in std::mem::take(&mut self.leaving_placements) {
            let why = format!(
                "stopped with a checkpoint: node {} left (SIGUSR1: its Slurm job's time limit is near)",
                self.ctx.node_name
            );
            match report::report_outcome(&self.ctx, job, &ResultReport::failed(attempt, why, true)).await {
                Ok(answer) => tracing::info!(%job, job_state = %answer.state, "reported the stop"),
                Err(err) => tracing::info!(%job, error = %err, "the stop was not taken (the placement is over)"),
            }
        }
        tracing::info!("every rank stopped with a checkpoint: leaving (SIGUSR1)");
    }

    fn stop_all(&mut self, why: &str) {
        for rank in self.ranks.values() {
            let _ = rank.stop.send(Some(StopRequest { why: why.to_string(), checkpoint_first: false }));
        }
    }
}

/// The work folder's cache and rank folders, tidied as the agent starts: no rank runs here yet (its
/// predecessor's died with it), so every rank folder goes, with half-done downloads; the cache is brought
/// under its limit (which may have been lowered).
fn tidy_work_dir(work_dir: &std::path::Path, cache_max_gib: f64) -> Result<(cache::FileCache, folders::RankFolders)> {
    anyhow::ensure!(
        cache_max_gib.is_finite() && cache_max_gib >= 0.0,
        "--cache-max-gib must be a size in GiB (0: no limit), not {cache_max_gib}"
    );
    let cache = cache::FileCache::new(work_dir, Some(cache_max_gib));
    let folders = folders::RankFolders::new(work_dir);
    let freed = folders.clear()?;
    cache.remove_partials().context("cannot remove half-done downloads")?;
    let evicted = cache.evict().context("cannot bring the cache under --cache-max-gib")?;
    let evicted_bytes: u64 = evicted.removed.iter().map(|(_, bytes)| bytes).sum();
    tracing::info!(
        rank_folders_freed = freed,
        cache_bytes = evicted.bytes,
        evicted = evicted.removed.len(),
        evicted_bytes,
        "work folder tidied"
    );
    Ok((cache, folders))
}

/// What the heartbeats heard last.
#[derive(Debug, Clone, Copy)]
struct Heard {
    /// The last heartbeat the server took.
    ok: Instant,
    /// The server answered the last one, and refused it (the node is not this agent's, or the token was
    /// revoked): it has written this node off, and its jobs run elsewhere.
    refused: bool,
}

impl Heard {
    /// Why every rank must stop now, if it must: refused for longer than the lease (the server has placed
    /// the jobs elsewhere), or not reachable at all for longer than the outage grace. An outage shorter than
    /// that is ridden out: the ranks train on, and the poll reconciles once the server answers again.
    fn stop_reason(&self, lease: Duration, outage_grace: Duration) -> Option<&'static str> {
        let silent = self.ok.elapsed();
        if self.refused && silent > lease {
            Some("the server refused this node's heartbeats for longer than the lease")
        } else if silent > outage_grace {
            Some("the server could not be reached for longer than the outage grace")
        } else {
            None
        }
    }
}

async fn heartbeats(client: Client, node: NodeId, every: Duration, heard: Arc<Mutex<Heard>>) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let answer = client.heartbeat(node).await;
        let Ok(mut heard) = heard.lock() else { return };
        match answer {
            Ok(()) => *heard = Heard { ok: Instant::now(), refused: false },
            Err(err) => {
                tracing::warn!(error = %err, "heartbeat failed");
                heard.refused = err.is_final();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(silent_s: u64, refused: bool) -> Heard {
        Heard { ok: Instant::now().checked_sub(Duration::from_secs(silent_s)).unwrap(), refused }
    }

    #[test]
    fn an_outage_is_ridden_out_but_a_refusal_is_not() {
        let (lease, grace) = (Duration::from_secs(30), Duration::from_secs(600));
        assert_eq!(heard(5, false).stop_reason(lease, grace), None);
        // the server cannot be reached: ranks train on, up to the outage grace
        assert_eq!(heard(300, false).stop_reason(lease, grace), None);
        assert!(heard(601, false).stop_reason(lease, grace).unwrap().contains("could not be reached"));
        // the server answers and refuses: it wrote the node off, so stop after the lease
        assert_eq!(heard(10, true).stop_reason(lease, grace), None);
        assert!(heard(31, true).stop_reason(lease, grace).unwrap().contains("refused"));
    }
}
