//! A Slurm pool: devices Slurm owns, asked for per job. The scheduler keeps deciding what runs
//! (quotas, fair share, its order); when the policy says a queued job of the pool's device kind waits
//! because the pool lacks devices, this loop submits one Slurm job sized for it whose steps run the thin
//! agent (`srun ringtrain agent --slurm`, one per node, each with an agent token of its own), and the
//! agents register with this server like any other: the next pass places the job on them (the policy
//! holds free devices for the first job in line, so new ones go to the job they were asked for), the
//! ranks run under the same sandbox and report exactly as elsewhere, and the agents leave once idle, which
//! ends the allocation.
//!
//! Slurm's jobs carry the ringtrain job's id in their comment (`ringtrain:JOB`), so the loop needs no
//! state of its own to find them again: each pass reads `squeue`, cancels a pending Slurm job whose
//! ringtrain job no longer waits (it ended, was cancelled, or was placed elsewhere), fails a ringtrain job
//! Slurm refuses or will never start as asked (in Slurm's words), and submits for the jobs that wait
//! with none. While a job's Slurm job is pending, its view says so with Slurm's reason, and its estimated
//! start is Slurm's (`squeue --start`): the job waits for Slurm's nodes, not for ringtrain's jobs to end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{JobId, JobState, TokenId};
use ringtrain_scheduler::{Verdict, WaitReason};
pub use ringtrain_slurm::Slurm;
use ringtrain_slurm::{BatchJob, JobState as SlurmState, SlurmError, SlurmJob};
use ringtrain_store::{NewToken, Role, Transition};
use serde_json::{json, Value};

use crate::queue::duration_words;
use crate::routes::jobs::JobView;
use crate::state::AppState;
use ringtrain_views::jobs::{EstimatedStart, PendingReason};

/// How often the loop looks.
const PASS_EVERY: Duration = Duration::from_secs(3);

/// What marks a Slurm job as a ringtrain job's (its `--comment`, followed by the job's id).
pub const COMMENT_PREFIX: &str = "ringtrain:";

/// What the operator says of the pool (`ringtrain serve --slurm-partition ...`).
#[derive(Debug, Clone)]
pub struct SlurmPoolConfig {
    pub slurm: Slurm,
    /// The partition (or comma-separated partitions) Slurm jobs go to.
    pub partition: String,
    /// The account they are charged to (None: the submitting user's default).
    pub account: Option<String>,
    /// The kind of device the pool offers.
    pub kind: DeviceKind,
    /// Devices a job takes on each node: GPUs (`--gres=gpu:N`) or CPU slots (`--cpus-per-task=N`).
    pub devices_per_node: u32,
    /// The most nodes one Slurm job may ask for (a larger ringtrain job is not sent to Slurm).
    pub max_nodes: u32,
    pub time_limit_minutes: u32,
    /// Seconds before the time limit at which the agents are signalled (`--signal=USR1@N`).
    pub grace_seconds: u32,
    /// Slurm jobs of this server pending at once, at most.
    pub max_pending: usize,
    /// The `ringtrain` program as the nodes see it.
    pub agent_command: String,
    /// More arguments for the agents (e.g. `--idx-root`, `--cache-dir`).
    pub agent_args: Vec<String>,
    /// The server's URL as the nodes reach it.
    pub server_url: String,
    /// A folder the nodes see too: each Slurm job's token file and Slurm's output.
    pub dir: PathBuf,
}

/// The pool: its settings and what the loop last learned from Slurm.
#[derive(Debug)]
pub struct SlurmPool {
    pub config: SlurmPoolConfig,
    /// The pending Slurm job of each ringtrain job that has one, as `squeue` last said.
    pending: Mutex<HashMap<JobId, SlurmJob>>,
    /// The agent tokens and token file of each Slurm job submitted by this server, until it is over.
    issued: Mutex<HashMap<u64, (Vec<TokenId>, PathBuf)>>,
}

