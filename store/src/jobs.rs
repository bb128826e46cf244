//! Jobs as records: submitting (with idempotency keys), reading, the run history, the queue and the views
//! the scheduler loop reads, and each job's events. State changes are in [`lifecycle`](crate::lifecycle).
//!
//! Over 450 lines: the jobs table's queries for both databases stay together, so that a column is
//! changed in one file.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{Effective, JobId, JobSpec, JobState, StudyId, TeamId, TokenId};
use serde_json::Value;

use crate::error::StoreResult;

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: JobId,
    /// Insertion order: the run history's sort key and cursor.
    pub seq: i64,
    pub team_id: TeamId,
    pub created_by: Option<TokenId>,
    pub name: Option<String>,
    /// The spec, typed: the one way the server reads a job's fields (never by JSON key, where a renamed
    /// field would silently become a default). Parsed once, when the row is read; it was validated at
    /// submission, so a stored spec that no longer parses is a row this version cannot read (Corrupt).
    pub spec: JobSpec,
    /// The spec as the team submitted it, shown back as written.
    pub spec_json: Value,
    /// The hyperparameters the job runs with; None while the dataset's size is unknown (`idx:` datasets).
    pub effective: Option<Effective>,
    pub dataset_size: Option<i64>,
    pub state: JobState,
    pub priority: i32,
    pub device: DeviceKind,
    /// The rank processes placed (the spec's `devices`), each on a device of its own.
    pub devices: i32,
    /// Placements so far: every start (a claim) makes it one more, and it guards every agent report.
    pub attempt: i32,
    /// Placements that ended in a preemption: not failures, so they use none of the restart budget.
    pub preemptions: i32,
    pub max_restarts: i32,
    pub lease_owner: Option<String>,
    pub lease_expires: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub result: Option<Value>,
    pub error: Option<String>,
    /// Set while the job is queued and cannot be placed on the pool as it exists.
    pub unplaceable: Option<Unplaceable>,
    /// The study this job is a point of.
    pub study: Option<StudyPoint>,
    /// What the team wrote about the run (see [`Annotations`]).
    pub tags: Vec<String>,
    pub note: String,
}

/// A run's tags and note, as `PATCH /v1/jobs/{id}` sets them: each field given replaces the stored one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Annotations {
    pub tags: Option<Vec<String>>,
    pub note: Option<String>,
}

impl Job {
    /// The attempt as users count it: 1 for the first run, one more per failure-restart. A preempted run that
    /// resumes elsewhere continues the same attempt.
    pub fn user_attempt(&self) -> i32 {
        self.attempt - self.preemptions
    }

    /// How events name the current placement: "placement 3 (attempt 2)" (the third time it was placed, the
    /// second run after one failure, one preemption).
    pub fn placement_name(&self) -> String {
        format!("placement {} (attempt {})", self.attempt, self.user_attempt())
    }

    /// Whether a failed placement may be retried: restarts used so far (failures, not preemptions) are below
    /// `max_restarts`.
    pub fn may_restart(&self) -> bool {
        self.user_attempt() <= self.max_restarts
    }
}

/// Which point of which study a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StudyPoint {
    pub study_id: StudyId,
    /// 0-based, in the order the study's points were made.
    pub point: i32,
}

pub use ringtrain_views::jobs::Unplaceable;

#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: JobId,
    pub team_id: TeamId,
    pub created_by: Option<TokenId>,
    pub name: Option<String>,
    /// The spec as submitted (already parsed and checked by the caller).
    pub spec_json: Value,
    pub effective: Option<Effective>,
    pub dataset_size: Option<i64>,
    pub priority: i32,
    pub device: DeviceKind,
    pub devices: i32,
    pub max_restarts: i32,
    pub study: Option<StudyPoint>,
}

/// An `Idempotency-Key` and the hash of the request body it came with.
#[derive(Debug, Clone)]
pub struct IdempotencyKey {
    pub key: String,
    pub request_hash: String,
}

/// The outcome of a submission.
#[derive(Debug, Clone)]
pub enum Submitted {
    /// A new job was stored.
    Created(Job),
    /// The key was used before with the same body: the job it made then.
    Replayed(Job),
    /// The key was used before with another body.
    KeyReused,
}

/// Run-history filters; newest first.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub name_prefix: Option<String>,
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
    /// Only jobs older than this `seq` (the cursor of the previous page).
    pub before_seq: Option<i64>,
    /// Only jobs with this tag.
    pub tag: Option<String>,
    /// Only jobs whose name or note holds this text, ignoring ASCII case.
    pub text: Option<String>,
    pub limit: i64,
}

