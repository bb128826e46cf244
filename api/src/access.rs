//! Who may touch what: the lookups every route starts with. A user sees only its own team's jobs; an agent
//! only its own nodes, the assignments on them, and the jobs it holds a rank of. Anything else is 404, so a
//! caller cannot tell another team's job from no job at all. A store failure stays a store failure (503),
//! never a 404.

use ringtrain_core::{AssignmentId, AssignmentState, DatasetId, DatasetRef, JobId, NodeId};
use ringtrain_store::{Assignment, Job, Node};

use crate::auth::{Agent, User};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The caller's team's job, or 404.
pub async fn team_job(state: &AppState, user: &User, id: JobId) -> ApiResult<Job> {
    match state.store.get_job(id).await? {
        Some(job) if user.owns(job.team_id) => Ok(job),
        _ => Err(ApiError::not_found(format!("no job {id}"))),
    }
}

/// This agent's node, or 404.
pub async fn own_node(state: &AppState, agent: &Agent, id: NodeId) -> ApiResult<Node> {
    match state.store.get_node(id).await? {
        Some(node) if node.agent_token_id == agent.token.id => Ok(node),
        _ => Err(ApiError::not_found(format!("no node {id} of this agent"))),
    }
}

/// An assignment on one of this agent's nodes, or 404.
pub async fn own_assignment(state: &AppState, agent: &Agent, id: AssignmentId) -> ApiResult<Assignment> {
    let not_found = || ApiError::not_found(format!("no assignment {id}"));
    let assignment = state.store.get_assignment(id).await?.ok_or_else(not_found)?;
    let node = state.store.get_node(assignment.node_id).await?;
    match node {
        Some(node) if node.agent_token_id == agent.token.id => Ok(assignment),
        _ => Err(not_found()),
    }
}

/// The job, if this agent holds an assignment of `attempt` of it; else 404.
pub async fn assigned_job(state: &AppState, agent: &Agent, id: JobId, attempt: i32) -> ApiResult<Job> {
    let not_found = || ApiError::not_found(format!("no job {id} attempt {attempt} assigned to this agent"));
    let job = state.store.get_job(id).await?.ok_or_else(not_found)?;
    let assignments = state.store.job_assignments(job.id, attempt).await?;
    let mut nodes: Vec<NodeId> = assignments.iter().map(|a| a.node_id).collect();
    nodes.dedup();
    for node in nodes {
        if state.store.get_node(node).await?.is_some_and(|n| n.agent_token_id == agent.token.id) {
            return Ok(job);
        }
    }
    Err(not_found())
}

/// The job, if this agent holds rank 0 of its attempt `attempt`; else 404. Only that agent reports a
/// success and uploads checkpoints: any other agent could otherwise choose the job's result or every later
/// placement's resume point.
pub async fn rank_zero_job(state: &AppState, agent: &Agent, id: JobId, attempt: i32) -> ApiResult<Job> {
    let not_found = || ApiError::not_found(format!("no job {id} attempt {attempt} with rank 0 on this agent"));
    let job = state.store.get_job(id).await?.ok_or_else(not_found)?;
    let assignments = state.store.job_assignments(job.id, attempt).await?;
    let Some(rank_zero) = assignments.iter().find(|a| a.rank == 0) else { return Err(not_found()) };
    match state.store.get_node(rank_zero.node_id).await? {
        Some(node) if node.agent_token_id == agent.token.id => Ok(job),
        _ => Err(not_found()),
    }
}

/// Whether this agent holds a live rank of a job that trains on uploaded dataset `dataset`: the only time
/// it may download it.
pub async fn agent_uses_dataset(state: &AppState, agent: &Agent, dataset: DatasetId) -> ApiResult<bool> {
    let wanted = DatasetRef::Uploaded(dataset);
    for node in state.store.list_nodes().await?.into_iter().filter(|n| n.agent_token_id == agent.token.id) {
        for assignment in state.store.node_assignments(node.id, &AssignmentState::LIVE).await? {
            let job = state.store.get_job(assignment.job_id).await?;
            let Some(job) = job.filter(|j| j.attempt == assignment.attempt) else { continue };
            if job.spec.dataset == wanted {
                return Ok(true);
            }
        }
    }
    Ok(false)
}