/// Nodes of `devices_per_node` that hold `devices` in whole groups of `node_group`; u32::MAX when a node
/// cannot hold one group.
fn nodes_for(devices: u32, node_group: u32, devices_per_node: u32) -> u32 {
    let group = node_group.max(1);
    match devices_per_node / group {
        0 => u32::MAX,
        groups_per_node => (devices / group).div_ceil(groups_per_node),
    }
}

/// Why a queued job may be given Slurm nodes: the policy says the pool lacks devices for it (not that its
/// team is at its guarantee, or that it waits behind the first job in line).
fn lacks_devices(reason: &WaitReason) -> bool {
    matches!(
        reason,
        WaitReason::WaitingForDevices { .. }
            | WaitReason::HeadOfLine { .. }
            | WaitReason::TooLarge { .. }
            | WaitReason::NoDevicesOfKind { .. }
            | WaitReason::WorkerLargerThanNodes { .. }
            | WaitReason::WaitingForNodeRoom { .. }
    )
}

impl SlurmPool {
    pub fn new(config: SlurmPoolConfig) -> SlurmPool {
        SlurmPool { config, pending: Mutex::default(), issued: Mutex::default() }
    }

    /// What a queued job's view adds to its pending reason while its Slurm job is pending: Slurm's job id,
    /// reason and expected start.
    pub fn waiting(&self, job: JobId) -> Option<Value> {
        let pending = self.pending.lock().ok()?;
        let slurm = pending.get(&job)?;
        Some(json!({
            "job": slurm.id,
            "partition": slurm.partition,
            "reason": slurm.reason,
            "expected_start": slurm.expected_start,
            "message": slurm.waiting_reason(),
        }))
    }

    /// The Slurm job a view names: adds `slurm` to `reason` (a pending reason's JSON) and Slurm's words to
    /// its message.
    pub fn annotate(&self, job: JobId, reason: &mut PendingReason) {
        let Some(slurm) = self.waiting(job) else { return };
        if let Some(said) = slurm["message"].as_str() {
            reason.message.push_str(&format!("; {said}"));
        }
        reason.details.insert("slurm".into(), slurm);
    }

    /// When `job` may start, as Slurm expects its pending Slurm job to (`squeue --start`'s time, which
    /// Slurm's scheduler sets once it has planned the job); unknown until then.
    pub fn estimate(&self, job: JobId) -> Option<EstimatedStart> {
        let pending = self.pending.lock().ok()?;
        let slurm = pending.get(&job)?;
        let expected = slurm.expected_start.and_then(|at| chrono::DateTime::from_timestamp(at as i64, 0));
        Some(match expected {
            Some(at) => {
                // a time Slurm has not revised yet may be just past: "now" rather than a negative wait
                let seconds = ((at - ringtrain_store::now()).num_milliseconds() as f64 / 1e3).max(0.0);
                EstimatedStart {
                    kind: "at".into(),
                    seconds: Some(seconds),
                    at: Some(at),
                    jobs: Vec::new(),
                    basis: format!(
                        "Slurm expects to start its Slurm job {} in ~{} (squeue --start)",
                        slurm.id,
                        duration_words(seconds)
                    ),
                }
            }
            None => EstimatedStart {
                kind: "unknown".into(),
                seconds: None,
                at: None,
                jobs: Vec::new(),
                basis: format!("it waits for Slurm job {}, whose start Slurm has not estimated yet", slurm.id),
            },
        })
    }

    /// The Slurm job a ringtrain job of `devices` devices asks for: nodes of `devices_per_node`, each
    /// holding whole workers of `node_group` devices (a worker's pipeline stages share a node); u32::MAX
    /// when a Slurm node cannot hold one worker.
    fn nodes_for(&self, devices: u32, node_group: u32) -> u32 {
        nodes_for(devices, node_group, self.config.devices_per_node)
    }
}

impl AppState {
    /// Adds what Slurm says of queued job `job`'s pending Slurm job (a Slurm pool's) to its view: Slurm's
    /// reason to its pending reason, and Slurm's expected start as its estimated start.
    pub fn annotate_slurm(&self, job: JobId, view: &mut JobView) {
        let Some(pool) = &self.slurm_pool else { return };
        if let Some(reason) = view.pending_reason.as_mut() {
            pool.annotate(job, reason);
        }
        if let Some(estimate) = pool.estimate(job) {
            view.estimated_start = Some(estimate);
        }
    }

