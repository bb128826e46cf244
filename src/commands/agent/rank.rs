//! One rank of one placement, from start to report: prepare its files (spec, dataset, the checkpoint to
//! resume from), start `ringtrain train --rank ...`, relay its metrics in batches and (rank 0) its
//! checkpoints, and report how it ended. Stopped through `stop` (a cancel, a preemption, a lost lease).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use super::client::{CheckpointArchive, Client, Work};
use crate::commands::train::{EXIT_JOB_ERROR, EXIT_STOPPED};

/// What every rank of this agent shares.
#[derive(Debug)]
pub struct AgentContext {
    pub client: Client,
    pub node_name: String,
    /// Where this node's ranks listen (rank 0's rendezvous host).
    pub address: std::net::IpAddr,
    pub work_dir: PathBuf,
    /// The `ringtrain` executable the ranks run.
    pub exe: PathBuf,
    /// libtorch threads per rank.
    pub threads: Option<i32>,
}

/// Lines of a rank's stderr kept for its failure report.
const STDERR_TAIL: usize = 30;
/// Metric lines kept while the server cannot be reached; older ones are dropped beyond this.
const MAX_BUFFERED: usize = 200_000;
/// How often metrics are sent and rank 0's checkpoints looked for: often enough that the API trails the
/// ranks by a fraction of a second, at a few small requests per second per rank.
const TICK: Duration = Duration::from_millis(250);

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
}

/// Runs the rank to its end and reports it; returns the state its assignment ended in (`done`, `failed` or
/// `cancelled`), so the agent can report it again if the server did not get it. Never fails: every failure
/// becomes a report.
pub async fn run(ctx: Arc<AgentContext>, work: Work, stop: watch::Receiver<Option<StopRequest>>) -> &'static str {
    let label = label(&work);
    let assignment = work.assignment.clone();
    match run_inner(&ctx, &work, stop).await {
        Ok(ended) => ended,
        Err(err) => {
            // Preparing or starting the rank failed (a download, a file): the placement cannot go on here.
            eprintln!("{label}: {err:#}");
            let error = format!("rank {} on node {} could not start: {err:#}", assignment.rank, ctx.node_name);
            report_failure(&ctx, &work, &error, true).await;
            end_assignment(&ctx, assignment.id, "failed").await;
            "failed"
        }
    }
}

fn label(work: &Work) -> String {
    let job = work.assignment.job_id.to_string();
    format!("job {} attempt {} rank {}", &job[..8], work.assignment.attempt, work.assignment.rank)
}

