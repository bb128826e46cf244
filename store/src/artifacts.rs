//! Files a job reads or writes, registered by their path in the server's data directory: checkpoints
//! (per iteration, and the final weights), uploaded datasets and uploaded (TorchScript) models.

use async_trait::async_trait;
use ringtrain_core::{CheckpointId, DatasetId, JobId, ModelId, TeamId};
pub use ringtrain_protocol::Checkpoint;

use crate::error::StoreResult;

pub use ringtrain_views::artifacts::{Dataset, DatasetInput, Model};

#[derive(Debug, Clone)]
pub struct NewCheckpoint {
    pub job_id: JobId,
    pub attempt: i32,
    pub epoch: i64,
    pub iteration: i64,
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub is_final: bool,
}

#[derive(Debug, Clone)]
pub struct NewModel {
    pub id: ModelId,
    pub team_id: TeamId,
    pub name: String,
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub inputs: Vec<String>,
    pub report: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct NewDataset {
    pub id: DatasetId,
    pub team_id: TeamId,
    pub name: String,
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub train_samples: i64,
    pub sample_shape: Vec<i64>,
    pub num_classes: i32,
    pub inputs: Vec<DatasetInput>,
    pub labels: String,
    /// Where a registered sharded data set lies (None: an uploaded file, at `path`).
    pub source: Option<String>,
}

#[async_trait]
pub trait ArtifactStore: Send + Sync {
    /// Registers a checkpoint; (job, iteration, final) is unique, and a later attempt's registration
    /// replaces an earlier one's, never the reverse (Conflict).
    async fn add_checkpoint(&self, checkpoint: NewCheckpoint) -> StoreResult<Checkpoint>;
    async fn list_checkpoints(&self, job: JobId) -> StoreResult<Vec<Checkpoint>>;
    /// One checkpoint by its id, whichever job it belongs to (a fork's `init_from`).
    async fn get_checkpoint(&self, id: CheckpointId) -> StoreResult<Option<Checkpoint>>;
    /// Forgets the job's checkpoints except the final weights and the newest `keep` others (by iteration);
    /// returns those forgotten, whose files the caller removes.
    async fn prune_checkpoints(&self, job: JobId, keep: i64) -> StoreResult<Vec<Checkpoint>>;
    /// Forgets every checkpoint of the job; returns them.
    async fn delete_checkpoints(&self, job: JobId) -> StoreResult<Vec<Checkpoint>>;
    async fn add_dataset(&self, dataset: NewDataset) -> StoreResult<Dataset>;
    async fn get_dataset(&self, id: DatasetId) -> StoreResult<Option<Dataset>>;
    async fn list_datasets(&self, team_id: TeamId) -> StoreResult<Vec<Dataset>>;
    /// Forgets a dataset; returns it (its file is the caller's to remove), None if there was none.
    async fn delete_dataset(&self, id: DatasetId) -> StoreResult<Option<Dataset>>;
    async fn add_model(&self, model: NewModel) -> StoreResult<Model>;
    async fn get_model(&self, id: ModelId) -> StoreResult<Option<Model>>;
    /// A team's models, newest first.
    async fn list_models(&self, team_id: TeamId) -> StoreResult<Vec<Model>>;
    /// Forgets a model; returns it (its file is the caller's to remove), None if there was none.
    async fn delete_model(&self, id: ModelId) -> StoreResult<Option<Model>>;
}

macro_rules! impl_artifact_store {
    ($store:ty) => {
        const _: () = {
            use ringtrain_core::{CheckpointId, DatasetId, JobId, ModelId, TeamId};
            use sqlx::types::Json;
            use uuid::Uuid;

            use crate::artifacts::ArtifactStore;
            use crate::backend::SqlBackend;
            use crate::rows::{CheckpointRow, DatasetRow, ModelRow, CHECKPOINT_COLUMNS, DATASET_COLUMNS, MODEL_COLUMNS};
            use crate::{now, Checkpoint, Dataset, Model, NewCheckpoint, NewDataset, NewModel, StoreError, StoreResult};

            #[async_trait::async_trait]
            impl ArtifactStore for $store {
                async fn add_checkpoint(&self, c: NewCheckpoint) -> StoreResult<Checkpoint> {
                    let sql = format!(
                        "INSERT INTO checkpoints (id, job_id, attempt, epoch, iteration, path, size_bytes, sha256, \
                         is_final, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                         ON CONFLICT (job_id, iteration, is_final) DO UPDATE SET attempt = excluded.attempt, \
                         epoch = excluded.epoch, path = excluded.path, size_bytes = excluded.size_bytes, \
                         sha256 = excluded.sha256, created_at = excluded.created_at \
                         WHERE checkpoints.attempt <= excluded.attempt RETURNING {CHECKPOINT_COLUMNS}"
                    );
                    let row: Option<CheckpointRow> = sqlx::query_as(&sql)
                        .bind(Uuid::new_v4())
                        .bind(c.job_id.0)
                        .bind(c.attempt)
                        .bind(c.epoch)
                        .bind(c.iteration)
                        .bind(&c.path)
                        .bind(c.size_bytes)
                        .bind(&c.sha256)
                        .bind(c.is_final)
                        .bind(now())
                        .fetch_optional(self.pool())
                        .await?;
                    // An older placement never replaces what a newer one registered for the same point.
                    row.map(Into::into).ok_or_else(|| {
                        StoreError::Conflict(format!(
                            "a later attempt than {} already registered the checkpoint at iteration {}",
                            c.attempt, c.iteration
                        ))
                    })
                }

                async fn list_checkpoints(&self, job: JobId) -> StoreResult<Vec<Checkpoint>> {
                    let sql = format!(
                        "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE job_id = $1 ORDER BY iteration, is_final"
                    );
                    let rows: Vec<CheckpointRow> = sqlx::query_as(&sql).bind(job.0).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn get_checkpoint(&self, id: CheckpointId) -> StoreResult<Option<Checkpoint>> {
                    let sql = format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE id = $1");
                    let row: Option<CheckpointRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }

                async fn prune_checkpoints(&self, job: JobId, keep: i64) -> StoreResult<Vec<Checkpoint>> {
                    let sql = format!(
                        "DELETE FROM checkpoints WHERE job_id = $1 AND NOT is_final AND id NOT IN \
                         (SELECT id FROM checkpoints WHERE job_id = $1 AND NOT is_final ORDER BY iteration DESC LIMIT $2) \
                         RETURNING {CHECKPOINT_COLUMNS}"
                    );
                    let rows: Vec<CheckpointRow> =
                        sqlx::query_as(&sql).bind(job.0).bind(keep.max(1)).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn delete_checkpoints(&self, job: JobId) -> StoreResult<Vec<Checkpoint>> {
                    let sql = format!("DELETE FROM checkpoints WHERE job_id = $1 RETURNING {CHECKPOINT_COLUMNS}");
                    let rows: Vec<CheckpointRow> = sqlx::query_as(&sql).bind(job.0).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn add_dataset(&self, d: NewDataset) -> StoreResult<Dataset> {
                    let sql = format!(
                        "INSERT INTO datasets (id, team_id, name, path, size_bytes, sha256, train_samples, \
                         sample_shape, num_classes, inputs, labels, created_at, source) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING {DATASET_COLUMNS}"
                    );
                    let row: DatasetRow = sqlx::query_as(&sql)
                        .bind(d.id.0)
                        .bind(d.team_id.0)
                        .bind(&d.name)
                        .bind(&d.path)
                        .bind(d.size_bytes)
                        .bind(&d.sha256)
                        .bind(d.train_samples)
                        .bind(Json(&d.sample_shape))
                        .bind(d.num_classes)
                        .bind(Json(&d.inputs))
                        .bind(&d.labels)
                        .bind(now())
                        .bind(&d.source)
                        .fetch_one(self.pool())
                        .await?;
                    Ok(row.into())
                }

                async fn get_dataset(&self, id: DatasetId) -> StoreResult<Option<Dataset>> {
                    let sql = format!("SELECT {DATASET_COLUMNS} FROM datasets WHERE id = $1");
                    let row: Option<DatasetRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }

                async fn delete_dataset(&self, id: DatasetId) -> StoreResult<Option<Dataset>> {
                    let sql = format!("DELETE FROM datasets WHERE id = $1 RETURNING {DATASET_COLUMNS}");
                    let row: Option<DatasetRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }

                async fn list_datasets(&self, team_id: TeamId) -> StoreResult<Vec<Dataset>> {
                    let sql =
                        format!("SELECT {DATASET_COLUMNS} FROM datasets WHERE team_id = $1 ORDER BY created_at DESC");
                    let rows: Vec<DatasetRow> = sqlx::query_as(&sql).bind(team_id.0).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn add_model(&self, m: NewModel) -> StoreResult<Model> {
                    let sql = format!(
                        "INSERT INTO models (id, team_id, name, path, size_bytes, sha256, inputs, report, created_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {MODEL_COLUMNS}"
                    );
                    let row: ModelRow = sqlx::query_as(&sql)
                        .bind(m.id.0)
                        .bind(m.team_id.0)
                        .bind(&m.name)
                        .bind(&m.path)
                        .bind(m.size_bytes)
                        .bind(&m.sha256)
                        .bind(Json(&m.inputs))
                        .bind(Json(&m.report))
                        .bind(now())
                        .fetch_one(self.pool())
                        .await?;
                    Ok(row.into())
                }

                async fn get_model(&self, id: ModelId) -> StoreResult<Option<Model>> {
                    let sql = format!("SELECT {MODEL_COLUMNS} FROM models WHERE id = $1");
                    let row: Option<ModelRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }

                async fn list_models(&self, team_id: TeamId) -> StoreResult<Vec<Model>> {
                    let sql = format!("SELECT {MODEL_COLUMNS} FROM models WHERE team_id = $1 ORDER BY created_at DESC");
                    let rows: Vec<ModelRow> = sqlx::query_as(&sql).bind(team_id.0).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn delete_model(&self, id: ModelId) -> StoreResult<Option<Model>> {
                    let sql = format!("DELETE FROM models WHERE id = $1 RETURNING {MODEL_COLUMNS}");
                    let row: Option<ModelRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }
            }
        };
    };
}

pub(crate) use impl_artifact_store;
