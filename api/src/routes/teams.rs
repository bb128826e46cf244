//! Tenancy: teams with quotas and their tokens (admin only), agent tokens, and the worker pool's nodes.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use ringtrain_core::{FieldError, TeamId};
use ringtrain_store::{generate_token, hash_token, NewTeam, NewToken, Node, Role, Team, TokenInfo};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, JsonBody};
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

/// Create a team (admin).
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
    user.require_admin()?;
    validate_team(&body).map_err(ApiError::validation)?;
    let team = state
        .store
        .create_team(NewTeam { name: body.name, gpu_quota: body.gpu_quota as i32, cpu_quota: body.cpu_quota as i32 })
        .await?;
    Ok((StatusCode::CREATED, Json(team)))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TeamList {
    pub teams: Vec<Team>,
}

/// Every team (admin).
#[utoipa::path(get, path = "/v1/teams", tag = "teams",
    responses((status = 200, body = TeamList),
        (status = 403)),
    security(("bearer" = [])))]
pub async fn list_teams(State(state): State<AppState>, user: User) -> ApiResult<Json<TeamList>> {
    user.require_admin()?;
    Ok(Json(TeamList { teams: state.store.list_teams().await? }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// admin | member | viewer
    #[schema(value_type = String)]
    pub role: Role,
    /// Who or what the token is for; shown in events ("cancelled by ...").
    pub label: Option<String>,
}

/// A new token: `token` is shown this once and never again.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedToken {
    pub token: String,
    pub info: TokenInfo,
}

fn check_label(label: &Option<String>) -> ApiResult<()> {
    match label {
        Some(l) if l.chars().count() > 200 || l.chars().any(char::is_control) => {
            Err(ApiError::validation(vec![FieldError::new(
                "label",
                "must be at most 200 characters, without control characters",
            )]))
        }
        _ => Ok(()),
    }
}

/// Create a token for a team (admin).
#[utoipa::path(post, path = "/v1/teams/{id}/tokens", tag = "teams", params(("id" = Uuid, Path)),
    request_body = CreateToken,
    responses((status = 201, body = CreatedToken),
        (status = 403),
        (status = 404),
        (status = 422)),
    security(("bearer" = [])))]
pub async fn create_team_token(
    State(state): State<AppState>,
    user: User,
    ApiPath(team_id): ApiPath<TeamId>,
    JsonBody(body): JsonBody<CreateToken>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    user.require_admin()?;
    if body.role == Role::Agent {
        return Err(ApiError::validation(vec![FieldError::new(
            "role",
            "must be admin, member or viewer (agent tokens come from POST /v1/agent-tokens)",
        )]));
    }
    check_label(&body.label)?;
    if state.store.get_team(team_id).await?.is_none() {
        return Err(ApiError::not_found(format!("no team {team_id}")));
    }
    let token = generate_token();
    let info = state
        .store
        .create_token(NewToken {
            token_hash: hash_token(&token),
            role: body.role,
            team_id: Some(team_id),
            label: body.label,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, info })))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAgentToken {
    pub label: Option<String>,
}

/// Create a node agent's token (admin).
#[utoipa::path(post, path = "/v1/agent-tokens", tag = "teams", request_body = CreateAgentToken,
    responses((status = 201, body = CreatedToken),
        (status = 403)),
    security(("bearer" = [])))]
pub async fn create_agent_token(
    State(state): State<AppState>,
    user: User,
    JsonBody(body): JsonBody<CreateAgentToken>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    user.require_admin()?;
    check_label(&body.label)?;
    let token = generate_token();
    let info = state
        .store
        .create_token(NewToken { token_hash: hash_token(&token), role: Role::Agent, team_id: None, label: body.label })
        .await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, info })))
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