async fn run_inner(
    ctx: &AgentContext,
    work: &Work,
    mut stop: watch::Receiver<Option<StopRequest>>,
) -> Result<&'static str> {
    let a = &work.assignment;
    let label = label(work);
    let placement_dir = ctx.work_dir.join("jobs").join(a.job_id.to_string()).join(format!("attempt-{}", a.attempt));
    let rank_dir = placement_dir.join(format!("rank-{}", a.rank));
    let out = rank_dir.join("out");
    tokio::fs::create_dir_all(&out).await.with_context(|| format!("cannot create {}", out.display()))?;
    let spec_path = rank_dir.join("spec.json");
    tokio::fs::write(&spec_path, serde_json::to_vec_pretty(&work.spec)?).await?;

    let mut command = Command::new(&ctx.exe);
    let stop_file = rank_dir.join("stop");
    let _ = tokio::fs::remove_file(&stop_file).await;
    command.arg("train").arg("--spec").arg(&spec_path).arg("--out").arg(&out).arg("--exit-with-parent");
    command.arg("--stop-file").arg(&stop_file);
    if let Some(file) = dataset_file(ctx, work).await? {
        command.arg("--dataset-file").arg(file);
    }
    if let Some(threads) = ctx.threads {
        command.args(["--threads", &threads.to_string()]);
    }
    let rendezvous = if a.rank == 0 {
        if let Some(checkpoint) = &work.resume {
            let resume_dir = fetch_checkpoint(ctx, work, checkpoint, &placement_dir).await?;
            command.arg("--resume").arg(resume_dir);
        }
        // A port free now on this node; rank 0 listens on it moments later.
        let port = std::net::TcpListener::bind((ctx.address, 0))?.local_addr()?.port();
        let endpoint = std::net::SocketAddr::new(ctx.address, port).to_string();
        ctx.client.report_endpoint(a.id, &endpoint).await?;
        endpoint
    } else {
        work.rendezvous.clone().context("rank 0's address is not known yet")?
    };
    command.args(["--rank", &a.rank.to_string(), "--world", &a.world_size.to_string(), "--rendezvous", &rendezvous]);
    if work.spec.get("device").and_then(Value::as_str) == Some("gpu") {
        // The rank sees only its own GPU, as CUDA device 0.
        command.env("CUDA_VISIBLE_DEVICES", work.device_index.to_string());
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);

    if stop.borrow().is_some() {
        // Stopped before it started.
        ctx.client.set_assignment_state(a.id, "delivered", "cancelled").await?;
        return Ok("cancelled");
    }
    let mut child = command.spawn().with_context(|| format!("cannot start {}", ctx.exe.display()))?;
    eprintln!("{label}: started (pid {})", child.id().unwrap_or(0));
    ctx.client.set_assignment_state(a.id, "delivered", "running").await?;
    if a.rank == 0 {
        let mut tries = 0;
        while let Err(err) = ctx.client.job_running(a.job_id, a.attempt).await {
            tries += 1;
            if err.is_final() || tries >= OUTCOME_TRIES {
                eprintln!("{label}: cannot mark the job running: {err}");
                break;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    let mut relay = Relay::new(ctx, work, out.clone(), placement_dir.clone());
    let ending = supervise(&mut child, &mut stop, &stop_file, &mut relay, &label).await?;
    relay.flush_metrics().await;
    let ended = match ending {
        Ending::Stopped(why) => {
            eprintln!("{label}: stopped ({why})");
            "cancelled"
        }
        Ending::Exited(status) if status.code() == Some(i32::from(EXIT_STOPPED)) => {
            // Preempted: every rank stopped at the same iteration and rank 0 wrote a checkpoint of it, which
            // the job's next placement resumes from.
            if a.rank == 0 {
                // The next placement resumes from this checkpoint: worth a few tries.
                for _ in 0..10 {
                    if relay.try_upload(false).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
            eprintln!("{label}: stopped after a checkpoint (preempted)");
            "cancelled"
        }
        Ending::Exited(status) if status.success() => {
            if a.rank == 0 {
                relay.upload_new_checkpoint(false).await;
                relay.upload_new_checkpoint(true).await;
                let result: Value = match tokio::fs::read(out.join("result.json")).await {
                    Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    Err(_) => Value::Null,
                };
                match ctx
                    .client
                    .report_result(a.job_id, a.attempt, json!({"outcome": "succeeded", "result": result}))
                    .await
                {
                    Ok(_) => eprintln!("{label}: succeeded"),
                    Err(err) => eprintln!("{label}: the result was not taken: {err}"),
                }
            }
            "done"
        }
        Ending::Exited(status) => {
            let retryable = status.code() != Some(i32::from(EXIT_JOB_ERROR));
            let tail: Vec<String> = relay.stderr_tail.iter().cloned().collect();
            let error = format!(
                "rank {} on node {} {}; its last stderr lines:\n{}",
                a.rank,
                ctx.node_name,
                describe(status),
                tail.join("\n")
            );
            eprintln!("{label}: failed: {}", describe(status));
            relay.upload_new_checkpoint(false).await;
            report_failure(ctx, work, &error, retryable).await;
            "failed"
        }
    };
    end_assignment(ctx, a.id, ended).await;
    Ok(ended)
}

/// Waits for the process to exit or to be stopped, relaying its output meanwhile.
async fn supervise(
    child: &mut Child,
    stop: &mut watch::Receiver<Option<StopRequest>>,
    stop_file: &Path,
    relay: &mut Relay<'_>,
    label: &str,
) -> Result<Ending> {
    let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?).lines();
    let mut stderr = BufReader::new(child.stderr.take().context("no stderr")?).lines();
    let (mut stdout_open, mut stderr_open) = (true, true);
    let mut tick = tokio::time::interval(TICK);
    // Set once the ranks were asked to checkpoint and stop: past it they are killed.
    let mut grace: Option<(tokio::time::Instant, String)> = None;
    let ending = loop {
        let deadline = grace.as_ref().map(|(at, _)| *at);
        tokio::select! {
            line = stdout.next_line(), if stdout_open => match line {
                Ok(Some(line)) => {
                    relay.metric_line(&line);
                    // After a quiet spell (the first line, say) a line goes out at once; a busy rank's lines
                    // are batched by the tick.
                    if relay.last_flush.elapsed() >= TICK {
                        relay.flush_metrics().await;
                    }
                }
                _ => stdout_open = false,
            },
            line = stderr.next_line(), if stderr_open => match line {
                Ok(Some(line)) => relay.stderr_line(label, line),
                _ => stderr_open = false,
            },
            _ = tick.tick() => {
                relay.flush_metrics().await;
                if relay.is_root {
                    relay.upload_new_checkpoint(false).await;
                }
            }
            status = child.wait() => break Ending::Exited(status?),
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
                        eprintln!("{label}: asked to checkpoint and stop ({})", request.why);
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
        relay.metric_line(&line);
    }
    while let Ok(Some(line)) = stderr.next_line().await {
        relay.stderr_line(label, line);
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

/// Reports the assignment ended (from `running`, or `delivered` if its rank never started); retried later,
/// from the poll, when the server cannot be reached now.
pub async fn end_assignment(ctx: &AgentContext, assignment: uuid::Uuid, to: &str) {
    let mut last = None;
    for from in ["running", "delivered"] {
        match ctx.client.set_assignment_state(assignment, from, to).await {
            Ok(()) => return,
            Err(err) => last = Some(err),
        }
    }
    if let Some(err) = last {
        eprintln!("assignment {assignment}: cannot report it {to} yet: {err}");
    }
}

/// Reports an attempt's outcome, retrying for a while when the server cannot be reached (or answers 5xx):
/// the assignment is reported ended only afterwards, so a lost report must not be given up early.
async fn report_outcome(
    ctx: &AgentContext,
    job: uuid::Uuid,
    attempt: i32,
    report: Value,
) -> Result<Value, super::client::CallError> {
    let mut tries = 0;
    loop {
        match ctx.client.report_result(job, attempt, report.clone()).await {
            Err(err) if !err.is_final() && tries < OUTCOME_TRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            outcome => return outcome,
        }
    }
}

/// Tries of an outcome report, 2 s apart: rides out a server restart.
const OUTCOME_TRIES: u32 = 60;

async fn report_failure(ctx: &AgentContext, work: &Work, error: &str, retryable: bool) {
    let a = &work.assignment;
    let report = json!({"outcome": "failed", "error": error, "retryable": retryable});
    match report_outcome(ctx, a.job_id, a.attempt, report).await {
        Ok(answer) => eprintln!("{}: reported failed; the job is now {}", label(work), answer["state"]),
        // Another rank's agent reported first, or the placement is already over.
        Err(err) if err.is_final() => {}
        Err(err) => eprintln!("{}: cannot report the failure: {err}", label(work)),
    }
}

/// The file of an uploaded dataset, downloaded once per node.
async fn dataset_file(ctx: &AgentContext, work: &Work) -> Result<Option<PathBuf>> {
    let Some(dataset) = work.spec.get("dataset").and_then(Value::as_str) else { return Ok(None) };
    let Ok(id) = dataset.parse::<uuid::Uuid>() else { return Ok(None) };
    let dir = ctx.work_dir.join("datasets");
    tokio::fs::create_dir_all(&dir).await?;
    let path = dir.join(format!("{id}.safetensors"));
    if !path.exists() {
        ctx.client.download(&format!("/v1/agent/datasets/{id}"), &path, None).await?;
    }
    Ok(Some(path))
}

/// Downloads and unpacks the checkpoint a resumed placement starts from; returns the folder for
/// `--resume` (it holds `epoch-NNNN/` and `latest`).
async fn fetch_checkpoint(
    ctx: &AgentContext,
    work: &Work,
    checkpoint: &super::client::Checkpoint,
    placement_dir: &Path,
) -> Result<PathBuf> {
    let archive = placement_dir.join("resume.tar");
    let path = format!("/v1/agent/jobs/{}/checkpoints/{}/archive", work.assignment.job_id, checkpoint.id);
    ctx.client.download(&path, &archive, Some(&checkpoint.sha256)).await?;
    let target = placement_dir.join("resume");
    let unpacked = target.clone();
    let name = tokio::task::spawn_blocking(move || -> Result<String> {
        if unpacked.exists() {
            std::fs::remove_dir_all(&unpacked)?;
        }
        std::fs::create_dir_all(&unpacked)?;
        let mut tar = tar::Archive::new(std::fs::File::open(&archive)?);
        tar.unpack(&unpacked).context("cannot unpack the checkpoint archive")?;
        let name = std::fs::read_dir(&unpacked)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("epoch-"))
            .context("the checkpoint archive holds no epoch-NNNN folder")?;
        std::fs::write(unpacked.join(ringtrain_worker::checkpoint::LATEST), &name)?;
        std::fs::remove_file(&archive)?;
        Ok(name)
    })
    .await??;
    eprintln!("{}: resuming from {name} (epoch {})", label(work), checkpoint.epoch);
    Ok(target)
}

/// Relays one rank's output: metric lines in batches, its stderr's last lines, and (rank 0) each new
/// checkpoint.
struct Relay<'a> {
    ctx: &'a AgentContext,
    job: uuid::Uuid,
    attempt: i32,
    is_root: bool,
    out: PathBuf,
    scratch: PathBuf,
    pending: Vec<Map<String, Value>>,
    stderr_tail: VecDeque<String>,
    uploaded: Option<String>,
    last_flush: std::time::Instant,
}

impl<'a> Relay<'a> {
    fn new(ctx: &'a AgentContext, work: &Work, out: PathBuf, scratch: PathBuf) -> Self {
        Relay {
            ctx,
            job: work.assignment.job_id,
            attempt: work.assignment.attempt,
            is_root: work.assignment.rank == 0,
            out,
            scratch,
            pending: Vec::new(),
            stderr_tail: VecDeque::new(),
            uploaded: None,
            // Long ago: the first line goes out at once.
            last_flush: std::time::Instant::now().checked_sub(TICK).unwrap_or_else(std::time::Instant::now),
        }
    }

    fn metric_line(&mut self, line: &str) {
        if let Ok(Value::Object(report)) = serde_json::from_str(line) {
            if self.pending.len() >= MAX_BUFFERED {
                self.pending.remove(0);
            }
            self.pending.push(report);
        }
    }

    fn stderr_line(&mut self, label: &str, line: String) {
        eprintln!("{label}| {line}");
        if self.stderr_tail.len() == STDERR_TAIL {
            self.stderr_tail.pop_front();
        }
        self.stderr_tail.push_back(line);
    }

    async fn flush_metrics(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        self.last_flush = std::time::Instant::now();
        while !self.pending.is_empty() {
            let batch = self.pending.len().min(5_000);
            match self.ctx.client.report_metrics(self.job, self.attempt, &self.pending[..batch]).await {
                Ok(()) => {
                    self.pending.drain(..batch);
                }
                Err(err) if err.is_final() => {
                    eprintln!("job {}: metrics refused, dropped: {err}", self.job);
                    self.pending.drain(..batch);
                }
                // Unreachable: keep them for the next tick.
                Err(_) => return,
            }
        }
    }

    /// Uploads the newest checkpoint if it was not uploaded yet (or, `is_final`, uploads it again as the
    /// job's final weights).
    async fn upload_new_checkpoint(&mut self, is_final: bool) {
        if let Err(err) = self.try_upload(is_final).await {
            eprintln!("job {}: checkpoint upload failed (will retry): {err:#}", self.job);
        }
    }

    async fn try_upload(&mut self, is_final: bool) -> Result<()> {
        let root = self.out.join("checkpoints");
        let Ok(name) = tokio::fs::read_to_string(root.join(ringtrain_worker::checkpoint::LATEST)).await else {
            return Ok(());
        };
        let name = name.trim().to_string();
        if !is_final && self.uploaded.as_deref() == Some(name.as_str()) {
            return Ok(());
        }
        let dir = root.join(&name);
        let state: Value = serde_json::from_slice(&tokio::fs::read(dir.join("state.json")).await?)?;
        let epoch = state["epochs_done"].as_u64().context("state.json has no epochs_done")?;
        let iteration = state["next_iteration"].as_u64().context("state.json has no next_iteration")?;
        let archive_path = self.scratch.join(format!("{name}.tar"));
        let (source, target, folder) = (dir.clone(), archive_path.clone(), name.clone());
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut builder = tar::Builder::new(std::fs::File::create(&target)?);
            builder.append_dir_all(&folder, &source)?;
            builder.into_inner()?.sync_all()?;
            Ok(())
        })
        .await??;
        let archive = CheckpointArchive {
            name: name.clone(),
            attempt: self.attempt,
            epoch,
            iteration,
            is_final,
            bytes: tokio::fs::read(&archive_path).await?.into(),
        };
        let _ = tokio::fs::remove_file(&archive_path).await;
        match self.ctx.client.upload_checkpoint(self.job, &archive).await {
            Ok(()) => {}
            Err(err) if err.is_final() => bail!("the server refused checkpoint {name}: {err}"),
            Err(err) => return Err(err.into()),
        }
        self.uploaded = Some(name);
        Ok(())
    }
}