    /// The Slurm pool's loop (see the module's doc), until the server stops.
    pub async fn run_slurm_pool(self) {
        let Some(pool) = self.slurm_pool.clone() else { return };
        if let Err(err) = std::fs::create_dir_all(&pool.config.dir) {
            tracing::error!(error = %err, dir = %pool.config.dir.display(), "the Slurm pool's folder cannot be made");
        }
        loop {
            if let Err(err) = pass(&self, &pool).await {
                tracing::warn!(error = %err, "a pass of the Slurm pool failed; trying again");
            }
            tokio::time::sleep(PASS_EVERY).await;
        }
    }
}

/// The ringtrain job a Slurm job was submitted for.
fn ringtrain_job(slurm: &SlurmJob) -> Option<JobId> {
    slurm.comment.strip_prefix(COMMENT_PREFIX)?.parse().ok()
}

async fn pass(state: &AppState, pool: &SlurmPool) -> anyhow::Result<()> {
    let listed = match pool.config.slurm.jobs(COMMENT_PREFIX).await {
        Ok(listed) => listed,
        Err(err) => {
            // unknown now; the next pass asks again
            pool.pending.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clear();
            return Err(err.into());
        }
    };
    let active: Vec<&SlurmJob> = listed.iter().filter(|j| j.state.is_active()).collect();
    let mut pending = HashMap::new();
    for slurm in &active {
        let Some(id) = ringtrain_job(slurm) else { continue };
        let job = state.store.get_job(id).await?;
        let waits = job.as_ref().is_some_and(|j| j.state == JobState::Queued);
        if slurm.state != SlurmState::Pending {
            continue; // its agents run; they leave when idle
        }
        if !waits {
            tracing::info!(job = %id, slurm_job = slurm.id, "the job no longer waits: its pending Slurm job is cancelled");
            cancel(pool, slurm.id).await;
        } else if let Some(why) = slurm.never_runs() {
            fail_queued(state, id, &why).await?;
            cancel(pool, slurm.id).await;
        } else {
            pending.insert(id, (*slurm).clone());
        }
    }
    *pool.pending.lock().map_err(|_| anyhow::anyhow!("poisoned"))? = pending.clone();
    forget_ended(state, pool, &active).await;

    let insight = state.queue_insight().await.map_err(|e| anyhow::anyhow!("the queue's plan: {e:?}"))?;
    let mut waiting: Vec<(Option<u32>, JobId, u32, u32)> = Vec::new();
    let most = pool.config.max_nodes.saturating_mul(pool.config.devices_per_node);
    for queued in insight.read.view.queued.iter().filter(|q| q.kind == pool.config.kind) {
        let Some(Verdict::Wait { position, reason } | Verdict::Reclaim { position, reason, .. }) =
            insight.plan.verdict(queued.id)
        else {
            continue;
        };
        let unplaceable = matches!(
            reason,
            WaitReason::TooLarge { .. } | WaitReason::NoDevicesOfKind { .. } | WaitReason::WorkerLargerThanNodes { .. }
        );
        if unplaceable && pool.nodes_for(queued.devices, queued.node_group) > pool.config.max_nodes {
            // neither the agents nor one Slurm job will ever hold it: said now, not after a wait
            let per_worker = match queued.node_group {
                0 | 1 => String::new(),
                group => format!(", {group} on one node for each worker"),
            };
            let why = format!(
                "cannot be placed: needs {} {} devices{per_worker}; the agents cannot hold it and the Slurm \
                 pool's largest job is {most} ({} nodes of {})",
                queued.devices,
                queued.kind.as_str(),
                pool.config.max_nodes,
                pool.config.devices_per_node
            );
            fail_queued(state, queued.id, &why).await?;
        } else if lacks_devices(&reason) {
            waiting.push((position, queued.id, queued.devices, queued.node_group));
        }
    }
    // first in line first (a job the pool cannot place at all has no position: after those that have)
    waiting.sort_by_key(|(position, id, _, _)| (position.is_none(), *position, id.0));
    let has_slurm_job: Vec<JobId> = active.iter().filter_map(|s| ringtrain_job(s)).collect();
    let mut pending_now = pending.len();
    for (_, id, devices, node_group) in waiting {
        if has_slurm_job.contains(&id) {
            continue;
        }
        if pending_now >= pool.config.max_pending {
            break;
        }
        let nodes = pool.nodes_for(devices, node_group);
        if nodes > pool.config.max_nodes {
            continue; // larger than one Slurm job: it waits for the agents' devices to free up
        }
        submit(state, pool, id, nodes).await?;
        pending_now += 1;
    }
    Ok(())
}

