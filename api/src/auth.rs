//! Bearer-token authentication. Tokens are looked up by their sha256, in this server's cache of confirmed
//! tokens while it hears revocations ([`crate::token_cache`]), else in the database; the extractors below give handlers
//! the caller's role and team. Missing, unknown, revoked or expired tokens are 401; a token used outside its
//! kind (an agent token on a user route or the other way round) is 403.
//!
//! Who may do what: a platform admin (the bootstrap token, or one it made) creates teams, sets quotas, mints
//! agent tokens and manages every team's tokens; a team admin manages its own team's tokens; members submit
//! and cancel; viewers read. Every user token acts inside its own team only.

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts};
use ringtrain_core::TeamId;
use ringtrain_store::{hash_token, Role, TokenInfo};

use crate::error::ApiError;
use crate::state::AppState;
use crate::token_cache::Found;

async fn authenticate(parts: &Parts, state: &AppState) -> Result<TokenInfo, ApiError> {
    let header = parts
        .headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer <token>"))?;
    let value = header.to_str().map_err(|_| ApiError::unauthorized("malformed Authorization header"))?;
    let token = match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => token.trim(),
        _ => return Err(ApiError::unauthorized("the Authorization header must be `Bearer <token>`")),
    };
    let token_hash = hash_token(token);
    let info = match state.tokens.find(&token_hash) {
        Found::Cached(info) => info,
        Found::Unknown(fill) => {
            let Some(info) = state.store.find_token(&token_hash).await? else {
                state.admission.disprove(token);
                return Err(ApiError::unauthorized("unknown or revoked token"));
            };
            state.tokens.fill(fill, &token_hash, &info);
            info
        }
    };
    let now = ringtrain_store::now();
    if !info.is_live(now) {
        state.admission.disprove(token);
        return Err(ApiError::unauthorized("this token has expired"));
    }
    // admission gives the next requests with this token their pool (an agent's own) without a lookup
    state.admission.prove(token, info.role == Role::Agent);
    // last use, to the minute: no write on every request
    if info.last_used_at.is_none_or(|at| now - at > chrono::Duration::seconds(60)) {
        state.store.touch_token(info.id, now).await?;
        state.tokens.used(&token_hash, now);
    }
    Ok(info)
}

/// A user token: admin, member or viewer of one team.
#[derive(Debug, Clone)]
pub struct User {
    pub token: TokenInfo,
    pub team_id: TeamId,
}

impl User {
    pub fn role(&self) -> Role {
        self.token.role
    }

    /// Members and admins change their team's jobs and datasets; viewers only read.
    pub fn require_write(&self) -> Result<(), ApiError> {
        if self.role().can_write() {
            Ok(())
        } else {
            Err(ApiError::forbidden("this token is a viewer's: it can read but not submit, cancel or upload"))
        }
    }

    pub fn is_platform_admin(&self) -> bool {
        self.token.platform && self.role() == Role::Admin
    }

    /// Creating teams, setting quotas and minting agent tokens are the platform admin's.
    pub fn require_platform_admin(&self) -> Result<(), ApiError> {
        if self.is_platform_admin() {
            Ok(())
        } else {
            Err(ApiError::forbidden(
                "only a platform admin can create teams, set quotas and manage agent tokens (a team admin manages its own team's tokens)",
            ))
        }
    }

    /// Managing `team`'s tokens: its own admins and platform admins. Another team does not exist for a team
    /// admin (404, as for its jobs); members and viewers are refused (403).
    pub fn require_admin_of(&self, team: TeamId) -> Result<(), ApiError> {
        if self.is_platform_admin() || (self.role() == Role::Admin && self.owns(team)) {
            Ok(())
        } else if self.role() == Role::Admin {
            Err(ApiError::not_found(format!("no team {team}")))
        } else {
            Err(ApiError::forbidden("only an admin token can manage tokens"))
        }
    }

    /// Another team's objects do not exist for this caller: 404, never 403, so ids of other teams' objects
    /// cannot be probed.
    pub fn owns(&self, team_id: TeamId) -> bool {
        self.team_id == team_id
    }
}

impl FromRequestParts<AppState> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let token = authenticate(parts, state).await?;
        match token.team_id {
            Some(team_id) if token.role != Role::Agent => Ok(User { team_id, token }),
            _ => Err(ApiError::forbidden("agent tokens may only call /v1/agent routes")),
        }
    }
}

/// A node agent's token.
#[derive(Debug, Clone)]
pub struct Agent {
    pub token: TokenInfo,
}

impl FromRequestParts<AppState> for Agent {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let token = authenticate(parts, state).await?;
        if token.role == Role::Agent {
            Ok(Agent { token })
        } else {
            Err(ApiError::forbidden("the /v1/agent routes need an agent token"))
        }
    }
}
