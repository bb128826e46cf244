//! Tenancy: teams with quotas (platform admins), and the worker pool's nodes. Tokens: [`super::tokens`].

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use ringtrain_core::FieldError;
use ringtrain_store::{NewTeam, Node, Team};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::JsonBody;
use crate::state::AppState;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTeam {
    /// 1 to 64 characters: lowercase letters, digits, `-` and `_`.
    pub name: String,
    /// GPUs the team's jobs may hold at once.
    pub gpu_quota: u32,
    /// CPU devices the team's jobs may hold at once.
    pub cpu_quota: u32,
}

const MAX_QUOTA: u32 = 1_000_000;

fn validate_team(body: &CreateTeam) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    let name_ok = (1..=64).contains(&body.name.len())
        && body.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !name_ok {
        errors.push(FieldError::new("name", "must be 1 to 64 characters of a-z, 0-9, - and _"));
    }
    for (path, quota) in [("gpu_quota", body.gpu_quota), ("cpu_quota", body.cpu_quota)] {
        if quota > MAX_QUOTA {
            errors.push(FieldError::new(path, format!("must be at most {MAX_QUOTA} (got {quota})")));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Create a team (platform admin).
#[utoipa::path(post, path = "/v1/teams", tag = "teams", request_body = CreateTeam,
    responses((status = 201, body = Team), (status = 403),
        (status = 409, description = "Name taken"),
        (status = 422)),
    security(("bearer" = [])))]
pub async fn create_team(
    State(state): State<AppState>,
    user: User,
    JsonBody(body): JsonBody<CreateTeam>,
) -> ApiResult<(StatusCode, Json<Team>)> {
    user.require_platform_admin()?;
    validate_team(&body).map_err(ApiError::validation)?;
    let name = body.name.clone();
    let team = state
        .store
        .create_team(NewTeam { name: body.name, gpu_quota: body.gpu_quota as i32, cpu_quota: body.cpu_quota as i32 })
        .await
        .map_err(|e| match e {
            ringtrain_store::StoreError::Conflict(_) => ApiError::conflict(format!("a team named {name:?} exists")),
            other => other.into(),
        })?;
    Ok((StatusCode::CREATED, Json(team)))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TeamList {
    pub teams: Vec<Team>,
}

/// Teams: every team for a platform admin, its own for a team admin.
#[utoipa::path(get, path = "/v1/teams", tag = "teams",
    responses((status = 200, body = TeamList),
        (status = 403)),
    security(("bearer" = [])))]
pub async fn list_teams(State(state): State<AppState>, user: User) -> ApiResult<Json<TeamList>> {
    user.require_admin_of(user.team_id)?;
    let mut teams = state.store.list_teams().await?;
    if !user.is_platform_admin() {
        teams.retain(|t| user.owns(t.id));
    }
    Ok(Json(TeamList { teams }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<Node>,
}

/// The worker pool: nodes and their devices (any user token).
#[utoipa::path(get, path = "/v1/nodes", tag = "teams",
    responses((status = 200, body = NodeList),
        (status = 401)),
    security(("bearer" = [])))]
pub async fn list_nodes(State(state): State<AppState>, _user: User) -> ApiResult<Json<NodeList>> {
    Ok(Json(NodeList { nodes: state.store.list_nodes().await? }))
}