/// Submits the Slurm job of ringtrain job `id`: `nodes` nodes, each running an agent with a token of its
/// own. A refusal (an unknown partition, an account without access) fails the ringtrain job with Slurm's
/// words.
async fn submit(state: &AppState, pool: &SlurmPool, id: JobId, nodes: u32) -> anyhow::Result<()> {
    let config = &pool.config;
    let expires = ringtrain_store::now()
        + chrono::Duration::minutes(i64::from(config.time_limit_minutes))
        + chrono::Duration::hours(1);
    let (mut tokens, mut lines) = (Vec::new(), String::new());
    for node in 0..nodes {
        let token = ringtrain_store::generate_token();
        let info = state
            .store
            .create_token(NewToken {
                token_hash: ringtrain_store::hash_token(&token),
                role: Role::Agent,
                team_id: None,
                platform: false,
                label: Some(format!("slurm pool: job {id}, node {node}")),
                expires_at: Some(expires),
            })
            .await?;
        tokens.push(info.id);
        lines.push_str(&token);
        lines.push('\n');
    }
    let file = config.dir.join(format!("tokens-{}", uuid::Uuid::new_v4()));
    write_private(&file, &lines)?;
    let mut agent = vec![
        config.agent_command.clone(),
        "agent".into(),
        "--slurm".into(),
        "--server".into(),
        config.server_url.clone(),
        "--token-file".into(),
        file.display().to_string(),
    ];
    agent.extend(config.agent_args.iter().cloned());
    let quoted: Vec<String> = agent.iter().map(|a| shell_quote(a)).collect();
    let gpus = config.kind == DeviceKind::Gpu;
    let batch = BatchJob {
        name: format!("ringtrain-{}", &id.to_string()[..8]),
        partition: Some(config.partition.clone()),
        account: config.account.clone(),
        nodes,
        tasks_per_node: 1,
        cpus_per_task: (!gpus).then_some(config.devices_per_node),
        gpus_per_node: gpus.then_some(config.devices_per_node),
        time_limit_minutes: Some(config.time_limit_minutes),
        grace_seconds: Some(config.grace_seconds),
        comment: format!("{COMMENT_PREFIX}{id}"),
        output: Some(config.dir.join("slurm-%j.out")),
        script: format!("#!/bin/sh\nexec srun {}\n", quoted.join(" ")),
    };
    match config.slurm.submit(&batch).await {
        Ok(slurm_id) => {
            tracing::info!(job = %id, slurm_job = slurm_id, nodes, partition = %config.partition, "submitted to Slurm");
            pool.issued.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.insert(slurm_id, (tokens, file));
            Ok(())
        }
        Err(err) => {
            revoke(state, &tokens, &file).await;
            match err {
                SlurmError::Refused(why) => fail_queued(state, id, &format!("Slurm refused its job: {why}")).await,
                other => Err(other.into()),
            }
        }
    }
}

/// A queued job failed with `why` (it will never be placed), with its event.
async fn fail_queued(state: &AppState, id: JobId, why: &str) -> anyhow::Result<()> {
    let mut failed = Transition::new(id, JobState::Queued, JobState::Failed, why.to_string());
    failed.error = Some(why.to_string());
    if state.store.transition(&failed).await?.is_some() {
        tracing::warn!(job = %id, %why, "failed: it will never be placed");
        state.changed().await;
    }
    Ok(())
}

