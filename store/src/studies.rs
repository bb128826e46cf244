//! Studies: one base spec and the jobs made of it, one per point. A study is created with all its jobs in one
//! transaction (a study is never left half submitted); the jobs are ordinary jobs that name their study and
//! point, so the scheduler, quotas, cancel and results treat them like any other.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ringtrain_core::{StudyId, TeamId, TokenId};
use serde_json::Value;

use crate::error::StoreResult;
use crate::jobs::{Job, NewJob};

/// A study as stored: what was asked, and which point is the reference. Its points are jobs
/// ([`Job::study`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Study {
    pub id: StudyId,
    /// Insertion order: the list's sort key and cursor.
    pub seq: i64,
    pub team_id: TeamId,
    pub created_by: Option<TokenId>,
    pub name: Option<String>,
    /// The request as given (base spec, axes or points, reference).
    pub definition: Value,
    /// The point the others are compared with (the small-batch baseline).
    pub reference_point: i32,
    pub created_at: DateTime<Utc>,
    /// The memory of the study's search (`core::study::halving::HalvingState`), when it has one and has
    /// decided anything.
    pub search_state: Option<Value>,
    /// Bumped by every change of `search_state`: the guard of [`StudyStore::set_search_state`].
    pub search_version: i64,
}

#[derive(Debug, Clone)]
pub struct NewStudy {
    pub id: StudyId,
    pub team_id: TeamId,
    pub created_by: Option<TokenId>,
    pub name: Option<String>,
    pub definition: Value,
    pub reference_point: i32,
}

#[async_trait]
pub trait StudyStore: Send + Sync {
    /// Stores the study and its points' jobs (each `queued`, with its `submitted` event) in one transaction.
    /// Each job's `study` must name this study.
    async fn create_study(&self, study: NewStudy, jobs: Vec<NewJob>) -> StoreResult<(Study, Vec<Job>)>;
    async fn get_study(&self, id: StudyId) -> StoreResult<Option<Study>>;
    /// A team's studies, newest first; `before_seq` is the paging cursor.
    async fn list_studies(&self, team_id: TeamId, before_seq: Option<i64>, limit: i64) -> StoreResult<Vec<Study>>;
    /// The study's jobs in point order.
    async fn study_jobs(&self, id: StudyId) -> StoreResult<Vec<Job>>;
    /// Replaces the search's memory if it is still at `version` (compare-and-set: two servers judging
    /// reports at once cannot both act on one memory); false when another change came first.
    async fn set_search_state(&self, id: StudyId, version: i64, state: &Value) -> StoreResult<bool>;
}

macro_rules! impl_study_store {
    ($store:ty) => {
        const _: () = {
            use ringtrain_core::{StudyId, TeamId};
            use sqlx::types::Json;

            use crate::backend::SqlBackend;
            use crate::rows::{self, JobRow, StudyRow, JOB_COLUMNS, STUDY_COLUMNS};
            use crate::studies::StudyStore;
            use crate::{now, Job, NewJob, NewStudy, StoreError, StoreResult, Study};

            #[async_trait::async_trait]
            impl StudyStore for $store {
                async fn create_study(&self, study: NewStudy, jobs: Vec<NewJob>) -> StoreResult<(Study, Vec<Job>)> {
                    if let Some(stray) = jobs.iter().find(|j| j.study.map(|s| s.study_id) != Some(study.id)) {
                        return Err(StoreError::Corrupt(format!("job {} is not a point of study {}", stray.id, study.id)));
                    }
                    let now = now();
                    let mut tx = self.pool().begin().await?;
                    let sql = format!(
                        "INSERT INTO studies (id, team_id, created_by, name, definition, reference_point, created_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {STUDY_COLUMNS}"
                    );
                    let row: StudyRow = sqlx::query_as(&sql)
                        .bind(study.id.0)
                        .bind(study.team_id.0)
                        .bind(study.created_by.map(|t| t.0))
                        .bind(&study.name)
                        .bind(Json(&study.definition))
                        .bind(study.reference_point)
                        .bind(now)
                        .fetch_one(&mut *tx)
                        .await?;
                    let mut created = Vec::with_capacity(jobs.len());
                    for job in &jobs {
                        created.push(Job::try_from(Self::insert_job_in(&mut tx, job, now).await?)?);
                    }
                    tx.commit().await?;
                    Ok((row.into(), created))
                }

                async fn get_study(&self, id: StudyId) -> StoreResult<Option<Study>> {
                    let sql = format!("SELECT {STUDY_COLUMNS} FROM studies WHERE id = $1");
                    let row: Option<StudyRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    Ok(row.map(Into::into))
                }

                async fn list_studies(
                    &self,
                    team_id: TeamId,
                    before_seq: Option<i64>,
                    limit: i64,
                ) -> StoreResult<Vec<Study>> {
                    let sql = format!(
                        "SELECT {STUDY_COLUMNS} FROM studies WHERE team_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3"
                    );
                    let rows: Vec<StudyRow> = sqlx::query_as(&sql)
                        .bind(team_id.0)
                        .bind(before_seq.unwrap_or(i64::MAX))
                        .bind(limit)
                        .fetch_all(self.pool())
                        .await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }

                async fn study_jobs(&self, id: StudyId) -> StoreResult<Vec<Job>> {
                    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE study_id = $1 ORDER BY study_point");
                    let rows: Vec<JobRow> = sqlx::query_as(&sql).bind(id.0).fetch_all(self.pool()).await?;
                    rows::jobs(rows)
                }

                async fn set_search_state(
                    &self,
                    id: StudyId,
                    version: i64,
                    state: &serde_json::Value,
                ) -> StoreResult<bool> {
                    let done = sqlx::query(
                        "UPDATE studies SET search_state = $3, search_version = search_version + 1 \
                         WHERE id = $1 AND search_version = $2",
                    )
                    .bind(id.0)
                    .bind(version)
                    .bind(Json(state))
                    .execute(self.pool())
                    .await?;
                    Ok(done.rows_affected() == 1)
                }
            }
        };
    };
}

pub(crate) use impl_study_store;
