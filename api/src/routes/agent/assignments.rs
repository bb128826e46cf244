//! The ranks placed on a node: the long poll that hands them out (and says which to stop or checkpoint),
//! rank 0's rendezvous endpoint, and the agent's reports of each rank's progress
//! (delivered → running → done | failed | cancelled).

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use ringtrain_core::{AssignmentId, AssignmentState, DatasetRef, FieldError, JobState, NodeId};
use ringtrain_protocol::agent::ModelFile;
use ringtrain_protocol::{AssignmentUpdate, EndpointReport, Poll, PollQuery, Work};
use ringtrain_store::{Assignment, Checkpoint, Job};

use crate::access::{own_assignment, own_node};
use crate::auth::Agent;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, ApiQuery, JsonBody};
use crate::resume::{resume_point, ReportShape};
use crate::state::AppState;

/// What this node should run and stop. With `since`, a long poll: it answers as soon as jobs or assignments
/// change, or after `wait_s`. `version` is the database's change version: the same through every server
/// and across restarts, so a poll that reaches another replica, or a restarted server, still waits.
#[utoipa::path(get, path = "/v1/agent/nodes/{id}/assignments", tag = "agent", params(("id" = Uuid, Path), PollQuery),
    responses((status = 200, body = Poll), (status = 404)),
    security(("bearer" = [])))]
pub async fn poll_assignments(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<NodeId>,
    ApiQuery(query): ApiQuery<PollQuery>,
) -> ApiResult<Json<Poll>> {
    let node = own_node(&state, &agent, id).await?;
    if let Some(since) = query.since {
        let wait = Duration::from_secs(query.wait_s.unwrap_or(u64::MAX)).min(state.config.max_poll_wait);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // this server's counter first: a change after the read below wakes the wait
            let seen = state.changes.version();
            if state.store.change_version().await?.max(0) as u64 != since {
                break;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            state.changes.wait_past(seen, deadline - now).await;
        }
    }
    let version = state.store.change_version().await?.max(0) as u64;
    let live = state.store.node_assignments(id, &AssignmentState::LIVE).await?;
    let mut poll = Poll { version, work: Vec::new(), stop: Vec::new(), preempt: Vec::new() };
    for mut assignment in live {
        let job = state.store.get_job(assignment.job_id).await?;
        let current = job
            .as_ref()
            .filter(|j| j.attempt == assignment.attempt && matches!(j.state, JobState::Scheduled | JobState::Running));
        let Some(job) = current else {
            // Read again: the preemption that made this placement stale marked its assignments in the same
            // transaction, possibly after the list above was read.
            let fresh = state.store.get_assignment(assignment.id).await?;
            if fresh.is_some_and(|a| a.preempted) {
                poll.preempt.push(assignment.id);
            } else {
                poll.stop.push(assignment.id);
            }
            continue;
        };
        let (pending, delivered) = (AssignmentState::Pending, AssignmentState::Delivered);
        if assignment.state == pending && state.store.set_assignment_state(assignment.id, pending, delivered).await? {
            assignment.state = delivered;
        }
        let rendezvous = if assignment.rank == 0 {
            assignment.endpoint.clone()
        } else {
            let ranks = state.store.job_assignments(job.id, job.attempt).await?;
            ranks.into_iter().find(|a| a.rank == 0).and_then(|a| a.endpoint)
        };
        // Only a rank 0 that is still to start needs it (a running one ignores its work item).
        let resume = if assignment.rank == 0 && assignment.state != AssignmentState::Running {
            let (resume, reached) = resume_checkpoint(&state, job).await?;
            // where this placement resumes, once: the job's history counts what it trains again from it
            let from = resume.as_ref().map_or(0, |c| c.iteration);
            state.store.record_resume(assignment.id, from, reached).await?;
            resume
        } else {
            None
        };
        let device_index = node.devices.iter().find(|d| d.id == assignment.device_id).map_or(0, |d| d.index);
        let spec = job.parsed_spec()?;
        let dataset_sha256 = match spec.dataset {
            DatasetRef::Uploaded(id) => state.store.get_dataset(id).await?.map(|d| d.sha256),
            _ => None,
        };
        let model = match spec.model.uploaded {
            Some(id) => state.store.get_model(id).await?.map(|m| ModelFile { id, sha256: m.sha256, inputs: m.inputs }),
            None => None,
        };
        let rendezvous_secret = state.store.rendezvous_secret(job.id, job.attempt).await?;
        poll.work.push(Work {
            rendezvous_secret,
            dataset_sha256,
            model,
            device_index,
            assignment,
            spec: job.spec.clone(),
            effective: job.effective.clone(),
            dataset_size: job.dataset_size,
            rendezvous,
            resume,
        });
    }
    Ok(Json(poll))
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
    let shape = ReportShape {
        ranks: job.devices,
        log_every: i64::from(job.parsed_spec()?.log_every_iterations),
        // unknown only for `idx:` data before a rank reported its size: one iteration an epoch is the
        // cautious reading (every iteration may end an epoch)
        iterations_per_epoch: job.parsed_effective()?.map_or(1, |e| e.iterations_per_epoch as i64),
    };
    Ok((resume_point(checkpoints, &progress, shape), reached))
}

