//! Relays one rank's output to the server: its metric lines in batches, its stderr (logged, and the last
//! lines kept for a failure report), and (rank 0) each new checkpoint, packed as a tar archive.

use std::collections::VecDeque;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use ringtrain_protocol::Work;
use serde_json::{Map, Value};

use crate::client::CheckpointArchive;
use crate::rank::{AgentContext, TICK};

/// Lines of a rank's stderr kept for its failure report.
const STDERR_TAIL: usize = 30;
/// Metric lines kept while the server cannot be reached; older ones are dropped beyond this.
const MAX_BUFFERED: usize = 200_000;
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

/// Relays one rank's output: metric lines in batches, its stderr's last lines, and (rank 0) each new
/// checkpoint.
pub(crate) struct Relay<'a> {
    ctx: &'a AgentContext,
    job: ringtrain_core::JobId,
    attempt: i32,
    pub is_root: bool,
    out: PathBuf,
    scratch: PathBuf,
    pending: Vec<Map<String, Value>>,
    pub stderr_tail: VecDeque<String>,
    uploaded: Option<String>,
    pub last_flush: std::time::Instant,
}

impl<'a> Relay<'a> {
    pub fn new(ctx: &'a AgentContext, work: &Work, out: PathBuf, scratch: PathBuf) -> Self {
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

    pub fn metric_line(&mut self, line: &str) {
        if let Ok(Value::Object(report)) = serde_json::from_str(line) {
            if self.pending.len() >= MAX_BUFFERED {
                self.pending.remove(0);
            }
            self.pending.push(report);
        }
    }

    pub fn stderr_line(&mut self, line: String) {
        // The rank's own log lines, inside the rank's span.
        tracing::info!(target: "ringtrain::rank_output", "{line}");
        if self.stderr_tail.len() == STDERR_TAIL {
            self.stderr_tail.pop_front();
        }
        self.stderr_tail.push_back(line);
    }

    pub async fn flush_metrics(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        self.last_flush = std::time::Instant::now();
        while !self.pending.is_empty() {
            let batch = batch_len(&self.pending);
            match self.ctx.client.report_metrics(self.job, self.attempt, &self.pending[..batch]).await {
                Ok(()) => {
                    self.pending.drain(..batch);
                }
                Err(err) if err.is_final() => {
                    tracing::warn!(error = %err, "metrics refused, dropped");
                    self.pending.drain(..batch);
                }
                // Unreachable: keep them for the next tick.
                Err(_) => return,
            }
        }
    }

    /// Uploads the newest checkpoint if it was not uploaded yet (or, `is_final`, uploads it again as the
    /// job's final weights).
    pub async fn upload_new_checkpoint(&mut self, is_final: bool) {
        if let Err(err) = self.try_upload(is_final).await {
            tracing::warn!(error = format!("{err:#}"), "checkpoint upload failed (will retry)");
        }
    }

    pub async fn try_upload(&mut self, is_final: bool) -> Result<()> {
        let root = self.out.join("checkpoints");
        let Ok(name) = tokio::fs::read_to_string(root.join(ringtrain_protocol::rank::LATEST)).await else {
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

#[cfg(test)]
mod tests {
    use super::*;

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
