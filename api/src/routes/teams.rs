//! Tenancy: teams with quotas (platform admins). Tokens: [`super::tokens`]; the pool: [`super::nodes`].

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use ringtrain_core::{FieldError, TeamId};
use ringtrain_store::{Budget, NewTeam, Team, TeamChange};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, JsonBody};
use crate::state::AppState;

pub use ringtrain_views::teams::{TeamList, TeamStorage};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTeam {
    /// 1 to 64 characters: lowercase letters, digits, `-` and `_`.
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9_-]+$")]
    pub name: String,
    /// GPUs the team's jobs may hold at once.
    #[schema(maximum = 1_000_000)]
    pub gpu_quota: u32,
    /// CPU devices the team's jobs may hold at once.
    #[schema(maximum = 1_000_000)]
    pub cpu_quota: u32,
    /// Bytes of datasets and checkpoints the team may keep (default: the server's `--team-storage-bytes`).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_u64)]
    pub storage_quota_bytes: Option<u64>,
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
    check_storage_quota(body.storage_quota_bytes)?;
    let name = body.name.clone();
    let team = state
        .store
        .create_team(NewTeam {
            name: body.name,
            gpu_quota: body.gpu_quota as i32,
            cpu_quota: body.cpu_quota as i32,
            storage_quota_bytes: body.storage_quota_bytes.map(storage_bytes),
        })
        .await
        .map_err(|e| match e {
            ringtrain_store::StoreError::Conflict(_) => ApiError::conflict(format!("a team named {name:?} exists")),
            other => other.into(),
        })?;
    Ok((StatusCode::CREATED, Json(team)))
}

/// A byte count as stored (checked to be at most i64::MAX).
fn storage_bytes(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// A storage quota is stored as a signed 64-bit count.
fn check_storage_quota(quota: Option<u64>) -> ApiResult<()> {
    match quota {
        Some(bytes) if i64::try_from(bytes).is_err() => Err(ApiError::validation(vec![FieldError::new(
            "storage_quota_bytes",
            format!("must be at most {}", i64::MAX),
        )])),
        _ => Ok(()),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateTeam {
    /// GPUs the team's jobs may hold at once.
    #[schema(maximum = 1_000_000)]
    pub gpu_quota: Option<u32>,
    /// CPU devices the team's jobs may hold at once.
    #[schema(maximum = 1_000_000)]
    pub cpu_quota: Option<u32>,
    /// Bytes of datasets and checkpoints the team may keep; null: back to the server's default.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 9_223_372_036_854_775_807_u64)]
    pub storage_quota_bytes: Option<Option<u64>>,
    /// The team's weight in the division of idle capacity beyond guarantees (weighted fair share), 1 to
    /// 1000; 1 by default.
    #[schema(minimum = 1, maximum = 1000)]
    pub weight: Option<u32>,
    /// Device-hours the team's jobs may use per period (its queued jobs wait with `budget_exhausted` once
    /// used); null removes the budget.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Budget>)]
    pub budget: Option<Option<Budget>>,
    /// Folders on the nodes' shared filesystems the team's `idx:` and `shards:` data sets may lie under
    /// (at most 32); replaces the list. Every team may also use the server's `--idx-root` folders.
    #[schema(max_items = 32)]
    pub data_roots: Option<Vec<DataRoot>>,
}

/// An absolute folder, none of whose parts starts with a dot (so no `.` or `..`), not `/` itself; or a
/// bucket or a prefix in one, `s3://BUCKET[/PREFIX]`; at most 4,096 bytes.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(
    value_type = String,
    pattern = "^((/[^/.\\u0000][^/\\u0000]*)+|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^/.\\u0000][^/\\u0000]*)*/?)$"
)]
pub struct DataRoot(pub String);

/// A field that is present (even as null) is `Some`; an absent one stays `None` (`#[serde(default)]`).
fn present<'de, T: Deserialize<'de>, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

const MAX_WEIGHT: u32 = 1000;

/// Data roots a team may be granted.
const MAX_DATA_ROOTS: usize = 32;

/// Change a team's quotas (platform admin): devices at once, storage, its fair-share weight, its budget
/// of device-hours, and the folders its `idx:` and `shards:` data sets may lie under.
#[utoipa::path(patch, path = "/v1/teams/{id}", tag = "teams", params(("id" = TeamId, Path)), request_body = UpdateTeam,
    responses((status = 200, body = Team), (status = 403), (status = 404), (status = 422)),
    security(("bearer" = [])))]
