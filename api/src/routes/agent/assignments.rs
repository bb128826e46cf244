//! The ranks placed on a node: the long poll that hands them out (and says which to stop or checkpoint),
//! rank 0's rendezvous endpoint, and the agent's reports of each rank's progress
//! (delivered → running → done | failed | cancelled).

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use ringtrain_core::{AssignmentId, AssignmentState, FieldError, NodeId};
use ringtrain_protocol::{AssignmentUpdate, EndpointReport, Poll, PollQuery};
use ringtrain_store::Assignment;

use crate::access::{own_assignment, own_node};
use crate::auth::Agent;
use crate::dispatch;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, ApiQuery, JsonBody};
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
        dispatch::wait_for_change(&state, since, wait).await?;
    }
    Ok(Json(dispatch::poll(&state, &node).await?))
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
