//! /v1/agent: what node agents say to the server, with agent tokens. An agent registers its node and
//! devices, heartbeats, polls for the ranks placed on it, and relays what its ranks report (metrics,
//! checkpoints, the result). Job-scoped reports are accepted only from an agent holding an assignment of
//! that job's attempt, and every state change is guarded by the attempt, so a stale agent changes nothing.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use ringtrain_core::{FieldError, JobId, JobState};
use ringtrain_store::{
    Assignment, Checkpoint, Job, MetricPoint, NewCheckpoint, NewDevice, Node, NodeRegistration, Transition,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::auth::Agent;
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::{ApiPath, ApiQuery, JsonBody};
use crate::scheduling::failure_transition;
use crate::state::AppState;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterDevice {
    /// CUDA ordinal, or 0.. for CPU slots.
    pub index: u32,
    /// `cpu` or `gpu`.
    pub kind: String,
    pub name: String,
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterNode {
    /// Unique in the pool (the host name, usually).
    pub name: String,
    /// Where the node's ranks can be reached by other ranks (host or IP).
    pub address: Option<String>,
    pub devices: Vec<RegisterDevice>,
}

const MAX_DEVICES: usize = 1024;

fn validate_node(body: &RegisterNode) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    if body.name.trim().is_empty() || body.name.len() > 255 || body.name.chars().any(char::is_control) {
        errors.push(FieldError::new("name", "must be 1 to 255 characters without control characters"));
    }
    if body.devices.len() > MAX_DEVICES {
        errors.push(FieldError::new("devices", format!("at most {MAX_DEVICES} devices")));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, device) in body.devices.iter().enumerate() {
        if !seen.insert(device.index) {
            errors
                .push(FieldError::new(format!("devices[{i}].index"), format!("index {} appears twice", device.index)));
        }
        if device.index > i32::MAX as u32 {
            errors.push(FieldError::new(format!("devices[{i}].index"), "too large"));
        }
        if device.kind != "cpu" && device.kind != "gpu" {
            errors.push(FieldError::new(format!("devices[{i}].kind"), "must be cpu or gpu"));
        }
        if device.memory_bytes.is_some_and(|m| m > i64::MAX as u64) {
            errors.push(FieldError::new(format!("devices[{i}].memory_bytes"), "too large"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Register (or re-register) this agent's node and its devices.
#[utoipa::path(post, path = "/v1/agent/nodes", tag = "agent", request_body = RegisterNode,
    responses((status = 200, body = Node), (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The name belongs to another agent",
            body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn register_node(
    State(state): State<AppState>,
    agent: Agent,
    JsonBody(body): JsonBody<RegisterNode>,
) -> ApiResult<Json<Node>> {
    validate_node(&body).map_err(ApiError::validation)?;
    let registration = NodeRegistration {
        name: body.name,
        address: body.address,
        devices: body
            .devices
            .into_iter()
            .map(|d| NewDevice {
                index: d.index as i32,
                kind: d.kind,
                name: d.name,
                memory_bytes: d.memory_bytes.map(|m| m as i64),
            })
            .collect(),
    };
    Ok(Json(state.store.register_node(agent.token.id, registration).await?))
}

/// This agent's node, or 404.
async fn own_node(state: &AppState, agent: &Agent, id: Uuid) -> ApiResult<Node> {
    match state.store.get_node(id).await? {
        Some(node) if node.agent_token_id == agent.token.id => Ok(node),
        _ => Err(ApiError::not_found(format!("no node {id} of this agent"))),
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HeartbeatAck {
    pub node_id: Uuid,
    pub at: DateTime<Utc>,
}

/// The node is alive.
#[utoipa::path(post, path = "/v1/agent/nodes/{id}/heartbeat", tag = "agent", params(("id" = Uuid, Path)),
    responses((status = 200, body = HeartbeatAck),
        (status = 404, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn heartbeat(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<HeartbeatAck>> {
    if !state.store.heartbeat(id, agent.token.id).await? {
        return Err(ApiError::not_found(format!("no node {id} of this agent")));
    }
    // The agent is alive, so the placements of the ranks it holds are too.
    state.store.renew_node_leases(id, state.config.lease).await?;
    Ok(Json(HeartbeatAck { node_id: id, at: ringtrain_store::now() }))
}

/// One rank to run: its assignment and what it trains.
#[derive(Debug, Serialize, ToSchema)]
pub struct Work {
    /// `delivered` (start it) or `running` (it should be running here; an agent that has no such process,
    /// having restarted, reports it failed).
    pub assignment: Assignment,
    #[schema(value_type = Object)]
    pub spec: Value,
    #[schema(value_type = Option<Object>)]
    pub effective: Option<Value>,
    pub dataset_size: Option<i64>,
    /// Rank 0's HOST:PORT, once its agent reported it: ranks above 0 wait for it.
    pub rendezvous: Option<String>,
    /// The checkpoint to resume from (the job's newest), for rank 0 to download and broadcast.
    pub resume: Option<Checkpoint>,
    /// The index of the assignment's device on this node (the CUDA ordinal for a GPU).
    pub device_index: i32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Poll {
    /// Pass it back as `since`: the poll then waits until something changed after this answer.
    pub version: u64,
    /// Ranks to run (pending ones are marked delivered by this poll; delivered and running ones are repeated,
    /// so a restarted agent finds them again).
    pub work: Vec<Work>,
    /// Assignments that are over on the server's side (their job finished, was cancelled or failed, or this
    /// placement was requeued): stop their ranks at once if they still run, then report each one ended
    /// (done, failed or cancelled), which frees its device.
    pub stop: Vec<Uuid>,
    /// Assignments of a placement the scheduler preempted: ask their ranks to stop after a checkpoint of where
    /// they are (`ringtrain train --stop-file`), upload it (rank 0), then report them cancelled.
    pub preempt: Vec<Uuid>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PollQuery {
    /// The `version` of the previous answer: wait until something changed since.
    pub since: Option<u64>,
    /// The longest to wait, in seconds (capped by the server, 20 s by default); 0 answers at once.
    pub wait_s: Option<u64>,
}

/// What this node should run and stop. With `since`, a long poll: it answers as soon as jobs or assignments
/// change, or after `wait_s`.
#[utoipa::path(get, path = "/v1/agent/nodes/{id}/assignments", tag = "agent", params(("id" = Uuid, Path), PollQuery),
    responses((status = 200, body = Poll), (status = 404, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn poll_assignments(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(query): ApiQuery<PollQuery>,
) -> ApiResult<Json<Poll>> {
    let node = own_node(&state, &agent, id).await?;
    if let Some(since) = query.since {
        let wait = Duration::from_secs(query.wait_s.unwrap_or(u64::MAX)).min(state.config.max_poll_wait);
        state.changes.wait_past(since, wait).await;
    }
    let version = state.changes.version();
    let live = state.store.node_assignments(id, &["pending", "delivered", "running"]).await?;
    let mut poll = Poll { version, work: Vec::new(), stop: Vec::new(), preempt: Vec::new() };
    for mut assignment in live {
        let job = state.store.get_job(JobId(assignment.job_id)).await?;
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
        if assignment.state == "pending"
            && state.store.set_assignment_state(assignment.id, "pending", "delivered").await?
        {
            assignment.state = "delivered".into();
        }
        let rendezvous = if assignment.rank == 0 {
            assignment.endpoint.clone()
        } else {
            let ranks = state.store.job_assignments(job.id, job.attempt).await?;
            ranks.into_iter().find(|a| a.rank == 0).and_then(|a| a.endpoint)
        };
        let resume = if assignment.rank == 0 { latest_checkpoint(&state, job.id).await? } else { None };
        let device_index = node.devices.iter().find(|d| d.id == assignment.device_id).map_or(0, |d| d.index);
        poll.work.push(Work {
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

/// The newest checkpoint a resumed placement starts from. (Final checkpoints are the same files as the
/// last epoch's, registered again as the job's weights.)
async fn latest_checkpoint(state: &AppState, job: JobId) -> ApiResult<Option<Checkpoint>> {
    let checkpoints = state.store.list_checkpoints(job).await?;
    Ok(checkpoints.into_iter().filter(|c| !c.is_final).max_by_key(|c| c.iteration))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointReport {
    /// Where rank 0 listens for the other ranks: HOST:PORT.
    pub address: String,
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
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not live any more", body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn report_endpoint(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<Uuid>,
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

/// One of this agent's assignments, or 404.
async fn own_assignment(state: &AppState, agent: &Agent, id: Uuid) -> ApiResult<Assignment> {
    let not_found = || ApiError::not_found(format!("no assignment {id}"));
    let assignment = state.store.get_assignment(id).await?.ok_or_else(not_found)?;
    own_node(state, agent, assignment.node_id).await.map_err(|_| not_found())?;
    Ok(assignment)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignmentUpdate {
    /// The state the agent saw (`delivered`, `running`).
    pub from: String,
    /// `running`, `done`, `failed`, or `cancelled` (stopped because a poll said so).
    pub to: String,
}

/// Move one of this node's assignments along (delivered → running → done | failed | cancelled).
#[utoipa::path(post, path = "/v1/agent/assignments/{id}/state", tag = "agent", params(("id" = Uuid, Path)),
    request_body = AssignmentUpdate,
    responses((status = 200, body = Assignment),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn update_assignment(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<Uuid>,
    JsonBody(body): JsonBody<AssignmentUpdate>,
) -> ApiResult<Json<Assignment>> {
    let allowed = matches!(
        (body.from.as_str(), body.to.as_str()),
        ("delivered", "running" | "failed" | "cancelled") | ("running", "done" | "failed" | "cancelled")
    );
    if !allowed {
        return Err(ApiError::validation(vec![FieldError::new(
            "to",
            format!("{} -> {} is not allowed (delivered -> running -> done | failed | cancelled)", body.from, body.to),
        )]));
    }
    own_assignment(&state, &agent, id).await?;
    if !state.store.set_assignment_state(id, &body.from, &body.to).await? {
        return Err(ApiError::conflict(format!("assignment {id} is not {}", body.from)));
    }
    if body.to != "running" {
        // A device became free.
        state.changed().await;
    }
    Ok(Json(own_assignment(&state, &agent, id).await?))
}

/// The job, if this agent holds an assignment of `attempt` of it; else 404.
pub(crate) async fn assigned_job(state: &AppState, agent: &Agent, id: Uuid, attempt: i32) -> ApiResult<Job> {
    let not_found = || ApiError::not_found(format!("no job {id} attempt {attempt} assigned to this agent"));
    let job = state.store.get_job(JobId(id)).await?.ok_or_else(not_found)?;
    let assignments = state.store.job_assignments(job.id, attempt).await?;
    let mut nodes: Vec<Uuid> = assignments.iter().map(|a| a.node_id).collect();
    nodes.dedup();
    for node in nodes {
        if state.store.get_node(node).await?.is_some_and(|n| n.agent_token_id == agent.token.id) {
            return Ok(job);
        }
    }
    Err(not_found())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttemptBody {
    pub attempt: i32,
}

/// The ranks of this attempt started: scheduled → running.
#[utoipa::path(post, path = "/v1/agent/jobs/{id}/running", tag = "agent", params(("id" = Uuid, Path)),
    request_body = AttemptBody,
    responses((status = 200, description = "Running"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Stale attempt or state",
            body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn job_running(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<Uuid>,
    JsonBody(body): JsonBody<AttemptBody>,
) -> ApiResult<StatusCode> {
    let job = assigned_job(&state, &agent, id, body.attempt).await?;
    let transition =
        Transition::new(job.id, JobState::Scheduled, JobState::Running, format!("attempt {} started", body.attempt))
            .at_attempt(body.attempt);
    match state.store.transition(&transition).await? {
        Some(_) => Ok(StatusCode::OK),
        None => Err(ApiError::conflict(format!("job {id} attempt {} is not scheduled", body.attempt))),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsBatch {
    pub attempt: i32,
    /// Rank reports as they print them: `{"kind": "iteration", "rank": 0, "epoch": 0, "iteration": 20,
    /// "lr": 0.1, "loss": 2.3, ...}`; every field besides kind/rank/epoch/iteration must be a number.
    #[schema(value_type = Vec<Object>)]
    pub reports: Vec<Map<String, Value>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MetricsAck {
    pub accepted: usize,
}

pub const MAX_REPORTS: usize = 10_000;

/// Turns a rank's report into a stored point, naming the path of anything wrong.
pub fn parse_report(
    i: usize,
    attempt: i32,
    workers: i32,
    mut report: Map<String, Value>,
) -> Result<MetricPoint, Vec<FieldError>> {
    let mut errors = Vec::new();
    let path = |field: &str| format!("reports[{i}].{field}");
    let kind = match report.remove("kind") {
        Some(Value::String(kind))
            if (1..=32).contains(&kind.len()) && kind.chars().all(|c| c.is_ascii_lowercase() || c == '_') =>
        {
            kind
        }
        _ => {
            errors.push(FieldError::new(path("kind"), "must be a name of a-z and _ (iteration, epoch, ...)"));
            String::new()
        }
    };
    let mut integer = |field: &str, max: i64| match report.remove(field).and_then(|v| v.as_i64()) {
        Some(n) if (0..=max).contains(&n) => n,
        _ => {
            errors.push(FieldError::new(path(field), format!("must be an integer from 0 to {max}")));
            0
        }
    };
    let rank = integer("rank", i64::from(workers.max(1) - 1));
    let epoch = integer("epoch", i64::from(i32::MAX));
    let iteration = integer("iteration", i64::MAX / 2);
    for (name, value) in &report {
        if !(value.is_number() || value.is_null()) {
            errors.push(FieldError::new(path(name), "must be a number"));
        }
    }
    if errors.is_empty() {
        Ok(MetricPoint { kind, rank: rank as i32, epoch, iteration, attempt, fields: report })
    } else {
        Err(errors)
    }
}

/// A batch of metric reports from the ranks of one attempt. (kind, iteration, rank) is the de-duplication
/// key: a resumed attempt's report replaces the earlier one instead of adding to it.
#[utoipa::path(post, path = "/v1/agent/jobs/{id}/metrics", tag = "agent", params(("id" = Uuid, Path)),
    request_body = MetricsBatch,
    responses((status = 200, body = MetricsAck),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn report_metrics(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<Uuid>,
    JsonBody(body): JsonBody<MetricsBatch>,
) -> ApiResult<Json<MetricsAck>> {
    if body.reports.len() > MAX_REPORTS {
        return Err(ApiError::validation(vec![FieldError::new("reports", format!("at most {MAX_REPORTS} per batch"))]));
    }
    let job = assigned_job(&state, &agent, id, body.attempt).await?;
    let mut points = Vec::with_capacity(body.reports.len());
    let mut errors = Vec::new();
    for (i, report) in body.reports.into_iter().enumerate() {
        match parse_report(i, body.attempt, job.workers, report) {
            Ok(point) => points.push(point),
            Err(mut e) => errors.append(&mut e),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    state.store.record_metrics(job.id, &points).await?;
    Ok(Json(MetricsAck { accepted: points.len() }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointReport {
    pub attempt: i32,
    pub epoch: u32,
    pub iteration: u64,
    /// Where the agent stored the file.
    pub path: String,
    pub size_bytes: u64,
    /// Hex sha256 of the file.
    pub sha256: String,
    /// The finished job's weights.
    #[serde(default)]
    pub r#final: bool,
}

/// A checkpoint was written.
#[utoipa::path(post, path = "/v1/agent/jobs/{id}/checkpoints", tag = "agent", params(("id" = Uuid, Path)),
    request_body = CheckpointReport,
    responses((status = 201, body = ringtrain_store::Checkpoint),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn report_checkpoint(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<Uuid>,
    JsonBody(body): JsonBody<CheckpointReport>,
) -> ApiResult<(StatusCode, Json<ringtrain_store::Checkpoint>)> {
    let mut errors = Vec::new();
    if body.sha256.len() != 64 || !body.sha256.chars().all(|c| c.is_ascii_hexdigit()) {
        errors.push(FieldError::new("sha256", "must be 64 hex digits"));
    }
    if body.path.is_empty() || body.path.len() > 4096 {
        errors.push(FieldError::new("path", "must be 1 to 4096 characters"));
    }
    if body.size_bytes > i64::MAX as u64 || body.iteration > i64::MAX as u64 {
        errors.push(FieldError::new("size_bytes", "too large"));
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    let job = assigned_job(&state, &agent, id, body.attempt).await?;
    let checkpoint = state
        .store
        .add_checkpoint(NewCheckpoint {
            job_id: job.id,
            attempt: body.attempt,
            epoch: i64::from(body.epoch),
            iteration: body.iteration as i64,
            path: body.path,
            size_bytes: body.size_bytes as i64,
            sha256: body.sha256.to_ascii_lowercase(),
            is_final: body.r#final,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(checkpoint)))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Succeeded,
    Failed,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResultReport {
    pub attempt: i32,
    pub outcome: Outcome,
    /// Final metrics (test error, wall time, ...), for `succeeded`.
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    /// What went wrong, for `failed`.
    pub error: Option<String>,
    /// A failure worth retrying from the last checkpoint (a lost node, a killed rank), while restarts remain.
    #[serde(default)]
    pub retryable: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ResultAck {
    /// The job's state after the report: succeeded, failed, or queued (to be retried).
    #[schema(value_type = String)]
    pub state: JobState,
}

/// The attempt ended. A retryable failure with restarts left requeues the job (it resumes from its last
/// checkpoint); otherwise the job ends succeeded or failed.
#[utoipa::path(post, path = "/v1/agent/jobs/{id}/result", tag = "agent", params(("id" = Uuid, Path)),
    request_body = ResultReport,
    responses((status = 200, body = ResultAck),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Stale attempt, or the job already ended",
            body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn report_result(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<Uuid>,
    JsonBody(body): JsonBody<ResultReport>,
) -> ApiResult<Json<ResultAck>> {
    if body.error.as_ref().is_some_and(|e| e.len() > 16_384) {
        return Err(ApiError::validation(vec![FieldError::new("error", "at most 16384 bytes")]));
    }
    let job = assigned_job(&state, &agent, id, body.attempt).await?;
    if !matches!(job.state, JobState::Scheduled | JobState::Running) || job.attempt != body.attempt {
        return Err(ApiError::conflict(format!("job {id} attempt {} is no longer running", body.attempt)));
    }
    let transition = match body.outcome {
        Outcome::Succeeded => {
            let reason = format!("attempt {} succeeded", job.user_attempt());
            let mut transition =
                Transition::new(job.id, job.state, JobState::Succeeded, reason).at_attempt(body.attempt);
            transition.result = body.result;
            transition
        }
        Outcome::Failed => failure_transition(&job, body.error.as_deref().unwrap_or("unknown error"), body.retryable),
    };
    match state.store.transition(&transition).await? {
        Some(updated) => {
            // Every agent holding a rank of this attempt learns from its next poll that the attempt is over
            // and reports its assignments ended, which frees their devices.
            state.store.cancel_pending_assignments(job.id).await?;
            state.changed().await;
            Ok(Json(ResultAck { state: updated.state }))
        }
        None => Err(ApiError::conflict(format!("job {id} changed state meanwhile; attempt {} is stale", body.attempt))),
    }
}