async fn cancel(pool: &SlurmPool, slurm_id: u64) {
    if let Err(err) = pool.config.slurm.cancel(slurm_id).await {
        tracing::warn!(slurm_job = slurm_id, error = %err, "cannot cancel a Slurm job");
    }
}

/// Revokes the tokens of the Slurm jobs this server submitted that Slurm no longer holds, and removes
/// their token files.
async fn forget_ended(state: &AppState, pool: &SlurmPool, active: &[&SlurmJob]) {
    let ended: Vec<(u64, (Vec<TokenId>, PathBuf))> = match pool.issued.lock() {
        Ok(mut issued) => {
            let gone: Vec<u64> = issued.keys().filter(|id| !active.iter().any(|a| a.id == **id)).copied().collect();
            gone.into_iter().filter_map(|id| issued.remove(&id).map(|entry| (id, entry))).collect()
        }
        Err(_) => return,
    };
    for (_, (tokens, file)) in ended {
        revoke(state, &tokens, &file).await;
    }
}

async fn revoke(state: &AppState, tokens: &[TokenId], file: &std::path::Path) {
    for &token in tokens {
        if let Err(err) = state.store.revoke_token(token, ringtrain_store::now()).await {
            tracing::warn!(error = %err, "cannot revoke a Slurm job's agent token");
        }
    }
    let _ = std::fs::remove_file(file);
}

/// Writes `text` to `path` readable by this user only (the agents run as the same user under Slurm).
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())
}

/// `arg` as one word of a POSIX shell command.
fn shell_quote(arg: &str) -> String {
    if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@%+".contains(&b)) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_argument_is_one_word_of_the_script() {
        assert_eq!(shell_quote("/usr/bin/ringtrain"), "/usr/bin/ringtrain");
        assert_eq!(shell_quote("http://10.0.0.1:8080"), "http://10.0.0.1:8080");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn a_slurm_job_holds_whole_workers_on_each_node() {
        assert_eq!(super::nodes_for(6, 1, 4), 2, "plain devices fill nodes");
        // 3 workers of 2 stages on nodes of 3: one worker a node, not two nodes of 3 devices
        assert_eq!(super::nodes_for(6, 2, 3), 3);
        assert_eq!(super::nodes_for(8, 2, 4), 2);
        assert_eq!(super::nodes_for(3, 3, 2), u32::MAX, "a node smaller than a worker holds none");
    }

    #[test]
    fn only_a_job_the_pool_lacks_devices_for_gets_slurm_nodes() {
        let kind = DeviceKind::Cpu;
        assert!(lacks_devices(&WaitReason::TooLarge { kind, needed: 4, pool_size: 2 }));
        assert!(lacks_devices(&WaitReason::NoDevicesOfKind { kind, needed: 4 }));
        assert!(lacks_devices(&WaitReason::WaitingForDevices {
            kind,
            needed: 4,
            free_now: 1,
            free_within_team_guarantee: 1
        }));
        let at_guarantee = WaitReason::TeamAtGuaranteePoolFull { kind, needed: 2, used: 4, guarantee: 4, free_now: 0 };
        assert!(!lacks_devices(&at_guarantee), "a team at its guarantee gets no more devices from Slurm");
        assert!(!lacks_devices(&WaitReason::StartingNextPass));
    }

    #[test]
    fn a_slurm_job_names_the_ringtrain_job_it_serves() {
        let id = JobId::new();
        let mut slurm = pending_job();
        slurm.comment = format!("{COMMENT_PREFIX}{id}");
        assert_eq!(ringtrain_job(&slurm), Some(id));
        slurm.comment = "someone else's".into();
        assert_eq!(ringtrain_job(&slurm), None);
    }

    fn pending_job() -> SlurmJob {
        SlurmJob {
            id: 1,
            state: SlurmState::Pending,
            reason: None,
            comment: String::new(),
            partition: "cpu".into(),
            nodes: String::new(),
            expected_start: None,
        }
    }
}