/// Checks HOST:PORT: a port from 1 to 65535 and a host of letters, digits, `.`, `-`, `:` or brackets.
pub fn check_endpoint(address: &str) -> Result<(), FieldError> {
    let bad = |reason: &str| FieldError::new("address", format!("{address:?} is not HOST:PORT: {reason}"));
    let (host, port) = address.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if !port.parse::<u16>().is_ok_and(|p| p > 0) {
        return Err(bad("the port must be 1 to 65535"));
    }
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
    if !host_ok {
        return Err(bad("the host must be a name or an IP address"));
    }
    Ok(())
}

/// Rank 0's agent says where rank 0 listens; the other ranks' agents read it from their polls.
#[utoipa::path(post, path = "/v1/agent/assignments/{id}/endpoint", tag = "agent", params(("id" = Uuid, Path)),
    request_body = EndpointReport,
    responses((status = 200, body = Assignment),
        (status = 404),
        (status = 409, description = "Not live any more"),
        (status = 422)),
    security(("bearer" = [])))]
pub async fn report_endpoint(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<AssignmentId>,
    JsonBody(body): JsonBody<EndpointReport>,
) -> ApiResult<Json<Assignment>> {
    check_endpoint(&body.address).map_err(|e| ApiError::validation(vec![e]))?;
    let assignment = own_assignment(&state, &agent, id).await?;
    if assignment.rank != 0 {
        return Err(ApiError::validation(vec![FieldError::new(
            "address",
            format!("assignment {id} is rank {}: only rank 0 has an endpoint", assignment.rank),
        )]));
    }
    if !state.store.set_assignment_endpoint(id, &body.address).await? {
        return Err(ApiError::conflict(format!("assignment {id} is not delivered or running")));
    }
    state.changed().await;
    Ok(Json(own_assignment(&state, &agent, id).await?))
}

/// Move one of this node's assignments along (delivered → running → done | failed | cancelled).
#[utoipa::path(post, path = "/v1/agent/assignments/{id}/state", tag = "agent", params(("id" = Uuid, Path)),
    request_body = AssignmentUpdate,
    responses((status = 200, body = Assignment),
        (status = 404),
        (status = 409),
        (status = 422)),
    security(("bearer" = [])))]
pub async fn update_assignment(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<AssignmentId>,
    JsonBody(body): JsonBody<AssignmentUpdate>,
) -> ApiResult<Json<Assignment>> {
    let change = match (body.from.parse::<AssignmentState>(), body.to.parse::<AssignmentState>()) {
        (Ok(from), Ok(to)) if from.agent_may_report(to) => Some((from, to)),
        _ => None,
    };
    let Some((from, to)) = change else {
        return Err(ApiError::validation(vec![FieldError::new(
            "to",
            format!("{} -> {} is not allowed (delivered -> running -> done | failed | cancelled)", body.from, body.to),
        )]));
    };
    own_assignment(&state, &agent, id).await?;
    if !state.store.set_assignment_state(id, from, to).await? {
        return Err(ApiError::conflict(format!("assignment {id} is not {from}")));
    }
    if !to.is_live() {
        // A device became free.
        state.changed().await;
    }
    Ok(Json(own_assignment(&state, &agent, id).await?))
}