pub use ringtrain_views::jobs::records::JobEvent;

#[async_trait]
pub trait JobStore: Send + Sync {
    /// Stores a `queued` job (and its first event); with a key, at most one job per (team, key).
    async fn submit_job(&self, job: NewJob, key: Option<IdempotencyKey>) -> StoreResult<Submitted>;
    async fn get_job(&self, id: JobId) -> StoreResult<Option<Job>>;
    /// The run history of a team, newest first.
    async fn list_jobs(&self, team_id: TeamId, filter: &JobFilter) -> StoreResult<Vec<Job>>;
    /// Sets a job's tags and note (each one given); None when there is no such job.
    async fn annotate_job(&self, id: JobId, annotations: &Annotations) -> StoreResult<Option<Job>>;
    /// Jobs holding devices: scheduled or running.
    async fn active_jobs(&self) -> StoreResult<Vec<Job>>;
    /// The queue, highest priority then oldest first.
    /// Queued jobs, the first `per_team` of each team and device kind (by priority, then submission), all
    /// of them in priority order: one team's long or high-priority queue cannot hide another team's jobs.
    async fn list_queued(&self, per_team: i64) -> StoreResult<Vec<Job>>;
    /// Active jobs whose lease expired before `now` (no agent holding one of their ranks is alive).
    async fn expired_leases(&self, now: DateTime<Utc>, limit: i64) -> StoreResult<Vec<Job>>;
    /// Jobs per state, for /metrics.
    async fn count_jobs_by_state(&self) -> StoreResult<Vec<(JobState, i64)>>;
    /// The team's queued jobs.
    async fn count_queued(&self, team: TeamId) -> StoreResult<i64>;
    /// Moves the change version on (every change of jobs or assignments does) and tells every server
    /// sharing the database (Postgres NOTIFY, in the same statement; SQLite's one server is told
    /// in-process); returns the new version.
    async fn bump_change_version(&self) -> StoreResult<i64>;
    /// The change version agents' long polls compare: the same through every server, across restarts.
    async fn change_version(&self) -> StoreResult<i64>;
    /// Marks queued jobs as not placeable on the pool as it exists, with `reason` (keeping each one's first
    /// `since` while it stays so), or clears the mark (`None`). Nothing happens to a job no longer queued.
    /// One statement per thousand jobs: a pool with no node of a kind marks every new job of it.
    async fn mark_unplaceable(&self, jobs: &[JobId], reason: Option<&str>) -> StoreResult<()>;
    /// A job's history (state changes, restarts) after `after_seq`, oldest first.
    async fn list_events(&self, job: JobId, after_seq: i64, limit: i64) -> StoreResult<Vec<JobEvent>>;
    /// Adds an event of `kind` (not a state change: `warning`) to the job's history, under its current
    /// placement. False when there is no such job.
    async fn add_job_event(&self, job: JobId, kind: &str, reason: &str) -> StoreResult<bool>;
}

/// The smallest string greater than every string starting with `prefix` (its last character incremented),
/// or None when there is none.
pub(crate) fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

