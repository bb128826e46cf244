//! One rank of one placement, from start to report: prepare its files (spec, dataset, the checkpoint to
//! resume from), start `ringtrain train --rank ...`, relay its metrics in batches and (rank 0) its
//! checkpoints, and report how it ended. Stopped through `stop` (a cancel, a preemption, a lost lease).
//!
//! Over 450 lines: preparing, supervising and concluding one rank read the same prepared files and
//! relay. Moving the conclusion (uploads and reports) to a module of its own is the next step.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{AssignmentState, DatasetRef};
use ringtrain_protocol::rank::{RankCommand, EXIT_JOB_ERROR, EXIT_STOPPED};
use ringtrain_protocol::{Assignment, ResultReport, Work};
use serde_json::Value;
use tokio::io::BufReader;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tracing::Instrument;

use crate::cache::{CachedFile, FileCache};
use crate::client::Client;
use crate::confine::{self, RankSandbox};
use crate::files::{dataset_file, fetch_checkpoint, fetch_init, model_file, DatasetFile};
use crate::folders::RankFolders;
use crate::hang::{ProcessState, Watchdog};
use crate::lines::CappedLines;
use crate::relay::Relay;
use crate::report::{end_assignment, report_failure, report_outcome, through_outage, OUTCOME_TRIES};
use crate::shared_memory::PlacementSegments;
use crate::streaming::RankStream;
use crate::system_metrics::SystemSampler;
use ringtrain_data::stream::StreamLine;
use ringtrain_sandbox::cgroup::Cgroup;

/// What every rank of this agent shares.
#[derive(Debug)]
pub struct AgentContext {
    pub client: Client,
    pub node_id: ringtrain_core::NodeId,
    pub node_name: String,
    /// Where this node's ranks listen (rank 0's rendezvous host).
    pub address: std::net::IpAddr,
    pub work_dir: PathBuf,
    /// The downloaded datasets and models, kept under --cache-max-gib.
    pub(crate) cache: FileCache,
    /// The ranks' folders, removed as they end.
    pub(crate) folders: RankFolders,
    /// The `ringtrain` executable the ranks run.
    pub exe: PathBuf,
    /// libtorch threads per rank.
    pub threads: Option<i32>,
    /// Where `idx:` datasets may be read on this node.
    pub idx_roots: Vec<PathBuf>,
    /// How this node reaches buckets of sharded data sets (`shards:s3://`).
    pub(crate) buckets: crate::buckets::Buckets,
    /// How ranks are confined.
    pub sandbox: RankSandbox,
    /// The shared memory of placements whose ranks are all on this node.
    pub(crate) segments: PlacementSegments,
    /// The agent leaves (SIGUSR1): its ranks' stops are reported by the agent once it offers no devices.
    pub(crate) leaving: std::sync::atomic::AtomicBool,
    /// The shortest time without progress after which a rank counts as hung ([`crate::hang`]).
    pub hang_floor: Duration,
}

/// How often metrics are sent and rank 0's checkpoints looked for: often enough that the API trails the
/// ranks by a fraction of a second, at a few small requests per second per rank.
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// Why the agent stops a rank.
#[derive(Debug, Clone)]
pub struct StopRequest {
    pub why: String,
    /// Ask the ranks to stop after a checkpoint of where they are (a preemption), instead of killing at once.
    pub checkpoint_first: bool,
}

/// How long ranks asked to checkpoint and stop may take before they are killed.
const CHECKPOINT_GRACE: Duration = Duration::from_secs(120);

/// How the rank process ended.
enum Ending {
    Exited(std::process::ExitStatus),
    Stopped(String),
    /// The rank made no progress for its bound ([`crate::hang`]) and was killed: why.
    Hung(String),
}

