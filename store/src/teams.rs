//! Teams and their bearer tokens (stored only as hashes).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ringtrain_core::{TeamId, TokenId};

use crate::error::StoreResult;
pub use ringtrain_views::teams::{Budget, BudgetPeriod, Role, StorageUse, Team, TokenInfo};

/// What a platform admin changes of a team; None leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct TeamChange {
    pub gpu_quota: Option<i32>,
    pub cpu_quota: Option<i32>,
    /// Some(None) goes back to the server's default.
    pub storage_quota_bytes: Option<Option<i64>>,
    pub weight: Option<i32>,
    /// Some(None) removes the budget.
    pub budget: Option<Option<Budget>>,
    /// Replaces the team's data roots.
    pub data_roots: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
pub struct NewTeam {
    pub name: String,
    pub gpu_quota: i32,
    pub cpu_quota: i32,
    pub storage_quota_bytes: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct NewToken {
    pub token_hash: String,
    pub role: Role,
    pub team_id: Option<TeamId>,
    /// Only with role admin.
    pub platform: bool,
    pub label: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

#[async_trait]
pub trait TeamStore: Send + Sync {
    /// Conflict when the name is taken.
    async fn create_team(&self, team: NewTeam) -> StoreResult<Team>;
    async fn get_team(&self, id: TeamId) -> StoreResult<Option<Team>>;
    async fn get_team_by_name(&self, name: &str) -> StoreResult<Option<Team>>;
    async fn list_teams(&self) -> StoreResult<Vec<Team>>;
    /// Changes a team's quotas; None when there is no such team.
    async fn update_team(&self, id: TeamId, change: TeamChange) -> StoreResult<Option<Team>>;
    /// The bytes of the team's datasets and of its jobs' checkpoints.
    async fn storage_use(&self, id: TeamId) -> StoreResult<StorageUse>;
    async fn create_token(&self, token: NewToken) -> StoreResult<TokenInfo>;
    /// The token with this hash, unless revoked (expiry is the caller's to check: [`TokenInfo::is_live`]).
    async fn find_token(&self, token_hash: &str) -> StoreResult<Option<TokenInfo>>;
    async fn get_token(&self, id: TokenId) -> StoreResult<Option<TokenInfo>>;
    /// A team's tokens, or with None the node agents' tokens; revoked ones too, newest first.
    async fn list_tokens(&self, team: Option<TeamId>) -> StoreResult<Vec<TokenInfo>>;
    /// Revokes a token (false: it was already revoked). An agent token's nodes are marked as not heard
    /// from since the epoch, so the scheduler's next pass finds them lost and requeues their ranks.
    async fn revoke_token(&self, id: TokenId, at: DateTime<Utc>) -> StoreResult<bool>;
    /// Records a use of the token.
    async fn touch_token(&self, id: TokenId, at: DateTime<Utc>) -> StoreResult<()>;
}

macro_rules! impl_team_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use ringtrain_core::{TeamId, TokenId};
            use uuid::Uuid;

            use crate::backend::SqlBackend;
            use crate::rows::{TeamRow, TokenRow, TEAM_COLUMNS, TOKEN_COLUMNS};
            use crate::teams::TeamStore;
            use crate::{now, NewTeam, NewToken, StorageUse, StoreResult, Team, TeamChange, TokenInfo};

            #[async_trait::async_trait]
            impl TeamStore for $store {
                async fn create_team(&self, team: NewTeam) -> StoreResult<Team> {
                    let sql = format!(
                        "INSERT INTO teams (id, name, gpu_quota, cpu_quota, storage_quota_bytes, created_at) \
                         VALUES ($1, $2, $3, $4, $5, $6) RETURNING {TEAM_COLUMNS}"
                    );
                    let row: TeamRow = sqlx::query_as(&sql)
                        .bind(Uuid::new_v4())
                        .bind(&team.name)
                        .bind(team.gpu_quota)
                        .bind(team.cpu_quota)
                        .bind(team.storage_quota_bytes)
                        .bind(now())
                        .fetch_one(self.pool())
                        .await?;
                    Ok(row.into())
                }

                async fn get_team(&self, id: TeamId) -> StoreResult<Option<Team>> {
                    let sql = format!("SELECT {TEAM_COLUMNS} FROM teams WHERE id = $1");
                    let row: Option<TeamRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }

                async fn get_team_by_name(&self, name: &str) -> StoreResult<Option<Team>> {
                    let sql = format!("SELECT {TEAM_COLUMNS} FROM teams WHERE name = $1");
                    let row: Option<TeamRow> = sqlx::query_as(&sql).bind(name).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }

                async fn update_team(&self, id: TeamId, change: TeamChange) -> StoreResult<Option<Team>> {
                    let (set_storage, storage) = match change.storage_quota_bytes {
                        Some(quota) => (true, quota),
                        None => (false, None),
                    };
                    let (set_budget, budget) = match change.budget {
                        Some(budget) => (true, budget),
                        None => (false, None),
                    };
                    let sql = format!(
                        "UPDATE teams SET gpu_quota = COALESCE($2, gpu_quota), cpu_quota = COALESCE($3, cpu_quota), \
                         storage_quota_bytes = CASE WHEN $4 THEN $5 ELSE storage_quota_bytes END, \
                         weight = COALESCE($6, weight), \
                         budget_device_hours = CASE WHEN $7 THEN $8 ELSE budget_device_hours END, \
                         budget_period = CASE WHEN $7 THEN $9 ELSE budget_period END, \
                         data_roots = COALESCE($10, data_roots) \
                         WHERE id = $1 RETURNING {TEAM_COLUMNS}"
                    );
                    let row: Option<TeamRow> = sqlx::query_as(&sql)
                        .bind(id.0)
                        .bind(change.gpu_quota)
                        .bind(change.cpu_quota)
                        .bind(set_storage)
                        .bind(storage)
                        .bind(change.weight)
                        .bind(set_budget)
                        .bind(budget.map(|b| b.device_hours))
                        .bind(budget.map(|b| b.period.as_str()))
                        .bind(change.data_roots.map(|roots| serde_json::Value::from(roots).to_string()))
                        .fetch_optional(self.pool())
                        .await?;
                    Ok(row.map(Into::into))
                }

                async fn storage_use(&self, id: TeamId) -> StoreResult<StorageUse> {
                    // models and uploads in parts (at their declared size) count with datasets: all are what
                    // a team uploaded; a data set registered by reference is not on the server
                    let (datasets,): (Option<i64>,) = sqlx::query_as(
                        "SELECT CAST(SUM(size_bytes) AS BIGINT) FROM (SELECT size_bytes FROM datasets \
                         WHERE team_id = $1 AND source IS NULL \
                         UNION ALL SELECT size_bytes FROM models WHERE team_id = $1 \
                         UNION ALL SELECT size_bytes FROM dataset_uploads WHERE team_id = $1) AS uploads",
                    )
                    .bind(id.0)
                    .fetch_one(self.pool())
                    .await?;
                    let (checkpoints,): (Option<i64>,) = sqlx::query_as(
                        "SELECT CAST(SUM(checkpoints.size_bytes) AS BIGINT) FROM checkpoints \
                         JOIN jobs ON jobs.id = checkpoints.job_id WHERE jobs.team_id = $1",
                    )
                    .bind(id.0)
                    .fetch_one(self.pool())
                    .await?;
                    Ok(StorageUse {
                        datasets_bytes: datasets.unwrap_or(0),
                        checkpoints_bytes: checkpoints.unwrap_or(0),
                    })
                }

                async fn list_teams(&self) -> StoreResult<Vec<Team>> {
                    let sql = format!("SELECT {TEAM_COLUMNS} FROM teams ORDER BY name");
                    let rows: Vec<TeamRow> = sqlx::query_as(&sql).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn create_token(&self, token: NewToken) -> StoreResult<TokenInfo> {
                    let sql = format!(
                        "INSERT INTO tokens (id, token_hash, role, team_id, platform, label, created_at, expires_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {TOKEN_COLUMNS}"
                    );
                    let row: TokenRow = sqlx::query_as(&sql)
                        .bind(Uuid::new_v4())
                        .bind(&token.token_hash)
                        .bind(token.role.as_str())
                        .bind(token.team_id.map(|t| t.0))
                        .bind(token.platform)
                        .bind(&token.label)
                        .bind(now())
                        .bind(token.expires_at)
                        .fetch_one(self.pool())
                        .await?;
                    row.try_into()
                }

                async fn find_token(&self, token_hash: &str) -> StoreResult<Option<TokenInfo>> {
                    let sql =
                        format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE token_hash = $1 AND revoked_at IS NULL");
                    let row: Option<TokenRow> =
                        sqlx::query_as(&sql).bind(token_hash).fetch_optional(self.pool()).await?;
                    row.map(TryInto::try_into).transpose()
                }

                async fn get_token(&self, id: TokenId) -> StoreResult<Option<TokenInfo>> {
                    let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = $1");
                    let row: Option<TokenRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    row.map(TryInto::try_into).transpose()
                }

                async fn list_tokens(&self, team: Option<TeamId>) -> StoreResult<Vec<TokenInfo>> {
                    let rows: Vec<TokenRow> = match team {
                        Some(team) => {
                            let sql = format!(
                                "SELECT {TOKEN_COLUMNS} FROM tokens WHERE team_id = $1 ORDER BY created_at DESC, id"
                            );
                            sqlx::query_as(&sql).bind(team.0).fetch_all(self.pool()).await?
                        }
                        None => {
                            let sql = format!(
                                "SELECT {TOKEN_COLUMNS} FROM tokens WHERE team_id IS NULL ORDER BY created_at DESC, id"
                            );
                            sqlx::query_as(&sql).fetch_all(self.pool()).await?
                        }
                    };
                    rows.into_iter().map(TryInto::try_into).collect()
                }

                async fn revoke_token(&self, id: TokenId, at: DateTime<Utc>) -> StoreResult<bool> {
                    let mut tx = self.pool().begin().await?;
                    let revoked = sqlx::query("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                        .bind(at)
                        .bind(id.0)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                        == 1;
                    let long_ago = DateTime::<Utc>::UNIX_EPOCH;
                    sqlx::query("UPDATE nodes SET last_heartbeat = $1 WHERE agent_token_id = $2 AND state = 'up'")
                        .bind(long_ago)
                        .bind(id.0)
                        .execute(&mut *tx)
                        .await?;
                    if let (true, Some(announce)) = (revoked, <Self as SqlBackend>::ANNOUNCE_TOKEN_REVOKED) {
                        sqlx::query(announce).execute(&mut *tx).await?;
                    }
                    tx.commit().await?;
                    Ok(revoked)
                }

                async fn touch_token(&self, id: TokenId, at: DateTime<Utc>) -> StoreResult<()> {
                    sqlx::query("UPDATE tokens SET last_used_at = $1 WHERE id = $2")
                        .bind(at)
                        .bind(id.0)
                        .execute(self.pool())
                        .await?;
                    Ok(())
                }
            }
        };
    };
}

pub(crate) use impl_team_store;
