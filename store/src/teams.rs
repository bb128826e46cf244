//! Teams and their bearer tokens (stored only as hashes).

use async_trait::async_trait;
use ringtrain_core::TeamId;

use crate::error::StoreResult;
use crate::model::{NewTeam, NewToken, Team, TokenInfo};

#[async_trait]
pub trait TeamStore: Send + Sync {
    /// Conflict when the name is taken.
    async fn create_team(&self, team: NewTeam) -> StoreResult<Team>;
    async fn get_team(&self, id: TeamId) -> StoreResult<Option<Team>>;
    async fn get_team_by_name(&self, name: &str) -> StoreResult<Option<Team>>;
    async fn list_teams(&self) -> StoreResult<Vec<Team>>;
    async fn create_token(&self, token: NewToken) -> StoreResult<TokenInfo>;
    /// The live (not revoked) token with this hash.
    async fn find_token(&self, token_hash: &str) -> StoreResult<Option<TokenInfo>>;
}

macro_rules! impl_team_store {
    ($store:ty) => {
        const _: () = {
            use ringtrain_core::TeamId;
            use uuid::Uuid;

            use crate::backend::SqlBackend;
            use crate::rows::{TeamRow, TokenRow, TEAM_COLUMNS, TOKEN_COLUMNS};
            use crate::teams::TeamStore;
            use crate::{now, NewTeam, NewToken, StoreResult, Team, TokenInfo};

            #[async_trait::async_trait]
            impl TeamStore for $store {
                async fn create_team(&self, team: NewTeam) -> StoreResult<Team> {
                    let sql = format!(
                        "INSERT INTO teams (id, name, gpu_quota, cpu_quota, created_at) VALUES ($1, $2, $3, $4, $5) \
                         RETURNING {TEAM_COLUMNS}"
                    );
                    let row: TeamRow = sqlx::query_as(&sql)
                        .bind(Uuid::new_v4())
                        .bind(&team.name)
                        .bind(team.gpu_quota)
                        .bind(team.cpu_quota)
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

                async fn list_teams(&self) -> StoreResult<Vec<Team>> {
                    let sql = format!("SELECT {TEAM_COLUMNS} FROM teams ORDER BY name");
                    let rows: Vec<TeamRow> = sqlx::query_as(&sql).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn create_token(&self, token: NewToken) -> StoreResult<TokenInfo> {
                    let sql = format!(
                        "INSERT INTO tokens (id, token_hash, role, team_id, label, created_at) \
                         VALUES ($1, $2, $3, $4, $5, $6) RETURNING {TOKEN_COLUMNS}"
                    );
                    let row: TokenRow = sqlx::query_as(&sql)
                        .bind(Uuid::new_v4())
                        .bind(&token.token_hash)
                        .bind(token.role.as_str())
                        .bind(token.team_id.map(|t| t.0))
                        .bind(&token.label)
                        .bind(now())
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
            }
        };
    };
}

pub(crate) use impl_team_store;