/// Runs the rank to its end and reports it; returns the state its assignment ended in (`done`, `failed` or
/// `cancelled`), so the agent can report it again if the server did not get it. Never fails: every failure
/// becomes a report.
pub async fn run(ctx: Arc<AgentContext>, work: Work, stop: watch::Receiver<Option<StopRequest>>) -> AssignmentState {
    let a = &work.assignment;
    let span = tracing::info_span!("rank", job = %a.job_id, attempt = a.attempt, rank = a.rank, node = %ctx.node_name);
    async {
        let rank_dir = ctx.folders.of(a);
        match run_inner(&ctx, &work, &rank_dir, stop).await {
            Ok((ended, delivered)) => {
                if delivered {
                    remove_folder(&ctx, &rank_dir);
                } else {
                    tracing::warn!(folder = %rank_dir.display(), "kept: its checkpoint did not reach the server");
                }
                ended
            }
            Err(err) => {
                // Preparing or starting the rank failed (a download, a file): the placement cannot go on here.
                // A job this node refuses to run (NotRunnable) would be refused again: not retried.
                tracing::error!(error = format!("{err:#}"), "the rank could not start");
                let error = format!("rank {} on node {} could not start: {err:#}", a.rank, ctx.node_name);
                let retryable = err.downcast_ref::<NotRunnable>().is_none();
                report_failure(&ctx, &work, &error, retryable).await;
                end_assignment(&ctx, a.id, AssignmentState::Failed).await;
                // it never trained: nothing in its folder is worth keeping
                remove_folder(&ctx, &rank_dir);
                AssignmentState::Failed
            }
        }
    }
    .instrument(span)
    .await
}

/// Removes an ended rank's folder (its placement's and job's too once empty), logging what it freed.
fn remove_folder(ctx: &AgentContext, rank_dir: &Path) {
    match ctx.folders.remove(rank_dir) {
        Ok(bytes) => tracing::debug!(folder = %rank_dir.display(), bytes, "removed the ended rank's folder"),
        Err(err) => tracing::warn!(error = format!("{err:#}"), "cannot remove the ended rank's folder"),
    }
}

/// The rank's files, ready before its process starts.
struct Prepared {
    /// The rank's private folder (its user's alone): its spec, its resume point, its output. The rank
    /// reaches it, and its data and model, only through the files passed to it open.
    rank_dir: PathBuf,
    spec: ringtrain_core::JobSpec,
    /// The cached files it trains on, held (never evicted) until the rank has ended.
    dataset: Option<DatasetFile>,
    model: Option<CachedFile>,
    /// The unpacked checkpoint rank 0 resumes from.
    resume: Option<PathBuf>,
    /// The unpacked checkpoint whose weights rank 0 of a fork starts from.
    init: Option<PathBuf>,
}

impl Prepared {
    fn out(&self) -> PathBuf {
        self.rank_dir.join("out")
    }

    fn stop_file(&self) -> PathBuf {
        self.rank_dir.join("stop")
    }
}

/// Writes the rank's spec and fetches what it trains on (dataset, model, rank 0's resume checkpoint).
async fn prepare(ctx: &Arc<AgentContext>, work: &Work, rank_dir: &Path, relay: &mut Relay) -> Result<Prepared> {
    let a = &work.assignment;
    let rank_dir = rank_dir.to_path_buf();
    ctx.folders.make(&rank_dir, &ctx.sandbox)?;
    let spec = work.job_spec().context("the job's spec does not parse")?;
    check_idx_dataset(&spec.dataset, work.dataset_root.as_deref(), &ctx.idx_roots)?;
    tokio::fs::write(rank_dir.join("spec.json"), serde_json::to_vec_pretty(&work.spec)?).await?;
    let _ = tokio::fs::remove_file(rank_dir.join("stop")).await;
    let dataset = dataset_file(ctx, work, &spec.dataset, &mut |line| relay.stderr_line(line)).await?;
    let model = model_file(ctx, work).await?;
    let resume = match (&work.resume, a.rank) {
        (Some(checkpoint), 0) => Some(fetch_checkpoint(ctx, work, checkpoint, &rank_dir).await?),
        _ => None,
    };
    let init = match work.init_weights && a.rank == 0 {
        true => Some(fetch_init(ctx, work, &rank_dir).await?),
        false => None,
    };
    Ok(Prepared { rank_dir, spec, dataset, model, resume, init })
}

