//! What a node's agent is told to run, stop and preempt: the body of the agent's long poll
//! (`GET /v1/agent/nodes/{id}/assignments`, a thin handler in `routes/agent/assignments.rs`).
//!
//! For each live assignment of the node: if its job has moved on (another placement, or finished), the
//! rank is to stop (or, when a preemption marked it, to checkpoint and stop); otherwise it is delivered and
//! becomes a [`Work`] item with everything the agent needs to start the rank: the spec, rank 0's
//! rendezvous endpoint, the resume checkpoint (rank 0 only, decided by [`crate::resume`] and recorded
//! once), the data set's and model's checksums and the placement's rendezvous secret. What is the same for
//! every rank of a placement (the job, its ranks' endpoints, the checksums, the secret) is read once per job
//! per poll ([`PlacementInputs`]), however many of its ranks the node holds; per rank there remain only its
//! delivery (a guarded write) and, for rank 0, its resume point.

use std::collections::hash_map::{Entry, HashMap};
use std::time::Duration;

use ringtrain_core::{AssignmentState, DatasetRef, JobId, JobState};
use ringtrain_protocol::agent::ModelFile;
use ringtrain_protocol::{Poll, Work};
use ringtrain_store::{Assignment, Checkpoint, Job, Node};

use crate::error::ApiResult;
use crate::resume::{resume_point, ReportShape};
use crate::state::AppState;

/// Waits until the database's change version is no longer `since`, or `wait` has passed.
pub async fn wait_for_change(state: &AppState, since: u64, wait: Duration) -> ApiResult<()> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // this server's counter first: a change after the read below wakes the wait
        let seen = state.changes.version();
        if state.store.change_version().await?.max(0) as u64 != since {
            return Ok(());
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(());
        }
        state.changes.wait_past(seen, deadline - now).await;
    }
}

/// The node's poll now: its work, and the assignments to stop or preempt.
pub async fn poll(state: &AppState, node: &Node) -> ApiResult<Poll> {
    let version = state.store.change_version().await?.max(0) as u64;
    let live = state.store.node_assignments(node.id, &AssignmentState::LIVE).await?;
    let mut poll = Poll { version, work: Vec::new(), stop: Vec::new(), preempt: Vec::new() };
    let mut jobs: HashMap<JobId, Option<Job>> = HashMap::new();
    let mut inputs: HashMap<JobId, PlacementInputs> = HashMap::new();
    for assignment in live {
        if let Entry::Vacant(slot) = jobs.entry(assignment.job_id) {
            slot.insert(state.store.get_job(assignment.job_id).await?);
        }
        let current = jobs[&assignment.job_id]
            .as_ref()
            .filter(|j| j.attempt == assignment.attempt && matches!(j.state, JobState::Scheduled | JobState::Running));
        match current {
            Some(job) => {
                if let Entry::Vacant(slot) = inputs.entry(job.id) {
                    slot.insert(PlacementInputs::read(state, job).await?);
                }
                poll.work.push(work_for(state, node, assignment, job, &inputs[&job.id]).await?)
            }
            None => {
                // Read again: the preemption that made this placement stale marked its assignments in the
                // same transaction, possibly after the list above was read.
                let fresh = state.store.get_assignment(assignment.id).await?;
                if fresh.is_some_and(|a| a.preempted) {
                    poll.preempt.push(assignment.id);
                } else {
                    poll.stop.push(assignment.id);
                }
            }
        }
    }
    Ok(poll)
}

/// What every rank of a job's current placement is told alike.
struct PlacementInputs {
    /// Rank 0's rendezvous endpoint, once its agent reported it.
    rendezvous: Option<String>,
    dataset_sha256: Option<String>,
    /// The granted folder an `idx:` or `shards:` data set lies under.
    dataset_root: Option<String>,
    model: Option<ModelFile>,
    rendezvous_secret: Option<String>,
    /// All its ranks are on one node (and there is more than one).
    ranks_on_one_node: bool,
}