pub async fn update_team(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<TeamId>,
    JsonBody(body): JsonBody<UpdateTeam>,
) -> ApiResult<Json<Team>> {
    user.require_platform_admin()?;
    let mut errors = Vec::new();
    for (path, quota) in [("gpu_quota", body.gpu_quota), ("cpu_quota", body.cpu_quota)] {
        if quota.is_some_and(|q| q > MAX_QUOTA) {
            errors.push(FieldError::new(path, format!("must be at most {MAX_QUOTA}")));
        }
    }
    if body.weight.is_some_and(|w| !(1..=MAX_WEIGHT).contains(&w)) {
        errors.push(FieldError::new("weight", format!("must be 1 to {MAX_WEIGHT}")));
    }
    if let Some(Some(budget)) = body.budget {
        if !(budget.device_hours.is_finite() && (0.0001..=1e9).contains(&budget.device_hours)) {
            errors.push(FieldError::new("budget.device_hours", "must be 0.0001 to 1e9"));
        }
    }
    for (i, DataRoot(root)) in body.data_roots.iter().flatten().enumerate() {
        if let Err(why) = ringtrain_core::dataset::check_data_root(root) {
            errors.push(FieldError::new(format!("data_roots[{i}]"), why));
        }
    }
    if body.data_roots.as_ref().is_some_and(|roots| roots.len() > MAX_DATA_ROOTS) {
        errors.push(FieldError::new("data_roots", format!("at most {MAX_DATA_ROOTS} folders")));
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    check_storage_quota(body.storage_quota_bytes.flatten())?;
    let change = TeamChange {
        gpu_quota: body.gpu_quota.map(|q| q as i32),
        cpu_quota: body.cpu_quota.map(|q| q as i32),
        storage_quota_bytes: body.storage_quota_bytes.map(|quota| quota.map(storage_bytes)),
        weight: body.weight.map(|w| w as i32),
        budget: body.budget,
        data_roots: body.data_roots.map(|roots| roots.into_iter().map(|DataRoot(root)| root).collect()),
    };
    let team =
        state.store.update_team(id, change).await?.ok_or_else(|| ApiError::not_found(format!("no team {id}")))?;
    // quotas changed: the scheduler's next pass sees them
    state.changed().await;
    Ok(Json(team))
}

/// The team's storage: its quota and what its datasets and checkpoints take (the team's own tokens, or a
/// platform admin).
#[utoipa::path(get, path = "/v1/teams/{id}/storage", tag = "teams", params(("id" = TeamId, Path)),
    responses((status = 200, body = TeamStorage), (status = 404)),
    security(("bearer" = [])))]
pub async fn team_storage(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<TeamId>,
) -> ApiResult<Json<TeamStorage>> {
    let visible = user.owns(id) || user.is_platform_admin();
    if !visible || state.store.get_team(id).await?.is_none() {
        return Err(ApiError::not_found(format!("no team {id}")));
    }
    let used = state.store.storage_use(id).await?;
    Ok(Json(TeamStorage {
        quota_bytes: crate::storage::quota(&state, id).await?,
        used_bytes: used.total(),
        datasets_bytes: used.datasets_bytes,
        checkpoints_bytes: used.checkpoints_bytes,
        checkpoints_kept_per_job: state.config.keep_checkpoints,
    }))
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
