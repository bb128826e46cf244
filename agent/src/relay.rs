//! Relays one rank's output to the server: its metric lines in batches, its other lines (stderr, and stdout
//! lines that are not metric reports: logged here, sent in batches, the last stderr lines kept for a
//! failure report), and (rank 0) each new checkpoint, packed as a tar archive and streamed from disk. The
//! network work runs in a task of its own, so the rank's output is always drained.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use ringtrain_client::CallError;
use ringtrain_protocol::rank::{checkpoint_files, CheckpointProgress};
use ringtrain_protocol::Work;
use serde_json::{Map, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::client::CheckpointArchive;
use crate::rank::{AgentContext, TICK};
use crate::report::OUTCOME_TRIES;
use crate::system_metrics;

/// Lines of a rank's stderr kept for its failure report.
const STDERR_TAIL: usize = 30;
/// Metric lines kept while the server cannot be reached; older ones are dropped beyond this.
const MAX_BUFFERED: usize = 200_000;
/// Output lines kept while the server cannot be reached (the newest are dropped beyond this: the start of
/// a stack trace matters more than its end).
const MAX_BUFFERED_LOG_LINES: usize = 20_000;
/// Output lines per batch.
const LOG_BATCH_LINES: usize = 1_000;
/// A metrics batch stays under half the server's 1 MiB body limit (a line is ~200 bytes, but a report may
/// carry more fields), so no batch is ever refused for its size.
const MAX_BATCH_BYTES: usize = 512 << 10;
const MAX_BATCH_LINES: usize = 2_000;

/// How many of `pending`'s first lines make a batch within [`MAX_BATCH_BYTES`] (at least one).
fn batch_len(pending: &[Map<String, Value>]) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for report in pending.iter().take(MAX_BATCH_LINES) {
        bytes += serde_json::to_string(report).map_or(0, |s| s.len() + 1);
        if n > 0 && bytes > MAX_BATCH_BYTES {
            break;
        }
        n += 1;
    }
    n.max(1).min(pending.len())
}

/// The metric report a line of a rank's stdout is, or None for an output line. A `system` report is the
/// agent's own measure of the rank ([`system_metrics`]): one the rank makes up is only output.
fn rank_report(line: &str) -> Option<Map<String, Value>> {
    match serde_json::from_str(line) {
        Ok(Value::Object(report)) if report.get("kind").and_then(Value::as_str) != Some(system_metrics::KIND) => {
            Some(report)
        }
        _ => None,
    }
}

/// Relays one rank's output. The supervisor only hands lines over (never waiting on the network: a rank
/// whose pipe is not drained blocks, and with it every rank in the all-reduce); a background task sends the
/// metric batches every tick and (rank 0) uploads each new checkpoint, backing off after a failed upload.
/// [`Relay::finish`] stops that task and sends what is left.
pub(crate) struct Relay {
    shared: Arc<Shared>,
    pub stderr_tail: VecDeque<String>,
    /// The newest iteration the rank reported (its system samples say how far it had got).
    pub newest_iteration: Option<i64>,
    /// Wakes the background task: the first line after a quiet spell goes out at once.
    wake: Arc<Notify>,
    last_line: std::time::Instant,
    background: Option<JoinHandle<()>>,
}

/// What the supervisor and the background task share.
struct Shared {
    ctx: Arc<AgentContext>,
    job: ringtrain_core::JobId,
    attempt: i32,
    out: PathBuf,
    scratch: PathBuf,
    /// Metric lines not yet taken by the server, each with a sequence number: a batch in flight is removed
    /// only after the server took it, by number, so lines dropped meanwhile (the buffer was full) cannot
    /// shift what is removed.
    pending: Mutex<Pending>,
    /// Output lines not yet taken by the server.
    logs: Mutex<LogPending>,
    rank: i32,
    /// The newest checkpoint uploaded.
    uploaded: Mutex<Option<String>>,
}

#[derive(Default)]
struct Pending {
    lines: VecDeque<(u64, Map<String, Value>)>,
    next: u64,
}

#[derive(Default)]
struct LogPending {
    lines: VecDeque<ringtrain_protocol::LogLine>,
    /// The next line's number in the rank's output (dropped lines use one up too).
    next: i64,
}

