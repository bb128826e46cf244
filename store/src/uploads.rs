//! Data set uploads in parts: an upload declared with its size and name, whose parts arrive (and may be
//! sent again) one request each, and which becomes a data set once whole. A row holds what was declared;
//! the parts received are the server's files or objects themselves (kept only once their checksum held),
//! so the row never needs a write per part. Its declared size counts against the team's storage quota from
//! the start (see `TeamStore::storage_use`), so parts never take a team past it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ringtrain_core::TeamId;
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::StoreResult;

/// An upload in parts, as declared.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Upload {
    pub id: Uuid,
    pub team_id: TeamId,
    /// The data set's name once whole.
    pub name: String,
    /// The whole file's size.
    pub size_bytes: i64,
    /// Every part's size but the last's (which is the rest).
    pub part_bytes: i64,
    pub created_at: DateTime<Utc>,
}

impl Upload {
    /// How many parts make the file: at least one (an empty file is one empty part).
    pub fn parts(&self) -> i64 {
        let part = self.part_bytes.max(1);
        (self.size_bytes.max(0) + part - 1).div_euclid(part).max(1)
    }

    /// The size part `number` (from 1) must have.
    pub fn part_size(&self, number: i64) -> i64 {
        if number < self.parts() {
            self.part_bytes
        } else {
            self.size_bytes - self.part_bytes * (self.parts() - 1)
        }
    }
}

#[async_trait]
pub trait UploadStore: Send + Sync {
    async fn add_upload(&self, upload: Upload) -> StoreResult<Upload>;
    async fn get_upload(&self, id: Uuid) -> StoreResult<Option<Upload>>;
    /// A team's uploads in progress, oldest first.
    async fn list_uploads(&self, team: TeamId) -> StoreResult<Vec<Upload>>;
    /// Forgets an upload; returns it (its parts are the caller's to remove), None if there was none.
    async fn delete_upload(&self, id: Uuid) -> StoreResult<Option<Upload>>;
    /// Every team's uploads started before `before`, oldest first (abandoned ones, to expire).
    async fn uploads_started_before(&self, before: DateTime<Utc>) -> StoreResult<Vec<Upload>>;
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct UploadRow {
    id: Uuid,
    team_id: Uuid,
    name: String,
    size_bytes: i64,
    part_bytes: i64,
    created_at: DateTime<Utc>,
}

impl From<UploadRow> for Upload {
    fn from(row: UploadRow) -> Self {
        Upload {
            id: row.id,
            team_id: TeamId(row.team_id),
            name: row.name,
            size_bytes: row.size_bytes,
            part_bytes: row.part_bytes,
            created_at: row.created_at,
        }
    }
}

pub(crate) const UPLOAD_COLUMNS: &str = "id, team_id, name, size_bytes, part_bytes, created_at";

macro_rules! impl_upload_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use ringtrain_core::TeamId;
            use uuid::Uuid;

            use crate::backend::SqlBackend;
            use crate::uploads::{Upload, UploadRow, UploadStore, UPLOAD_COLUMNS};
            use crate::StoreResult;

            #[async_trait::async_trait]
            impl UploadStore for $store {
                async fn add_upload(&self, u: Upload) -> StoreResult<Upload> {
                    let sql = format!(
                        "INSERT INTO dataset_uploads ({UPLOAD_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6) \
                         RETURNING {UPLOAD_COLUMNS}"
                    );
                    let row: UploadRow = sqlx::query_as(&sql)
                        .bind(u.id)
                        .bind(u.team_id.0)
                        .bind(&u.name)
                        .bind(u.size_bytes)
                        .bind(u.part_bytes)
                        .bind(u.created_at)
                        .fetch_one(self.pool())
                        .await?;
                    Ok(row.into())
                }

                async fn get_upload(&self, id: Uuid) -> StoreResult<Option<Upload>> {
                    let sql = format!("SELECT {UPLOAD_COLUMNS} FROM dataset_uploads WHERE id = $1");
                    let row: Option<UploadRow> = sqlx::query_as(&sql).bind(id).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }

                async fn list_uploads(&self, team: TeamId) -> StoreResult<Vec<Upload>> {
                    let sql = format!(
                        "SELECT {UPLOAD_COLUMNS} FROM dataset_uploads WHERE team_id = $1 ORDER BY created_at, id"
                    );
                    let rows: Vec<UploadRow> = sqlx::query_as(&sql).bind(team.0).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn uploads_started_before(&self, before: DateTime<Utc>) -> StoreResult<Vec<Upload>> {
                    let sql = format!(
                        "SELECT {UPLOAD_COLUMNS} FROM dataset_uploads WHERE created_at < $1 ORDER BY created_at, id"
                    );
                    let rows: Vec<UploadRow> = sqlx::query_as(&sql).bind(before).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn delete_upload(&self, id: Uuid) -> StoreResult<Option<Upload>> {
                    let sql = format!("DELETE FROM dataset_uploads WHERE id = $1 RETURNING {UPLOAD_COLUMNS}");
                    let row: Option<UploadRow> = sqlx::query_as(&sql).bind(id).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }
            }
        };
    };
}

pub(crate) use impl_upload_store;

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(size_bytes: i64, part_bytes: i64) -> Upload {
        Upload {
            id: Uuid::nil(),
            team_id: TeamId(Uuid::nil()),
            name: "x".into(),
            size_bytes,
            part_bytes,
            created_at: Utc::now(),
        }
    }

    #[test]
    fn parts_cover_the_file_and_the_last_is_the_rest() {
        assert_eq!((upload(10, 4).parts(), upload(10, 4).part_size(1), upload(10, 4).part_size(3)), (3, 4, 2));
        assert_eq!((upload(8, 4).parts(), upload(8, 4).part_size(2)), (2, 4));
        assert_eq!((upload(0, 4).parts(), upload(0, 4).part_size(1)), (1, 0));
        assert_eq!((upload(3, 4).parts(), upload(3, 4).part_size(1)), (1, 3));
    }
}
