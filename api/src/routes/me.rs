//! `GET /v1/me`: who a token acts as (its team, role, label), for clients that show it (the web page).

use axum::extract::State;
use axum::Json;
use ringtrain_core::{TeamId, TokenId};
use ringtrain_store::Role;
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::User;
use crate::error::ApiResult;
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Me {
    pub token_id: TokenId,
    pub role: Role,
    pub team_id: TeamId,
    pub team_name: String,
    /// A platform admin (manages every team and the node agents' tokens).
    pub platform: bool,
    pub label: Option<String>,
    /// The team's guarantee: devices of each kind it may always hold (it may borrow idle ones beyond).
    pub gpu_quota: i32,
    pub cpu_quota: i32,
}

/// The calling token: its team (and the team's quotas), role and label.
#[utoipa::path(get, path = "/v1/me", tag = "tokens",
    responses((status = 200, body = Me), (status = 401)),
    security(("bearer" = [])))]
pub async fn me(State(state): State<AppState>, user: User) -> ApiResult<Json<Me>> {
    let team = state.store.get_team(user.team_id).await?;
    let (team_name, gpu_quota, cpu_quota) = team.map_or((String::new(), 0, 0), |t| (t.name, t.gpu_quota, t.cpu_quota));
    Ok(Json(Me {
        token_id: user.token.id,
        role: user.role(),
        team_id: user.team_id,
        team_name,
        platform: user.is_platform_admin(),
        label: user.token.label.clone(),
        gpu_quota,
        cpu_quota,
    }))
}