/// The longest wait between two tries of a failed checkpoint upload.
const MAX_UPLOAD_BACKOFF: Duration = Duration::from_secs(60);

impl Relay {
    pub fn new(ctx: &Arc<AgentContext>, work: &Work, out: PathBuf, scratch: PathBuf) -> Self {
        let is_root = work.assignment.rank == 0;
        let shared = Arc::new(Shared {
            ctx: ctx.clone(),
            job: work.assignment.job_id,
            attempt: work.assignment.attempt,
            out,
            scratch,
            pending: Mutex::new(Pending::default()),
            logs: Mutex::new(LogPending::default()),
            rank: work.assignment.rank,
            uploaded: Mutex::new(None),
        });
        let wake = Arc::new(Notify::new());
        let background =
            tokio::spawn(background(shared.clone(), wake.clone(), is_root).instrument(tracing::Span::current()));
        Relay {
            shared,
            stderr_tail: VecDeque::new(),
            newest_iteration: None,
            wake,
            // long ago: the first line goes out at once
            last_line: std::time::Instant::now().checked_sub(TICK).unwrap_or_else(std::time::Instant::now),
            background: Some(background),
        }
    }

    /// A line of the rank's stdout: a metric report, or (anything else) an output line.
    pub fn metric_line(&mut self, line: &str) {
        match rank_report(line) {
            Some(report) => {
                if report.get("kind").and_then(Value::as_str) == Some("iteration") {
                    self.newest_iteration = report.get("iteration").and_then(Value::as_i64).or(self.newest_iteration);
                }
                self.shared.push(report)
            }
            None => {
                tracing::info!(target: "ringtrain::rank_output", "{line}");
                self.shared.push_log("stdout", line);
            }
        }
        if self.last_line.elapsed() >= TICK {
            self.wake.notify_one();
        }
        self.last_line = std::time::Instant::now();
    }

    /// The rank whose output this is.
    pub fn rank(&self) -> i32 {
        self.shared.rank
    }

    /// A report the agent made of the rank (its [`system_metrics`]), sent with the rank's own.
    pub fn agent_report(&mut self, mut report: Map<String, Value>) {
        if let Some(iteration) = self.newest_iteration {
            report.insert("iteration_reached".into(), iteration.into());
        }
        self.shared.push(report);
    }

    pub fn stderr_line(&mut self, line: String) {
        // The rank's own log lines, inside the rank's span.
        tracing::info!(target: "ringtrain::rank_output", "{line}");
        self.shared.push_log("stderr", &line);
        if self.stderr_tail.len() == STDERR_TAIL {
            self.stderr_tail.pop_front();
        }
        self.stderr_tail.push_back(line);
    }

