//! Tokens: minted for a team (its admins, or a platform admin) or for node agents (platform admins), listed
//! without their secrets, and revoked. The token itself is shown once, when it is made; only its sha256 is
//! stored.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use ringtrain_core::{FieldError, TeamId, TokenId};
use ringtrain_store::{generate_token, hash_token, NewToken, Role, TokenInfo};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, JsonBody};
use crate::state::AppState;

pub use ringtrain_views::teams::{CreatedToken, TokenList};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// admin | member | viewer
    #[schema(value_type = String, pattern = "^(admin|member|viewer)$")]
    pub role: Role,
    /// Who or what the token is for; shown in events ("cancelled by ..."). At most 200 characters, no
    /// control characters.
    #[schema(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    pub label: Option<String>,
    /// When the token stops working (RFC 3339, in the future); never when absent.
    pub expires_at: Option<DateTime<Utc>>,
    /// A platform admin token (role admin; only a platform admin may make one).
    #[serde(default)]
    pub platform: bool,
}

fn check_label_and_expiry(label: &Option<String>, expires_at: Option<DateTime<Utc>>) -> ApiResult<()> {
    let mut errors = Vec::new();
    if label.as_ref().is_some_and(|l| l.chars().count() > 200 || l.chars().any(char::is_control)) {
        errors.push(FieldError::new("label", "must be at most 200 characters, without control characters"));
    }
    if expires_at.is_some_and(|at| at <= ringtrain_store::now()) {
        errors.push(FieldError::new("expires_at", "must be in the future"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::validation(errors))
    }
}

/// Create a token for a team (the team's admins, or a platform admin).
#[utoipa::path(post, path = "/v1/teams/{id}/tokens", tag = "tokens", params(("id" = Uuid, Path)),
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
    user.require_admin_of(team_id)?;
    if body.role == Role::Agent {
        return Err(ApiError::validation(vec![FieldError::new(
            "role",
            "must be admin, member or viewer (agent tokens come from POST /v1/agent-tokens)",
        )]));
    }
    if body.platform {
        user.require_platform_admin()?;
        if body.role != Role::Admin {
            return Err(ApiError::validation(vec![FieldError::new(
                "platform",
                "only an admin token can be a platform admin",
            )]));
        }
    }
    check_label_and_expiry(&body.label, body.expires_at)?;
    if state.store.get_team(team_id).await?.is_none() {
        return Err(ApiError::not_found(format!("no team {team_id}")));
    }
    let token = generate_token();
    let new = NewToken {
        token_hash: hash_token(&token),
        role: body.role,
        team_id: Some(team_id),
        platform: body.platform,
        label: body.label,
        expires_at: body.expires_at,
    };
    let info = state.store.create_token(new).await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, info })))
}

/// A team's tokens, without their secrets (the team's admins, or a platform admin; platform tokens are listed
/// to platform admins only).
#[utoipa::path(get, path = "/v1/teams/{id}/tokens", tag = "tokens", params(("id" = Uuid, Path)),
    responses((status = 200, body = TokenList),
        (status = 403),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn list_team_tokens(
    State(state): State<AppState>,
    user: User,
    ApiPath(team_id): ApiPath<TeamId>,
) -> ApiResult<Json<TokenList>> {
    user.require_admin_of(team_id)?;
    if state.store.get_team(team_id).await?.is_none() {
        return Err(ApiError::not_found(format!("no team {team_id}")));
    }
    let tokens = state.store.list_tokens(Some(team_id)).await?;
    Ok(Json(TokenList { tokens: tokens.into_iter().filter(|token| may_see(&user, token)).collect() }))
}

/// A platform token (the bootstrap one lives in team `default`) is above every team: to a team admin it does
/// not exist, so that admin can neither list nor revoke it and lock the platform out.
fn may_see(user: &User, token: &TokenInfo) -> bool {
    !token.platform || user.is_platform_admin()
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAgentToken {
    #[schema(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    pub label: Option<String>,
    /// When the token stops working (RFC 3339, in the future); never when absent.
    pub expires_at: Option<DateTime<Utc>>,
}

/// Create a node agent's token (platform admin).
#[utoipa::path(post, path = "/v1/agent-tokens", tag = "tokens", request_body = CreateAgentToken,
    responses((status = 201, body = CreatedToken),
        (status = 403),
        (status = 422)),
    security(("bearer" = [])))]
pub async fn create_agent_token(
    State(state): State<AppState>,
    user: User,
    JsonBody(body): JsonBody<CreateAgentToken>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    user.require_platform_admin()?;
    check_label_and_expiry(&body.label, body.expires_at)?;
    let token = generate_token();
    let new = NewToken {
        token_hash: hash_token(&token),
        role: Role::Agent,
        team_id: None,
        platform: false,
        label: body.label,
        expires_at: body.expires_at,
    };
    let info = state.store.create_token(new).await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, info })))
}

/// The node agents' tokens, without their secrets (platform admin).
#[utoipa::path(get, path = "/v1/agent-tokens", tag = "tokens",
    responses((status = 200, body = TokenList),
        (status = 403)),
    security(("bearer" = [])))]
pub async fn list_agent_tokens(State(state): State<AppState>, user: User) -> ApiResult<Json<TokenList>> {
    user.require_platform_admin()?;
    Ok(Json(TokenList { tokens: state.store.list_tokens(None).await? }))
}

/// Revoke a token: its next request is 401. A team's tokens: the team's admins or a platform admin; a platform
/// token: a platform admin (to anyone else it is 404); an agent's: a platform admin (its nodes are then lost,
/// and their ranks requeued, at the scheduler's next pass). Revoking a revoked token changes nothing.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens", params(("id" = Uuid, Path)),
    responses((status = 204, description = "Revoked"),
        (status = 403),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn revoke_token(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<TokenId>,
) -> ApiResult<StatusCode> {
    if user.role() != Role::Admin {
        return Err(ApiError::forbidden("only an admin token can revoke tokens"));
    }
    let token = state
        .store
        .get_token(id)
        .await?
        .filter(|token| may_see(&user, token))
        .ok_or_else(|| ApiError::not_found(format!("no token {id}")))?;
    match token.team_id {
        Some(team) => user.require_admin_of(team).map_err(|_| ApiError::not_found(format!("no token {id}")))?,
        None => user.require_platform_admin()?,
    }
    state.store.revoke_token(id, ringtrain_store::now()).await?;
    // this server's cache at once; the others' when the revocation's announcement reaches them
    state.tokens.revoked();
    tracing::info!(token = %id, by = %user.token.id, "token revoked");
    Ok(StatusCode::NO_CONTENT)
}