impl PlacementInputs {
    async fn read(state: &AppState, job: &Job) -> ApiResult<Self> {
        let ranks = state.store.job_assignments(job.id, job.attempt).await?;
        let ranks_on_one_node = ranks.len() > 1 && ranks.iter().all(|a| a.node_id == ranks[0].node_id);
        let rendezvous = ranks.into_iter().find(|a| a.rank == 0).and_then(|a| a.endpoint);
        let dataset_sha256 = match job.spec.dataset {
            DatasetRef::Uploaded(id) => state.store.get_dataset(id).await?.map(|d| d.sha256),
            _ => None,
        };
        let model = match job.spec.model.uploaded {
            Some(id) => state.store.get_model(id).await?.map(|m| ModelFile { id, sha256: m.sha256, inputs: m.inputs }),
            None => None,
        };
        let rendezvous_secret = state.store.rendezvous_secret(job.id, job.attempt).await?;
        let dataset_root = match job.spec.dataset.node_path() {
            Some(path) => crate::submission::checks::data_roots(state, job.team_id)
                .await?
                .into_iter()
                .find(|root| std::path::Path::new(path).starts_with(root))
                .map(|root| root.display().to_string()),
            None => None,
        };
        Ok(PlacementInputs { rendezvous, dataset_sha256, dataset_root, model, rendezvous_secret, ranks_on_one_node })
    }
}

/// The work item of a live assignment of the job's current placement, delivered by this poll.
async fn work_for(
    state: &AppState,
    node: &Node,
    mut assignment: Assignment,
    job: &Job,
    inputs: &PlacementInputs,
) -> ApiResult<Work> {
    let (pending, delivered) = (AssignmentState::Pending, AssignmentState::Delivered);
    if assignment.state == pending && state.store.set_assignment_state(assignment.id, pending, delivered).await? {
        assignment.state = delivered;
    }
    let rendezvous = if assignment.rank == 0 { assignment.endpoint.clone() } else { inputs.rendezvous.clone() };
    // Only a rank 0 that is still to start needs it (a running one ignores its work item).
    let resume = if assignment.rank == 0 && assignment.state != AssignmentState::Running {
        let (resume, reached) = resume_checkpoint(state, job).await?;
        // where this placement resumes, once: the job's history counts what it trains again from it
        let from = resume.as_ref().map_or(0, |c| c.iteration);
        state.store.record_resume(assignment.id, from, reached).await?;
        resume
    } else {
        None
    };
    let init_weights = assignment.rank == 0
        && assignment.state != AssignmentState::Running
        && resume.is_none()
        && job.spec.init_from.is_some();
    let device_index = node.devices.iter().find(|d| d.id == assignment.device_id).map_or(0, |d| d.index);
    Ok(Work {
        rendezvous_secret: inputs.rendezvous_secret.clone(),
        dataset_sha256: inputs.dataset_sha256.clone(),
        dataset_root: inputs.dataset_root.clone(),
        model: inputs.model.clone(),
        device_index,
        ranks_on_one_node: inputs.ranks_on_one_node,
        assignment,
        spec: job.spec_json.clone(),
        effective: job.effective.clone(),
        dataset_size: job.dataset_size,
        rendezvous,
        resume,
        init_weights,
    })
}

/// The checkpoint a resumed placement starts from: the newest every rank's reports reached
/// ([`crate::resume`]), and the newest iteration any rank reported (None: none yet). (Final checkpoints are
/// the same files as the last epoch's, registered again as the job's weights.)
async fn resume_checkpoint(state: &AppState, job: &Job) -> ApiResult<(Option<Checkpoint>, Option<i64>)> {
    let progress = state.store.reported_progress(job.id).await?;
    let reached = progress.iter().filter_map(|p| p.newest_iteration).max();
    let checkpoints = state.store.list_checkpoints(job.id).await?;
    if checkpoints.is_empty() {
        return Ok((None, reached));
    }
    let mut ranks_by_placement = std::collections::BTreeMap::new();
    for attempt in checkpoints.iter().map(|c| c.attempt).collect::<std::collections::BTreeSet<_>>() {
        let ranks = state.store.job_assignments(job.id, attempt).await?.len() as i32;
        if ranks > 0 {
            ranks_by_placement.insert(attempt, ranks);
        }
    }
    let shape = ReportShape {
        ranks: job.devices,
        ranks_by_placement,
        log_every: i64::from(job.spec.log_every_iterations),
        // unknown only for `idx:` data before a rank reported its size: one iteration an epoch is the
        // cautious reading (every iteration may end an epoch)
        iterations_per_epoch: job.effective.as_ref().map_or(1, |e| e.iterations_per_epoch as i64),
    };
    Ok((resume_point(checkpoints, &progress, &shape), reached))
}