    /// Stops the background task (what it had in flight is sent again below: the server keys metrics and
    /// checkpoints, so a repeat replaces) and sends the metric lines left, through a server outage (every
    /// 2 s, as long as an outcome report would wait): the lines live only in this relay, and the rank's
    /// outcome is reported after them, so a job is never seen ended with its curves still on the way.
    pub async fn finish(&mut self) {
        if let Some(task) = self.background.take() {
            task.abort();
            let _ = task.await;
        }
        for _ in 0..OUTCOME_TRIES {
            // output lines first: a failed job's view shows them
            if self.shared.flush_logs().await & self.shared.flush_metrics().await {
                return;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        tracing::warn!(lines = self.shared.pending().lines.len(), "the server took no metrics for 2 minutes: dropped");
    }

    /// Uploads the newest checkpoint if it was not uploaded yet (or, `is_final`, uploads it again as the
    /// job's final weights). Call after [`Relay::finish`].
    pub async fn try_upload(&self, is_final: bool) -> Result<()> {
        self.shared.try_upload(is_final).await
    }

    /// [`Relay::try_upload`], logging a failure. True when nothing is left to send: the checkpoint got
    /// there (or there was none), or the server refused it for good.
    pub async fn upload_new_checkpoint(&self, is_final: bool) -> bool {
        self.upload_retrying(is_final, 1).await
    }

    /// [`Relay::try_upload`] through a server outage: up to `tries` times, 2 s apart, unless the server
    /// refuses it (a 4xx, e.g. the team's storage quota). For what must not be lost: the checkpoint the
    /// next placement resumes from, and the job's final weights. True when nothing is left to send (as
    /// [`Relay::upload_new_checkpoint`]); false when the server could not be reached.
    pub async fn upload_retrying(&self, is_final: bool, tries: u32) -> bool {
        for attempt in 1..=tries.max(1) {
            match self.try_upload(is_final).await {
                Ok(()) => return true,
                Err(err) => {
                    let refused = err.downcast_ref::<CallError>().is_some_and(CallError::is_final);
                    if refused || attempt >= tries {
                        tracing::warn!(error = format!("{err:#}"), attempt, "checkpoint upload failed");
                        return refused;
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        false
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(task) = self.background.take() {
            task.abort();
        }
    }
}

/// Every tick (or when woken): sends the metric lines, and (rank 0) uploads a new checkpoint, waiting
/// twice as long after each failed upload (up to a minute) instead of re-packing and re-sending it every
/// tick.
async fn background(shared: Arc<Shared>, wake: Arc<Notify>, is_root: bool) {
    let mut backoff = TICK;
    let mut next_upload = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(TICK) => {}
            () = wake.notified() => {}
        }
        shared.flush_metrics().await;
        shared.flush_logs().await;
        if is_root && tokio::time::Instant::now() >= next_upload {
            match shared.try_upload(false).await {
                Ok(()) => backoff = TICK,
                Err(err) => {
                    backoff = (backoff * 2).min(MAX_UPLOAD_BACKOFF);
                    tracing::warn!(
                        error = format!("{err:#}"),
                        retry_in_s = backoff.as_secs_f64(),
                        "checkpoint upload failed"
                    );
                    next_upload = tokio::time::Instant::now() + backoff;
                }
            }
        }
    }
}

impl Shared {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, report: Map<String, Value>) {
        let mut pending = self.pending();
        if pending.lines.len() >= MAX_BUFFERED {
            pending.lines.pop_front();
        }
        let seq = pending.next;
        pending.next += 1;
        pending.lines.push_back((seq, report));
    }

    fn logs(&self) -> std::sync::MutexGuard<'_, LogPending> {
        self.logs.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push_log(&self, stream: &str, line: &str) {
        let mut logs = self.logs();
        let seq = logs.next;
        logs.next += 1;
        if logs.lines.len() >= MAX_BUFFERED_LOG_LINES {
            return;
        }
        let mut text = line.to_string();
        if text.len() > ringtrain_protocol::MAX_LOG_LINE_BYTES {
            let mut end = ringtrain_protocol::MAX_LOG_LINE_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        let at = chrono::Utc::now();
        logs.lines.push_back(ringtrain_protocol::LogLine { seq, at, stream: stream.to_string(), text });
    }

    /// Sends the pending output lines in batches, like [`Shared::flush_metrics`]. True when none is left.
    async fn flush_logs(&self) -> bool {
        loop {
            let batch: Vec<ringtrain_protocol::LogLine> = {
                let logs = self.logs();
                logs.lines.iter().take(LOG_BATCH_LINES).cloned().collect()
            };
            let Some(last) = batch.last().map(|l| l.seq) else { return true };
            let body = ringtrain_protocol::LogBatch { attempt: self.attempt, rank: self.rank, lines: batch };
            match self.ctx.client.report_logs(self.job, &body).await {
                Ok(()) => {}
                Err(err) if err.is_final() => tracing::warn!(error = %err, "output lines refused, dropped"),
                Err(_) => return false,
            }
            self.logs().lines.retain(|l| l.seq > last);
        }
    }

    /// Sends the pending lines in batches; stops at the first batch the server could not take (kept for
    /// the next tick). A batch the server refuses (4xx other than 429) is dropped. True when none is left.
    async fn flush_metrics(&self) -> bool {
        loop {
            let (batch, last) = {
                let mut pending = self.pending();
                let lines = pending.lines.make_contiguous();
                let reports: Vec<Map<String, Value>> = lines.iter().map(|(_, r)| r.clone()).collect();
                let n = batch_len(&reports);
                let Some(last) = lines.get(n.wrapping_sub(1)).map(|(seq, _)| *seq) else { return true };
                (reports.into_iter().take(n).collect::<Vec<_>>(), last)
            };
            match self.ctx.client.report_metrics(self.job, self.attempt, &batch).await {
                Ok(()) => {}
                Err(err) if err.is_final() => tracing::warn!(error = %err, "metrics refused, dropped"),
                // Unreachable: keep them for the next tick.
                Err(_) => return false,
            }
            self.pending().lines.retain(|(seq, _)| *seq > last);
        }
    }

    async fn try_upload(&self, is_final: bool) -> Result<()> {
        let root = self.out.join("checkpoints");
        let Ok(name) = tokio::fs::read_to_string(root.join(ringtrain_protocol::rank::LATEST)).await else {
            return Ok(());
        };
        let name = name.trim().to_string();
        // `latest` is written by the rank, which runs tenant code: only a trainer's folder name is taken
        // (never a path out of its folder)
        if !crate::files::is_checkpoint_folder(&name) {
            anyhow::bail!("the rank's latest checkpoint is named {name:?}, not a checkpoint folder: not uploaded");
        }
        let uploaded = self.uploaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        if !is_final && uploaded.as_deref() == Some(name.as_str()) {
            return Ok(());
        }
        let dir = root.join(&name);
        let state = tokio::fs::read(dir.join(checkpoint_files::STATE)).await?;
        let progress: CheckpointProgress = serde_json::from_slice(&state)
            .with_context(|| format!("the rank's {name}/{} says not where training stood", checkpoint_files::STATE))?;
        let (epoch, iteration) = (progress.epochs_done, progress.next_iteration);
        let archive_path = self.scratch.join(format!("{name}.tar"));
        let (source, target, folder) = (dir.clone(), archive_path.clone(), name.clone());
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut builder = tar::Builder::new(std::fs::File::create(&target)?);
            // a link the rank made (it cannot, confined; defence in depth) goes in as a link, never as the
            // file it points at
            builder.follow_symlinks(false);
            builder.append_dir_all(&folder, &source)?;
            builder.into_inner()?.sync_all()?;
            Ok(())
        })
        .await??;
        let archive = CheckpointArchive { name: name.clone(), attempt: self.attempt, epoch, iteration, is_final };
        // streamed from the file, never read into memory
        let sent = self.ctx.client.upload_checkpoint(self.job, &archive, &archive_path).await;
        let _ = tokio::fs::remove_file(&archive_path).await;
        match sent {
            Ok(()) => {}
            // kept as the CallError under the context: `upload_retrying` gives up on a refusal
            Err(err) if err.is_final() => {
                return Err(anyhow::Error::new(err).context(format!("the server refused checkpoint {name}")))
            }
            Err(err) => return Err(err.into()),
        }
        *self.uploaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(name);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_cannot_pass_off_a_line_as_the_agents_sample_of_it() {
        assert!(rank_report(r#"{"kind": "iteration", "rank": 0, "iteration": 3, "loss": 1.0}"#).is_some());
        assert!(rank_report(r#"{"kind": "system", "rank": 0, "iteration": 3, "resident_bytes": 1}"#).is_none());
        assert!(rank_report("rank 0 of 2: resnet20").is_none());
    }

    #[test]
    fn batches_stay_under_the_byte_budget() {
        let line = |i: usize| -> Map<String, Value> {
            let Value::Object(map) = serde_json::json!({"kind": "iteration", "rank": 0, "epoch": 3, "iteration": i,
                "lr": 0.123456789, "loss": 0.987654321, "rank_loss": 0.87654321, "samples_per_s": 12345.678,
                "allreduce_s": 0.00123456, "note": "x".repeat(300)})
            else {
                unreachable!()
            };
            map
        };
        let pending: Vec<_> = (0..20_000).map(line).collect();
        let n = batch_len(&pending);
        let bytes: usize = pending[..n].iter().map(|r| serde_json::to_string(r).unwrap().len() + 1).sum();
        assert!(n > 100 && bytes <= MAX_BATCH_BYTES, "{n} lines, {bytes} bytes");
        assert_eq!(batch_len(&pending[..3]), 3);
        assert_eq!(batch_len(&[]), 0);
    }
}