macro_rules! impl_job_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use ringtrain_core::{JobId, JobState, TeamId};
            use sqlx::types::Json;
            use uuid::Uuid;

            use crate::backend::SqlBackend;
            use crate::jobs::{prefix_upper_bound, JobStore};
            use crate::records::Backend;
            use crate::rows::{self, EventRow, JobRow, EVENT_COLUMNS, JOB_COLUMNS};
            use crate::{
                now, Annotations, IdempotencyKey, Job, JobEvent, JobFilter, NewJob, StoreError, StoreResult, Submitted,
            };

            type Tx<'a> = sqlx::Transaction<'a, <$store as SqlBackend>::Db>;
            type Db = <$store as SqlBackend>::Db;

            /// The new job's values, $1 to $14 of both ways of inserting it.
            fn bind_new_job<'q>(
                query: sqlx::query::QueryAs<'q, Db, JobRow, <Db as sqlx::Database>::Arguments<'q>>,
                job: &'q NewJob,
                now: DateTime<Utc>,
            ) -> sqlx::query::QueryAs<'q, Db, JobRow, <Db as sqlx::Database>::Arguments<'q>> {
                query
                    .bind(job.id.0)
                    .bind(job.team_id.0)
                    .bind(job.created_by.map(|t| t.0))
                    .bind(&job.name)
                    .bind(Json(&job.spec_json))
                    .bind(job.effective.as_ref().map(Json))
                    .bind(job.dataset_size)
                    .bind(job.priority)
                    .bind(job.device.as_str())
                    .bind(job.devices)
                    .bind(job.max_restarts)
                    .bind(now)
                    .bind(job.study.map(|s| s.study_id.0))
                    .bind(job.study.map(|s| s.point))
            }

            impl $store {
                /// Stores a `queued` job and its `submitted` event inside the caller's transaction (a single
                /// submission, or every point of a study at once).
                pub(crate) async fn insert_job_in(
                    tx: &mut Tx<'_>,
                    job: &NewJob,
                    now: DateTime<Utc>,
                ) -> StoreResult<JobRow> {
                    let sql = format!(
                        "INSERT INTO jobs (id, team_id, created_by, name, spec, effective, dataset_size, state, \
                         priority, device, devices, max_restarts, created_at, updated_at, study_id, study_point) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, 'queued', $8, $9, $10, $11, $12, $12, $13, $14) \
                         RETURNING {JOB_COLUMNS}"
                    );
                    let row: JobRow = bind_new_job(sqlx::query_as(&sql), job, now).fetch_one(&mut **tx).await?;
                    sqlx::query(
                        "INSERT INTO job_events (job_id, at, kind, from_state, to_state, attempt, run_attempt, reason) \
                         VALUES ($1, $2, 'state', NULL, 'queued', 0, 0, 'submitted')",
                    )
                    .bind(job.id.0)
                    .bind(now)
                    .execute(&mut **tx)
                    .await?;
                    Ok(row)
                }

                /// Postgres: the job and its `submitted` event in one statement (atomic on its own), one round
                /// trip where a transaction takes four; under a burst of submissions the round trips, not the
                /// inserts, were the database's work.
                async fn insert_job_alone(
                    pool: &sqlx::Pool<<$store as SqlBackend>::Db>,
                    job: &NewJob,
                    now: DateTime<Utc>,
                ) -> StoreResult<JobRow> {
                    let sql = format!(
                        "WITH job AS (INSERT INTO jobs (id, team_id, created_by, name, spec, effective, dataset_size, \
                         state, priority, device, devices, max_restarts, created_at, updated_at, study_id, study_point) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, 'queued', $8, $9, $10, $11, $12, $12, $13, $14) \
                         RETURNING {JOB_COLUMNS}), \
                         submitted AS (INSERT INTO job_events (job_id, at, kind, from_state, to_state, attempt, \
                         run_attempt, reason) SELECT id, $12, 'state', NULL, 'queued', 0, 0, 'submitted' FROM job) \
                         SELECT {JOB_COLUMNS} FROM job"
                    );
                    let row: JobRow = bind_new_job(sqlx::query_as(&sql), job, now).fetch_one(pool).await?;
                    Ok(row)
                }
            }

            #[async_trait::async_trait]
            impl JobStore for $store {
                async fn submit_job(&self, job: NewJob, key: Option<IdempotencyKey>) -> StoreResult<Submitted> {
                    let now = now();
                    if key.is_none() && <Self as SqlBackend>::KIND == Backend::Postgres {
                        return Ok(Submitted::Created(Self::insert_job_alone(self.pool(), &job, now).await?.try_into()?));
                    }
                    let mut tx = self.pool().begin().await?;
                    let row = Self::insert_job_in(&mut tx, &job, now).await?;
                    if let Some(key) = &key {
                        // The first writer of (team, key) wins; a concurrent one waits for it to commit and then
                        // finds the key taken, drops its own job and replays the winner's.
                        let claimed = sqlx::query(
                            "INSERT INTO idempotency_keys (team_id, key, request_hash, job_id, created_at) \
                             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (team_id, key) DO NOTHING",
                        )
                        .bind(job.team_id.0)
                        .bind(&key.key)
                        .bind(&key.request_hash)
                        .bind(job.id.0)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        if claimed == 0 {
                            tx.rollback().await?;
                            let (hash, job_id): (String, Uuid) = sqlx::query_as(
                                "SELECT request_hash, job_id FROM idempotency_keys WHERE team_id = $1 AND key = $2",
                            )
                            .bind(job.team_id.0)
                            .bind(&key.key)
                            .fetch_one(self.pool())
                            .await?;
                            if hash != key.request_hash {
                                return Ok(Submitted::KeyReused);
                            }
                            let existing = self.get_job(JobId(job_id)).await?;
                            return existing.map(Submitted::Replayed).ok_or_else(|| {
                                StoreError::Corrupt(format!("idempotency key names missing job {job_id}"))
                            });
                        }
                    }
                    tx.commit().await?;
                    Ok(Submitted::Created(row.try_into()?))
                }

                async fn get_job(&self, id: JobId) -> StoreResult<Option<Job>> {
                    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
                    let row: Option<JobRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    row.map(TryInto::try_into).transpose()
                }

                async fn list_jobs(&self, team_id: TeamId, filter: &JobFilter) -> StoreResult<Vec<Job>> {
                    // Built per request so each filter combination gets a plan that uses its index
                    // (team, [state,] seq DESC) instead of one generic plan full of `$n IS NULL OR ...`.
                    let mut q = sqlx::QueryBuilder::<<Self as SqlBackend>::Db>::new(format!(
                        "SELECT {JOB_COLUMNS} FROM jobs WHERE team_id = "
                    ));
                    q.push_bind(team_id.0);
                    if let Some(state) = filter.state {
                        q.push(" AND state = ").push_bind(state.as_str());
                    }
                    if let Some(prefix) = &filter.name_prefix {
                        // A byte-order range (served by the jobs_team_name index) narrows the rows; substr then
                        // checks the prefix exactly. Not LIKE: its wildcards would need escaping, and SQLite's
                        // LIKE ignores case where Postgres's does not.
                        let byte_order = <Self as SqlBackend>::BYTE_ORDER;
                        q.push(format!(" AND name {byte_order} >= ")).push_bind(prefix.clone());
                        if let Some(upper) = prefix_upper_bound(prefix) {
                            q.push(format!(" AND name {byte_order} < ")).push_bind(upper);
                        }
                        q.push(" AND substr(name, 1, ")
                            .push_bind(i32::try_from(prefix.chars().count()).unwrap_or(i32::MAX))
                            .push(") = ")
                            .push_bind(prefix.clone());
                    }
                    if let Some(after) = filter.created_after {
                        q.push(" AND created_at >= ").push_bind(after);
                    }
                    if let Some(before) = filter.created_before {
                        q.push(" AND created_at < ").push_bind(before);
                    }
                    if let Some(seq) = filter.before_seq {
                        q.push(" AND seq < ").push_bind(seq);
                    }
                    let find = <Self as SqlBackend>::FIND_TEXT;
                    if let Some(tag) = &filter.tag {
                        // a tag holds no quote, so `"tag"` is found only as a whole element of the array
                        q.push(format!(" AND {find}(tags, ")).push_bind(format!("\"{tag}\"")).push(") > 0");
                    }
                    if let Some(text) = &filter.text {
                        // the expression of the trigram index (Postgres migration 0014), written the same way
                        let searched = "lower(coalesce(name, '') || ' ' || note)";
                        <Self as SqlBackend>::push_contains(&mut q, searched, &text.to_ascii_lowercase());
                    }
                    q.push(" ORDER BY seq DESC LIMIT ").push_bind(filter.limit);
                    let rows: Vec<JobRow> = q.build_query_as().fetch_all(self.pool()).await?;
                    rows::jobs(rows)
                }

                async fn annotate_job(&self, id: JobId, annotations: &Annotations) -> StoreResult<Option<Job>> {
                    let tags = annotations.tags.as_ref().map(|tags| serde_json::Value::from(tags.clone()).to_string());
                    let sql = format!(
                        "UPDATE jobs SET tags = coalesce($2, tags), note = coalesce($3, note) WHERE id = $1 \
                         RETURNING {JOB_COLUMNS}"
                    );
                    let row: Option<JobRow> = sqlx::query_as(&sql)
                        .bind(id.0)
                        .bind(tags)
                        .bind(annotations.note.as_deref())
                        .fetch_optional(self.pool())
                        .await?;
                    row.map(Job::try_from).transpose()
                }

                async fn active_jobs(&self) -> StoreResult<Vec<Job>> {
                    let sql =
                        format!("SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ('scheduled', 'running') ORDER BY seq");
                    let rows: Vec<JobRow> = sqlx::query_as(&sql).fetch_all(self.pool()).await?;
                    rows::jobs(rows)
                }

                async fn list_queued(&self, per_team: i64) -> StoreResult<Vec<Job>> {
                    let window = <Self as SqlBackend>::QUEUE_WINDOW;
                    let sql = format!("SELECT {JOB_COLUMNS} FROM {window} AS queued ORDER BY priority DESC, seq");
                    let rows: Vec<JobRow> = sqlx::query_as(&sql).bind(per_team).fetch_all(self.pool()).await?;
                    rows::jobs(rows)
                }

                async fn expired_leases(&self, now: DateTime<Utc>, limit: i64) -> StoreResult<Vec<Job>> {
                    let sql = format!(
                        "SELECT {JOB_COLUMNS} FROM jobs WHERE lease_owner IS NOT NULL AND lease_expires < $1 \
                         AND state IN ('scheduled', 'running') ORDER BY lease_expires LIMIT $2"
                    );
                    let rows: Vec<JobRow> = sqlx::query_as(&sql).bind(now).bind(limit).fetch_all(self.pool()).await?;
                    rows::jobs(rows)
                }

                async fn count_jobs_by_state(&self) -> StoreResult<Vec<(JobState, i64)>> {
                    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT state, COUNT(*) FROM jobs GROUP BY state")
                        .fetch_all(self.pool())
                        .await?;
                    rows.into_iter().map(|(s, n)| Ok((rows::parse(&s)?, n))).collect()
                }

                async fn count_queued(&self, team: TeamId) -> StoreResult<i64> {
                    let (n,): (i64,) =
                        sqlx::query_as("SELECT COUNT(*) FROM jobs WHERE team_id = $1 AND state = 'queued'")
                            .bind(team.0)
                            .fetch_one(self.pool())
                            .await?;
                    Ok(n)
                }

                async fn bump_change_version(&self) -> StoreResult<i64> {
                    let (seq,): (i64,) =
                        sqlx::query_as(<Self as SqlBackend>::BUMP_CHANGE_VERSION).fetch_one(self.pool()).await?;
                    Ok(seq)
                }

                async fn change_version(&self) -> StoreResult<i64> {
                    let (seq,): (i64,) = sqlx::query_as("SELECT seq FROM change_version WHERE id = 1")
                        .fetch_one(self.pool())
                        .await?;
                    Ok(seq)
                }

                async fn mark_unplaceable(&self, jobs: &[JobId], reason: Option<&str>) -> StoreResult<()> {
                    let now = now();
                    for chunk in jobs.chunks(1000) {
                        let mut q = sqlx::QueryBuilder::<<Self as SqlBackend>::Db>::new(
                            "UPDATE jobs SET unplaceable_reason = ",
                        );
                        q.push_bind(reason).push(", unplaceable_since = ");
                        match reason {
                            None => q.push("NULL"),
                            Some(_) => q.push("COALESCE(unplaceable_since, ").push_bind(now).push(")"),
                        };
                        q.push(" WHERE state = 'queued' AND id IN (");
                        let mut ids = q.separated(", ");
                        for job in chunk {
                            ids.push_bind(job.0);
                        }
                        q.push(")");
                        q.build().execute(self.pool()).await?;
                    }
                    Ok(())
                }

                async fn add_job_event(&self, job: JobId, kind: &str, reason: &str) -> StoreResult<bool> {
                    let Some(current) = self.get_job(job).await? else { return Ok(false) };
                    sqlx::query(
                        "INSERT INTO job_events (job_id, at, kind, from_state, to_state, attempt, run_attempt, reason) \
                         VALUES ($1, $2, $3, NULL, NULL, $4, $5, $6)",
                    )
                    .bind(job.0)
                    .bind(crate::now())
                    .bind(kind)
                    .bind(current.attempt)
                    .bind(current.user_attempt())
                    .bind(reason)
                    .execute(self.pool())
                    .await?;
                    Ok(true)
                }

                async fn list_events(&self, job: JobId, after_seq: i64, limit: i64) -> StoreResult<Vec<JobEvent>> {
                    let sql = format!(
                        "SELECT {EVENT_COLUMNS} FROM job_events WHERE job_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
                    );
                    let rows: Vec<EventRow> =
                        sqlx::query_as(&sql).bind(job.0).bind(after_seq).bind(limit).fetch_all(self.pool()).await?;
                    Ok(rows.into_iter().map(Into::into).collect())
                }
            }
        };
    };
}

pub(crate) use impl_job_store;

#[cfg(test)]
mod tests {
    use super::prefix_upper_bound;

    #[test]
    fn upper_bounds_cover_exactly_the_prefix() {
        assert_eq!(prefix_upper_bound("bench-1").as_deref(), Some("bench-2"));
        assert_eq!(prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_upper_bound("\u{10FFFF}"), None);
        // The surrogate gap is skipped.
        assert_eq!(prefix_upper_bound("\u{D7FF}").as_deref(), Some("\u{E000}"));
    }
}