/// The rank's process, confined, with its command line, environment and pipes; and its cgroup, when the
/// sandbox made one. Rank 0 picks its rendezvous port here and reports it.
async fn rank_process(
    ctx: &Arc<AgentContext>,
    work: &Work,
    prepared: &Prepared,
    segment: Option<&OwnedFd>,
) -> Result<(Command, Option<Cgroup>)> {
    let a = &work.assignment;
    let group_name = format!("{}-{}-{}", a.job_id, a.attempt, a.rank);
    let (mut launch, cgroup) = ctx.sandbox.launch(&group_name)?;
    let private = confine::pass(&mut launch, &prepared.rank_dir)?;
    launch.private_dir(private.clone());
    let mut rank = RankCommand {
        spec: private.join("spec.json"),
        out: Some(private.join("out")),
        sandbox_dir: Some(private.clone()),
        allow_unsandboxed: ctx.sandbox.allow_unsandboxed,
        exit_with_parent: true,
        // named, so a rank whose agent died while it was still loading exits instead of training on unseen
        parent_pid: Some(std::process::id()),
        stop_file: Some(private.join("stop")),
        threads: ctx.threads,
        resume: prepared.resume.as_ref().map(|_| private.join("resume")),
        init_from: prepared.init.as_ref().map(|_| private.join("init")),
        ..Default::default()
    };
    if let Some(segment) = segment {
        rank.shared_memory = Some(launch.pass(segment.try_clone()?));
    }
    if let Some(file) = &prepared.dataset {
        rank.dataset_file = Some(confine::pass(&mut launch, file.path())?);
    }
    if let Some(file) = &prepared.model {
        rank.model_file = Some(confine::pass(&mut launch, file.path())?);
        // a plain data set's one input is `x`: the rank reads it without names
        let inputs = work.model.as_ref().map(|m| m.inputs.clone()).unwrap_or_default();
        rank.model_inputs = (inputs != ["x"]).then_some(inputs);
        // its checkpoints hold the module itself beside the weights and momentum: room for both, and more
        let size = std::fs::metadata(file.path()).map(|m| m.len()).unwrap_or(0);
        rank.max_file_mib = Some(max_file_mib(size));
    }
    // Rank 0's rendezvous socket is bound here and handed to it, so the port the others are told is held
    // from now on: bound and dropped here and bound again by the rank, another process took it in between
    // once under the test suite's load, and the placement failed its rendezvous.
    let rendezvous = if let (0, Some(reported)) = (a.rank, &work.rendezvous) {
        // This agent's predecessor reported rank 0's address and died before the rank ran: the other ranks
        // were told that address and may be connecting to it already, so rank 0 listens there again.
        rank.rendezvous_listener = Some(launch.pass(listen_again_at(reported).await?));
        reported.clone()
    } else if a.rank == 0 {
        let listener = std::net::TcpListener::bind((ctx.address, 0))?;
        let endpoint = std::net::SocketAddr::new(ctx.address, listener.local_addr()?.port()).to_string();
        rank.rendezvous_listener = Some(launch.pass(listener));
        // through a server restart: a placement must not fail because the server was down at its start
        through_outage(|| ctx.client.report_endpoint(a.id, &endpoint)).await?;
        endpoint
    } else {
        work.rendezvous.clone().context("rank 0's address is not known yet")?
    };
    let mut command = Command::new(&ctx.exe);
    launch.apply(command.as_std_mut())?;
    if let Some(secret) = &work.rendezvous_secret {
        command.env(ringtrain_protocol::rank::RENDEZVOUS_SECRET_ENV, secret);
    }
    (rank.rank, rank.world, rank.rendezvous) = (a.rank as usize, a.world_size as usize, rendezvous);
    // the placement's processes play the job's k ranks: an elastic job's placements differ in how many
    // (a pipelined job's processes are workers × stages; each reads its cuts from the spec)
    let (workers, stages) = (prepared.spec.workers as usize, prepared.spec.stages() as usize);
    let processes = (rank.world / stages).max(1);
    rank.virtual_ranks = (workers % processes == 0).then_some(workers / processes);
    command.args(rank.args());
    if prepared.spec.device == DeviceKind::Gpu {
        // The rank sees only its own GPU, as CUDA device 0.
        command.env("CUDA_VISIBLE_DEVICES", work.device_index.to_string());
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    Ok((command, cgroup))
}

/// How long [`listen_again_at`] waits for a dead predecessor's rank to let go of its address.
const REUSE_ENDPOINT_WAIT: Duration = Duration::from_secs(5);

/// A socket bound to rank 0's address as an earlier agent of this node reported it (`host:port`), once it
/// can be bound again.
/// A new address instead would fail the placement: the other ranks, told the old one, would try it until
/// their join timeout (the soak saw a job lose an attempt so, 120 s later, after an agent kill). The old
/// rank, if it ever ran, exits with its agent; a port taken for good is an error.
async fn listen_again_at(reported: &str) -> Result<std::net::TcpListener> {
    let address: std::net::SocketAddr =
        reported.parse().with_context(|| format!("rank 0's reported address {reported:?} is not host:port"))?;
    let deadline = tokio::time::Instant::now() + REUSE_ENDPOINT_WAIT;
    loop {
        match std::net::TcpListener::bind(address) {
            Ok(listener) => return Ok(listener),
            Err(err) if tokio::time::Instant::now() >= deadline => {
                return Err(err).with_context(|| {
                    format!(
                        "rank 0's address {reported}, which its peers were told before this agent restarted, is taken"
                    )
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Runs the rank; returns how its assignment ended, and whether everything it left for the server got there
/// (its folder may go).
async fn run_inner(
    ctx: &Arc<AgentContext>,
    work: &Work,
    rank_dir: &Path,
    mut stop: watch::Receiver<Option<StopRequest>>,
) -> Result<(AssignmentState, bool)> {
    let a = &work.assignment;
    // made before the rank's files, so that what preparing them says (a bucket's data set being copied)
    // reaches the job's logs, and is sent before a failure to prepare is reported
    let placement_dir = rank_dir.parent().context("a rank folder has its placement's around it")?;
    let mut relay = Relay::new(ctx, work, rank_dir.join("out"), placement_dir.to_path_buf());
    let mut prepared = match prepare(ctx, work, rank_dir, &mut relay).await {
        Ok(prepared) => prepared,
        Err(err) => {
            relay.stderr_line(format!("agent: rank {} could not start: {err:#}", a.rank));
            relay.finish().await;
            return Err(err);
        }
    };
    // held until the rank ends, so the placement's ranks that start after this one get the same segment
    let segment = match work.ranks_on_one_node && prepared.spec.device == DeviceKind::Cpu {
        true => Some(ctx.segments.of(a.job_id, a.attempt).context("cannot make the placement's shared memory")?),
        false => None,
    };
    let (mut command, cgroup) = rank_process(ctx, work, &prepared, segment.as_deref()).await?;
    if stop.borrow().is_some() {
        // Stopped before it started.
        ctx.client.set_assignment_state(a.id, AssignmentState::Delivered, AssignmentState::Cancelled).await?;
        return Ok((AssignmentState::Cancelled, true));
    }
    let mut child = command.spawn().with_context(|| format!("cannot start {}", ctx.exe.display()))?;
    tracing::info!(pid = child.id().unwrap_or(0), "started");
    // Said in the background, through a server outage: the supervisor must drain the rank's output from
    // the start (a rank blocked on a full pipe blocks every rank in the all-reduce), and a server that is
    // down while a rank starts must not fail the placement. (Ending the assignment later works from either
    // state.)
    let started = tokio::spawn(report_started(ctx.clone(), a.clone()));

    if let Some(group) = &cgroup {
        relay.stderr_line(format!("agent: rank {} runs in a {group}", a.rank));
    }
    let stream = prepared.dataset.as_ref().and_then(DatasetFile::stream);
    let ending = supervise(&mut child, &mut stop, &prepared.stop_file(), &mut relay, stream, ctx.hang_floor).await;
    // the rank is gone: its data set's stream stops fetching for it (its uploads and reports may take a
    // while, through a server outage)
    prepared.dataset = None;
    // A success must not overtake the report that the job runs: the server refuses scheduled -> succeeded,
    // and the result would be lost (a short run that ends while the server is unreachable, found by the
    // soak). That report rides out an outage, so it is awaited; after any other ending it is moot.
    match &ending {
        Ok(Ending::Exited(status)) if status.success() => {
            let _ = started.await;
        }
        _ => started.abort(),
    }
    let ending = ending?;
    relay.finish().await;
    let (ended, delivered) = conclude(ctx, work, ending, &mut relay, cgroup.as_ref(), &prepared.out()).await;
    end_assignment(ctx, a.id, ended).await;
    Ok((ended, delivered))
}

/// What the rank's ending means, and what it leaves to upload and report: a preempted rank 0's checkpoint,
/// a finished rank 0's checkpoints and result, a failed rank's last checkpoint and its stderr. Returns the
/// assignment's end state and whether its checkpoints were all delivered (or refused for good).
async fn conclude(
    ctx: &Arc<AgentContext>,
    work: &Work,
    ending: Ending,
    relay: &mut Relay,
    cgroup: Option<&Cgroup>,
    out: &Path,
) -> (AssignmentState, bool) {
    let a = &work.assignment;
    match ending {
        Ending::Stopped(why) => {
            tracing::info!(%why, "stopped");
            (AssignmentState::Cancelled, true)
        }
        Ending::Hung(why) => {
            // not the job's doing as far as anyone can tell (a stopped process, a peer or a node that went
            // silent): its placement fails and the job resumes from its newest checkpoint
            let error = format!("rank {} on node {} {why}; the agent killed it", a.rank, ctx.node_name);
            relay.stderr_line(format!("agent: {error}"));
            tracing::warn!(%why, "hung");
            // the checkpoint first: once the failure is in, this attempt is over and its uploads refused
            let delivered = relay.upload_new_checkpoint(false).await;
            report_failure(ctx, work, &error, true).await;
            (AssignmentState::Failed, delivered)
        }
        Ending::Exited(status) if status.code() == Some(i32::from(EXIT_STOPPED)) => {
            // Preempted, or a node of the placement leaves: every rank stopped at the same iteration and rank
            // 0 wrote a checkpoint of it, which the job's next placement resumes from.
            // The next placement resumes from this checkpoint: worth riding out a server restart.
            let delivered = a.rank != 0 || relay.upload_retrying(false, OUTCOME_TRIES).await;
            tracing::info!("stopped after a checkpoint");
            if a.rank == 0 && !ctx.leaving.load(std::sync::atomic::Ordering::SeqCst) {
                // A stop the scheduler did not ask for (another node of the placement left: its Slurm
                // job's time limit is near) sends the job back to the queue at once, to resume from that
                // checkpoint. After a preemption the placement is already over, and this report is refused
                // as stale. (A leaving agent reports its own rank 0's stop once it offers no devices.)
                let why = "stopped with a checkpoint before its end: a node of the placement left";
                report_failure(ctx, work, why, true).await;
            }
            (AssignmentState::Cancelled, delivered)
        }
        Ending::Exited(status) if status.success() => {
            let mut delivered = true;
            if a.rank == 0 {
                // The whole run was for these: retried through a server outage (a result lost here would
                // make the server run the job again).
                delivered = relay.upload_retrying(false, OUTCOME_TRIES).await;
                delivered &= relay.upload_retrying(true, OUTCOME_TRIES).await;
                let result: Value = match tokio::fs::read(out.join("result.json")).await {
                    Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    Err(_) => Value::Null,
                };
                let report = ResultReport::succeeded(a.attempt, Some(result));
                match report_outcome(ctx, a.job_id, &report).await {
                    Ok(_) => tracing::info!("succeeded"),
                    Err(err) => tracing::warn!(error = %err, "the result was not taken"),
                }
            }
            (AssignmentState::Done, delivered)
        }
        Ending::Exited(status) => {
            // A rank the kernel killed for exceeding its cgroup's memory did so by its own doing (its model
            // or batch): a job error, not retried on another device of the same size.
            let out_of_memory = status.code().is_none() && cgroup.is_some_and(Cgroup::out_of_memory);
            if out_of_memory {
                relay.stderr_line(format!(
                    "agent: rank {} exceeded its memory limit ({}) and was killed",
                    a.rank,
                    cgroup.map_or_else(String::new, ToString::to_string)
                ));
            }
            let retryable = status.code() != Some(i32::from(EXIT_JOB_ERROR)) && !out_of_memory;
            let tail: Vec<String> = relay.stderr_tail.iter().cloned().collect();
            let error = format!(
                "rank {} on node {} {}; its last stderr lines:\n{}",
                a.rank,
                ctx.node_name,
                describe(status),
                tail.join("\n")
            );
            tracing::warn!(ending = describe(status), "failed");
            let delivered = relay.upload_new_checkpoint(false).await;
            report_failure(ctx, work, &error, retryable).await;
            (AssignmentState::Failed, delivered)
        }
    }
}

/// Tells the server the rank runs (and, for rank 0, that the job does), through a server outage.
async fn report_started(ctx: Arc<AgentContext>, a: Assignment) {
    let running = || ctx.client.set_assignment_state(a.id, AssignmentState::Delivered, AssignmentState::Running);
    if let Err(err) = through_outage(running).await {
        tracing::warn!(error = %err, "cannot mark the rank running");
    }
    if a.rank == 0 {
        if let Err(err) = through_outage(|| ctx.client.job_running(a.job_id, a.attempt)).await {
            tracing::warn!(error = %err, "cannot mark the job running");
        }
    }
}

/// Waits for the process to exit or to be stopped, relaying its output meanwhile.
async fn supervise(
    child: &mut Child,
    stop: &mut watch::Receiver<Option<StopRequest>>,
    stop_file: &Path,
    relay: &mut Relay,
    stream: Option<&RankStream>,
    hang_floor: Duration,
) -> Result<Ending> {
    // a line is the rank's request for shards (a bucket's data set), or for the relay
    let take_line = |relay: &mut Relay, line: &str| match stream.zip(StreamLine::parse(line)) {
        Some((stream, request)) => stream.request(request),
        None => relay.metric_line(line),
    };
    let pid = child.id();
    let mut sampler = pid.map(|pid| SystemSampler::new(pid, relay.rank()));
    let mut watchdog = Watchdog::new(hang_floor, std::time::Instant::now());
    let every = SystemSampler::every();
    // the first sample a period after the start: it measures the cores over that period
    let mut samples = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    samples.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stdout = CappedLines::new(BufReader::new(child.stdout.take().context("no stdout")?));
    let mut stderr = CappedLines::new(BufReader::new(child.stderr.take().context("no stderr")?));
    let (mut stdout_open, mut stderr_open) = (true, true);
    // Set once the ranks were asked to checkpoint and stop: past it they are killed.
    let mut grace: Option<(tokio::time::Instant, String)> = None;
    let ending = loop {
        let deadline = grace.as_ref().map(|(at, _)| *at);
        tokio::select! {
            // Never waits on the network: the relay's own task sends lines and checkpoints.
            line = stdout.next_line(), if stdout_open => match line {
                Ok(Some(line)) => {
                    take_line(relay, &line);
                    if let Some(iteration) = relay.newest_iteration {
                        watchdog.reported(iteration, std::time::Instant::now());
                    }
                }
                _ => stdout_open = false,
            },
            line = stderr.next_line(), if stderr_open => match line {
                Ok(Some(line)) => relay.stderr_line(line),
                _ => stderr_open = false,
            },
            status = child.wait() => break Ending::Exited(status?),
            _ = samples.tick(), if sampler.is_some() => {
                let now = std::time::Instant::now();
                if let Some(report) = sampler.as_mut().and_then(SystemSampler::sample) {
                    watchdog.sampled(report.get("cpu_cores").and_then(Value::as_f64).unwrap_or(0.0), now);
                    relay.agent_report(report);
                }
                let hung = pid.and_then(ProcessState::of).and_then(|process| watchdog.verdict(now, &process));
                if let Some(why) = hung {
                    let _ = child.kill().await;
                    break Ending::Hung(why);
                }
            }
            () = sleep_until_or_never(deadline) => {
                let why = grace.take().map_or_else(String::new, |(_, why)| why);
                let _ = child.kill().await;
                break Ending::Stopped(format!("{why}; no checkpoint within {} s", CHECKPOINT_GRACE.as_secs()));
            }
            changed = stop.changed() => {
                let request = match changed {
                    Ok(()) => stop.borrow().clone(),
                    Err(_) => Some(StopRequest { why: "the agent is shutting down".into(), checkpoint_first: false }),
                };
                match request {
                    Some(request) if request.checkpoint_first && grace.is_none() => {
                        // Every rank stops after the iteration in which one of them sees this file.
                        tokio::fs::write(stop_file, request.why.as_bytes()).await?;
                        tracing::info!(why = %request.why, "asked to checkpoint and stop");
                        grace = Some((tokio::time::Instant::now() + CHECKPOINT_GRACE, request.why));
                    }
                    Some(request) if !request.checkpoint_first => {
                        let _ = child.kill().await;
                        break Ending::Stopped(request.why);
                    }
                    _ => {}
                }
            }
        }
    };
    // What the process wrote before it ended.
    while let Ok(Some(line)) = stdout.next_line().await {
        take_line(relay, &line);
    }
    while let Ok(Some(line)) = stderr.next_line().await {
        relay.stderr_line(line);
    }
    Ok(ending)
}

async fn sleep_until_or_never(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "ended".to_string(),
    }
}

/// A job this node will not run as it stands (retrying it elsewhere would fail the same way).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NotRunnable(pub(crate) String);

/// An `idx:` or `shards:` dataset must resolve (links followed) inside one of this node's `--idx-root`
/// folders, and inside the folder the server granted it under (`granted`: the team's data root, or one of
/// the server's `--idx-root`): a job must not make a worker read another team's data or the host's files,
/// not even through a link in its own team's folder. (A shard that is a link out of its folder is refused
/// by the rank's sandbox, which grants the folder alone.)
pub(crate) fn check_idx_dataset(
    dataset: &DatasetRef,
    granted: Option<&str>,
    roots: &[PathBuf],
) -> Result<(), NotRunnable> {
    let Some(path) = dataset.node_path() else { return Ok(()) };
    let refused = |whose: &str| NotRunnable(format!("{dataset} is not inside {whose}"));
    if dataset.bucket_url().is_some() {
        // no file system to resolve: the URL is plain (the server parsed it) and lies under the team's grant
        return match granted {
            Some(root) if root.starts_with(ringtrain_core::dataset::S3_SCHEME) && Path::new(path).starts_with(root) => {
                Ok(())
            }
            _ => Err(refused("a bucket prefix granted to the job's team")),
        };
    }
    let resolved = std::fs::canonicalize(path).map_err(|_| refused("this node's --idx-root folders"))?;
    let inside = roots.iter().filter_map(|r| std::fs::canonicalize(r).ok()).any(|root| resolved.starts_with(root));
    if !inside {
        return Err(refused("this node's --idx-root folders"));
    }
    match granted.map(std::fs::canonicalize) {
        None => Err(refused("a folder granted to the job's team (the server named none)")),
        Some(Ok(root)) if resolved.starts_with(&root) => Ok(()),
        Some(_) => Err(refused(&format!("the folder granted to the job's team, {}", granted.unwrap_or_default()))),
    }
}

/// The largest file a rank training an uploaded model of `model_bytes` may write, in MiB: a checkpoint's
/// module, weights or momentum, each about the model's size, with room; at least 2 GiB.
fn max_file_mib(model_bytes: u64) -> u64 {
    (model_bytes.saturating_mul(4) >> 20).max(2048)
}

#[cfg(test)]
mod tests {
    use super::{check_idx_dataset, max_file_mib, DatasetRef};

    #[test]
    fn idx_datasets_must_resolve_inside_the_nodes_roots_and_the_teams_grant() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        for folder in ["team-a/mnist", "team-b/imagenet"] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
        }
        let outside = dir.path().join("secret");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("team-b/imagenet"), root.join("team-a/borrowed")).unwrap();
        let spec = |path: &std::path::Path| DatasetRef::Shards { path: path.display().to_string() };
        let roots = [root.clone()];
        let (everyone, team_a) = (root.display().to_string(), root.join("team-a").display().to_string());
        let check = |path: &std::path::Path, granted: &str| check_idx_dataset(&spec(path), Some(granted), &roots);
        assert!(check(&root.join("team-a/mnist"), &team_a).is_ok());
        assert!(check(&root.join("team-a/mnist"), &everyone).is_ok());
        let borrowed = check(&root.join("team-a/borrowed"), &team_a).unwrap_err().to_string();
        assert!(
            borrowed.contains("granted to the job's team"),
            "a link from one team's folder to another's: {borrowed}"
        );
        assert!(check(&root.join("link"), &everyone).is_err(), "a link out of the root");
        assert!(check(&root.join("team-a/mnist/../../../secret"), &everyone).is_err());
        assert!(check(&outside, &outside.display().to_string()).is_err(), "granted, but not on this node's roots");
        assert!(check_idx_dataset(&spec(&root.join("team-a/mnist")), None, &roots).is_err(), "no grant named");
        assert!(check_idx_dataset(&spec(&root.join("team-a/mnist")), Some(&team_a), &[]).is_err(), "no roots here");
        assert!(check_idx_dataset(&DatasetRef::FashionMnist, None, &[]).is_ok());
    }

    #[test]
    fn a_rank_may_write_files_four_times_its_models_size_and_at_least_two_gibibytes() {
        assert_eq!(max_file_mib(0), 2048);
        assert_eq!(max_file_mib(1 << 30), 4096);
    }
}
