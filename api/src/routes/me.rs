//! `GET /v1/me`: who a token acts as (its team, role, label), for clients that show it (the web page).

use axum::extract::State;
use axum::Json;

use crate::auth::User;
use crate::error::ApiResult;
use crate::state::AppState;

pub use ringtrain_views::teams::Me;

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
