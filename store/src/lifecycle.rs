//! The job life cycle: every change of a job's state is one named operation here, in one transaction with
//! its event row and what it does to the job's assignments. Each is a compare-and-set on the state (and the
//! attempt, for anything an agent or the scheduler reports about one placement), so a stale writer matches
//! no row and changes nothing.
//!
//! | operation | from → to | assignments |
//! |---|---|---|
//! | [`start_job`](LifecycleStore::start_job) | queued → scheduled, attempt + 1 | one pending per rank |
//! | [`transition`](LifecycleStore::transition) (ranks started) | scheduled → running | — |
//! | [`succeed_job`](LifecycleStore::succeed_job) | running → succeeded | pending ones cancelled |
//! | [`fail_placement`](LifecycleStore::fail_placement) | scheduled/running → queued (restarts left) or failed | pending ones cancelled |
//! | [`preempt_job`](LifecycleStore::preempt_job) | scheduled/running → queued, preemptions + 1 | pending cancelled, live ones marked preempted |
//! | [`cancel_job`](LifecycleStore::cancel_job) | queued/scheduled/running → cancelled | pending ones cancelled |
//! | [`resume_job`](LifecycleStore::resume_job) | failed/cancelled → queued, restart budget anew | — |
//!
//! Delivered and running assignments are never ended here: they keep their devices until their agent, told
//! by its next poll to stop them, reports them ended.
//!
//! Over 450 lines because every state change is here, as the table says, each with its SQL for both
//! databases: one place to audit the life cycle. The decisions inside them (requeue or fail, the reason
//! texts) are plain functions before the SQL, with their tests at the end.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ringtrain_core::{JobId, JobState, NodeId};
use serde_json::Value;

use crate::assignments::{Assignment, NewAssignment};
use crate::error::StoreResult;
use crate::jobs::Job;

/// What a transition does to the lease.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseChange {
    Keep,
    Clear,
    Set { owner: String, expires: DateTime<Utc> },
}

/// One compare-and-set on a job's state.
#[derive(Debug, Clone)]
pub struct Transition {
    pub job: JobId,
    pub from: JobState,
    pub to: JobState,
    /// Guard: the lease owner must be this one.
    pub owner: Option<String>,
    /// Guard: the attempt must be this one (a stale agent reports an old attempt).
    pub attempt: Option<i32>,
    pub reason: String,
    pub lease: LeaseChange,
    pub result: Option<Value>,
    pub error: Option<String>,
}

impl Transition {
    pub fn new(job: JobId, from: JobState, to: JobState, reason: impl Into<String>) -> Self {
        let lease = if to == JobState::Queued || to.is_terminal() { LeaseChange::Clear } else { LeaseChange::Keep };
        Transition {
            job,
            from,
            to,
            owner: None,
            attempt: None,
            reason: reason.into(),
            lease,
            result: None,
            error: None,
        }
    }

    pub fn owned_by(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    pub fn at_attempt(mut self, attempt: i32) -> Self {
        self.attempt = Some(attempt);
        self
    }
}

/// What a request to cancel found.
#[derive(Debug, Clone)]
pub enum Cancellation {
    /// The job is now cancelled.
    Cancelled(Job),
    /// The job had already ended (succeeded, failed or cancelled); nothing changed.
    AlreadyEnded(Job),
}

/// How many times [`LifecycleStore::cancel_job`] re-reads a job that the scheduler or an agent moved between
/// its read and its write. Each lost round means the job made progress, so a few suffice.
pub(crate) const CANCEL_ROUNDS: usize = 8;

/// A resumed job's `max_restarts`: the failures it has had count as used, and the spec's budget starts again
/// from here (a job that failed for having used its restarts would otherwise fail at its first hiccup).
pub(crate) fn resumed_restart_budget(job: &Job) -> i32 {
    let budget = job.spec.max_restarts.min(i32::MAX as u32) as i32;
    job.user_attempt().max(0).saturating_add(budget)
}

/// What [`succeed_job`](LifecycleStore::succeed_job) does to the active placement `job`: succeeded, with
/// `result`.
pub(crate) fn success_transition(job: &Job, result: Option<Value>) -> Transition {
    let reason = format!("{} succeeded", job.placement_name());
    let mut transition = Transition::new(job.id, job.state, JobState::Succeeded, reason);
    transition.result = result;
    transition
}

/// What [`fail_placement`](LifecycleStore::fail_placement) does to the active placement `job` that failed
/// because of `why`: back to the queue when `retryable` and restarts remain ([`Job::may_restart`]),
/// otherwise failed with `why` as the job's error.
pub(crate) fn failure_transition(job: &Job, why: &str, retryable: bool) -> Transition {
    let (to, reason) = if retryable && job.may_restart() {
        (JobState::Queued, format!("{} failed, retrying: {why}", job.placement_name()))
    } else {
        (JobState::Failed, format!("{} failed: {why}", job.placement_name()))
    };
    let mut transition = Transition::new(job.id, job.state, to, reason);
    if to == JobState::Failed {
        transition.error = Some(why.to_string());
    }
    transition
}

#[async_trait]
pub trait LifecycleStore: Send + Sync {
    /// One guarded state change plus its event. `Ok(None)`: the guard did not match (someone else won, or
    /// the caller's view is stale) and nothing changed. InvalidTransition when the life cycle forbids it.
    async fn transition(&self, transition: &Transition) -> StoreResult<Option<Job>>;
    /// Starts a queued job on the devices the placement policy chose: queued → scheduled, leased to `owner`,
    /// attempt + 1, with its event, and one pending assignment per rank. None when the job is no longer
    /// queued; Conflict (and nothing written) when a device is busy after all.
    async fn start_job(
        &self,
        id: JobId,
        owner: &str,
        lease: Duration,
        ranks: &[NewAssignment],
    ) -> StoreResult<Option<(Job, Vec<Assignment>)>>;
    /// Placement `attempt` finished training: succeeded with `result`, its pending ranks cancelled. None when
    /// `attempt` is no longer the job's active placement.
    async fn succeed_job(&self, id: JobId, attempt: i32, result: Option<Value>) -> StoreResult<Option<Job>>;
    /// Placement `attempt` failed because of `why`: back to the queue (resuming from the last checkpoint)
    /// when `retryable` and restarts remain, otherwise failed with `why` as the job's error; its pending
    /// ranks cancelled. None when `attempt` is no longer the job's active placement.
    async fn fail_placement(&self, id: JobId, attempt: i32, why: &str, retryable: bool) -> StoreResult<Option<Job>>;
    /// Requeues a scheduled or running placement whose devices are being reclaimed: back to `queued` with
    /// `preemptions` + 1 (not a failure), its pending assignments cancelled and its delivered or running ones
    /// marked `preempted` (their agents checkpoint, then stop them). None when `attempt` is no longer the
    /// job's active placement.
    async fn preempt_job(&self, id: JobId, attempt: i32, reason: &str) -> StoreResult<Option<Job>>;
    /// Ends a scheduled or running placement `stopped` (a study's search found it not among the best): as a
    /// preemption, its ranks checkpoint and stop, but the job is not queued again; [`resume_job`] queues it
    /// when the search promotes it. None when `attempt` is no longer the job's active placement.
    ///
    /// [`resume_job`]: LifecycleStore::resume_job
    async fn stop_job(&self, id: JobId, attempt: i32, reason: &str) -> StoreResult<Option<Job>>;
    /// Cancels a job that has not ended, whatever its state, and its pending ranks. None when there is no
    /// such job; Conflict when it kept changing state through every round.
    async fn cancel_job(&self, id: JobId, reason: &str) -> StoreResult<Option<Cancellation>>;
    /// failed/cancelled/stopped → queued: the job is placed again and resumes from its newest checkpoint (the only
    /// way out of an ended state, so `JobState::can_become` does not list it). Its restart budget starts
    /// again: the spec's `max_restarts` more failures from here. None when there is no such job; Conflict
    /// when it has not ended, has succeeded, or changed meanwhile.
    async fn resume_job(&self, id: JobId, reason: &str) -> StoreResult<Option<Job>>;
    /// Extends the lease of every active job with a live assignment on this node (its agent is alive).
    async fn renew_node_leases(&self, node_id: NodeId, lease: Duration) -> StoreResult<u64>;
}

macro_rules! impl_lifecycle_store {
    ($store:ty) => {
        const _: () = {
            use std::time::Duration;

            use chrono::{DateTime, Utc};
            use ringtrain_core::{JobId, JobState, NodeId};
            use serde_json::Value;
            use sqlx::types::Json;
            use uuid::Uuid;

            use crate::backend::{lease_expiry, SqlBackend};
            use crate::lifecycle::{
                failure_transition, resumed_restart_budget, success_transition, Cancellation, LifecycleStore,
                CANCEL_ROUNDS,
            };
            use crate::rows::{AssignmentRow, JobRow, ASSIGNMENT_COLUMNS, JOB_COLUMNS};
            use crate::{now, Assignment, Job, LeaseChange, NewAssignment, StoreError, StoreResult, Transition};

            type Tx<'a> = sqlx::Transaction<'a, <$store as SqlBackend>::Db>;

            impl $store {
                /// Placement `attempt` halted with its ranks checkpointing: back to the queue (`to` queued: a
                /// preemption, counted) or ended `stopped` (by a study's search). Its pending assignments are
                /// cancelled and its delivered or running ones marked `preempted` (their agents checkpoint,
                /// then stop them). None when `attempt` is no longer the job's active placement.
                async fn halt_placement(
                    &self,
                    id: JobId,
                    attempt: i32,
                    to: JobState,
                    reason: &str,
                ) -> StoreResult<Option<Job>> {
                    let (set, word) = match to {
                        JobState::Queued => ("state = 'queued', preemptions = preemptions + 1", "preempted"),
                        JobState::Stopped => ("state = 'stopped', finished_at = $3", "stopped"),
                        other => return Err(StoreError::InvalidTransition(format!("halting a placement to {other}"))),
                    };
                    let now = now();
                    let mut tx = self.pool().begin().await?;
                    let Some(current) = Self::active_placement(&mut tx, id, attempt).await? else {
                        tx.rollback().await?;
                        return Ok(None);
                    };
                    let from = current.state.as_str();
                    // Guarded on the state just read: a concurrent finish or cancel wins and this changes nothing.
                    let sql = format!(
                        "UPDATE jobs SET {set}, lease_owner = NULL, lease_expires = NULL, updated_at = $3 \
                         WHERE id = $1 AND attempt = $2 AND state = $4 RETURNING {JOB_COLUMNS}"
                    );
                    let row: Option<JobRow> = sqlx::query_as(&sql)
                        .bind(id.0)
                        .bind(attempt)
                        .bind(now)
                        .bind(from)
                        .fetch_optional(&mut *tx)
                        .await?;
                    let Some(row) = row else {
                        tx.rollback().await?;
                        return Ok(None);
                    };
                    let job: Job = row.try_into()?;
                    // named as it ran (the preemption count has just moved on)
                    let reason = format!("{} {word}: {reason}", current.placement_name());
                    let numbers = (attempt, current.user_attempt());
                    Self::insert_state_event(&mut tx, id, now, (from, to.as_str()), numbers, &reason).await?;
                    Self::cancel_pending_in(&mut tx, id, Some(attempt)).await?;
                    sqlx::query(
                        "UPDATE assignments SET preempted = TRUE, updated_at = $3 \
                         WHERE job_id = $1 AND attempt = $2 AND state IN ('delivered', 'running')",
                    )
                    .bind(id.0)
                    .bind(attempt)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                    tx.commit().await?;
                    Ok(Some(job))
                }

                /// The compare-and-set of [`LifecycleStore::transition`] and its event, inside the caller's
                /// transaction.
                async fn transition_in(tx: &mut Tx<'_>, t: &Transition) -> StoreResult<Option<Job>> {
                    if !t.from.can_become(t.to) {
                        return Err(StoreError::InvalidTransition(format!("{} -> {}", t.from, t.to)));
                    }
                    let (lease_mode, lease_owner, lease_expires) = match &t.lease {
                        LeaseChange::Keep => ("keep", None, None),
                        LeaseChange::Clear => ("clear", None, None),
                        LeaseChange::Set { owner, expires } => ("set", Some(owner.as_str()), Some(*expires)),
                    };
                    let now = now();
                    // State, and optionally owner and attempt, must still be what the caller saw.
                    let sql = format!(
                        "UPDATE jobs SET state = $4, updated_at = $5, \
                         started_at = CASE WHEN $4 = 'running' AND started_at IS NULL THEN $5 ELSE started_at END, \
                         finished_at = CASE WHEN $4 IN ('succeeded', 'failed', 'cancelled', 'stopped') THEN $5 \
                             ELSE finished_at END, \
                         lease_owner = CASE WHEN $6 = 'keep' THEN lease_owner WHEN $6 = 'set' THEN $7 ELSE NULL END, \
                         lease_expires = CASE WHEN $6 = 'keep' THEN lease_expires WHEN $6 = 'set' THEN $8 \
                             ELSE NULL END, \
                         result = COALESCE($9, result), error = COALESCE($10, error) \
                         WHERE id = $1 AND state = $2 AND ($3 IS NULL OR lease_owner = $3) \
                         AND ($11 IS NULL OR attempt = $11) RETURNING {JOB_COLUMNS}"
                    );
                    let row: Option<JobRow> = sqlx::query_as(&sql)
                        .bind(t.job.0)
                        .bind(t.from.as_str())
                        .bind(t.owner.as_deref())
                        .bind(t.to.as_str())
                        .bind(now)
                        .bind(lease_mode)
                        .bind(lease_owner)
                        .bind(lease_expires)
                        .bind(t.result.as_ref().map(Json))
                        .bind(t.error.as_deref())
                        .bind(t.attempt)
                        .fetch_optional(&mut **tx)
                        .await?;
                    let Some(row) = row else { return Ok(None) };
                    let job: Job = row.try_into()?;
                    let change = (t.from.as_str(), t.to.as_str());
                    Self::insert_state_event(tx, t.job, now, change, (job.attempt, job.user_attempt()), &t.reason).await?;
                    Ok(Some(job))
                }

                /// Writes a job's state-change event inside the caller's transaction.
                async fn insert_state_event(
                    tx: &mut Tx<'_>,
                    job: JobId,
                    at: DateTime<Utc>,
                    change: (&str, &str),
                    (placement, attempt): (i32, i32),
                    reason: &str,
                ) -> StoreResult<()> {
                    sqlx::query(
                        "INSERT INTO job_events (job_id, at, kind, from_state, to_state, attempt, run_attempt, reason) \
                         VALUES ($1, $2, 'state', $3, $4, $5, $6, $7)",
                    )
                    .bind(job.0)
                    .bind(at)
                    .bind(change.0)
                    .bind(change.1)
                    .bind(placement)
                    .bind(attempt)
                    .bind(reason)
                    .execute(&mut **tx)
                    .await?;
                    Ok(())
                }

                /// Cancels the job's assignments no agent has picked up yet (of placement `attempt` only, when
                /// given: a late report about one placement must never cancel the next one's ranks), inside the
                /// caller's transaction.
                async fn cancel_pending_in(tx: &mut Tx<'_>, job: JobId, attempt: Option<i32>) -> StoreResult<()> {
                    sqlx::query(
                        "UPDATE assignments SET state = 'cancelled', updated_at = $2 \
                         WHERE job_id = $1 AND state = 'pending' AND ($3 IS NULL OR attempt = $3)",
                    )
                    .bind(job.0)
                    .bind(now())
                    .bind(attempt)
                    .execute(&mut **tx)
                    .await?;
                    Ok(())
                }

                /// The job, if `attempt` is its active (scheduled or running) placement. Written, not read (a
                /// no-op update): on SQLite a deferred transaction that reads first and writes later fails at
                /// once with SQLITE_BUSY_SNAPSHOT when another connection committed in between, while a write
                /// first takes the lock up front and waits out the busy timeout; on Postgres it locks the row.
                async fn active_placement(tx: &mut Tx<'_>, id: JobId, attempt: i32) -> StoreResult<Option<Job>> {
                    let sql = format!(
                        "UPDATE jobs SET updated_at = updated_at WHERE id = $1 AND attempt = $2 \
                         AND state IN ('scheduled', 'running') RETURNING {JOB_COLUMNS}"
                    );
                    let row: Option<JobRow> =
                        sqlx::query_as(&sql).bind(id.0).bind(attempt).fetch_optional(&mut **tx).await?;
                    row.map(TryInto::try_into).transpose()
                }

                /// Ends the active placement `attempt` with `transition` (built from the job as it is now) and
                /// cancels its pending ranks, in one transaction.
                async fn end_placement(
                    &self,
                    id: JobId,
                    attempt: i32,
                    transition: impl FnOnce(&Job) -> Transition + Send,
                ) -> StoreResult<Option<Job>> {
                    let mut tx = self.pool().begin().await?;
                    let Some(job) = Self::active_placement(&mut tx, id, attempt).await? else {
                        tx.rollback().await?;
                        return Ok(None);
                    };
                    let Some(ended) = Self::transition_in(&mut tx, &transition(&job).at_attempt(attempt)).await? else {
                        tx.rollback().await?;
                        return Ok(None);
                    };
                    Self::cancel_pending_in(&mut tx, id, Some(attempt)).await?;
                    tx.commit().await?;
                    Ok(Some(ended))
                }
            }

            #[async_trait::async_trait]
            impl LifecycleStore for $store {
                async fn transition(&self, t: &Transition) -> StoreResult<Option<Job>> {
                    let mut tx = self.pool().begin().await?;
                    let job = Self::transition_in(&mut tx, t).await?;
                    if job.is_some() {
                        tx.commit().await?;
                    } else {
                        tx.rollback().await?;
                    }
                    Ok(job)
                }

                async fn start_job(
                    &self,
                    id: JobId,
                    owner: &str,
                    lease: Duration,
                    ranks: &[NewAssignment],
                ) -> StoreResult<Option<(Job, Vec<Assignment>)>> {
                    let now = now();
                    let mut tx = self.pool().begin().await?;
                    // an elastic job's placements hold different counts: the column is the current one's
                    let sql = format!(
                        "UPDATE jobs SET state = 'scheduled', attempt = attempt + 1, lease_owner = $2, \
                         lease_expires = $3, updated_at = $4, devices = coalesce($5, devices) WHERE id = $1 AND state = 'queued' \
                         RETURNING {JOB_COLUMNS}"
                    );
                    let row: Option<JobRow> = sqlx::query_as(&sql)
                        .bind(id.0)
                        .bind(owner)
                        .bind(lease_expiry(lease))
                        .bind(now)
                        .bind((!ranks.is_empty()).then_some(ranks.len() as i32))
                        .fetch_optional(&mut *tx)
                        .await?;
                    let Some(row) = row else {
                        tx.rollback().await?;
                        return Ok(None);
                    };
                    let job: Job = row.try_into()?;
                    let nodes: std::collections::BTreeSet<NodeId> = ranks.iter().map(|r| r.node_id).collect();
                    // the previous placement's count, read after the write (a read first would make SQLite's
                    // deferred transaction upgrade to a write, which concurrent starts turn into "locked")
                    let (previous,): (i64,) =
                        sqlx::query_as("SELECT count(*) FROM assignments WHERE job_id = $1 AND attempt = $2")
                            .bind(id.0)
                            .bind(job.attempt - 1)
                            .fetch_one(&mut *tx)
                            .await?;
                    let resized = match previous {
                        0 => String::new(),
                        n if n == ranks.len() as i64 => String::new(),
                        n => format!(" (resized {n} → {} devices)", ranks.len()),
                    };
                    let reason = format!(
                        "{}: placed on {} device(s) of {} node(s) by {owner}{resized}",
                        job.placement_name(),
                        ranks.len(),
                        nodes.len()
                    );
                    let numbers = (job.attempt, job.user_attempt());
                    Self::insert_state_event(&mut tx, id, now, ("queued", "scheduled"), numbers, &reason).await?;
                    // A busy device fails the whole start (the unique index on live assignments), and dropping
                    // the transaction undoes the claim with it.
                    let sql = format!(
                        "INSERT INTO assignments (id, job_id, attempt, node_id, device_id, rank, world_size, state, \
                         created_at, updated_at, rendezvous_secret) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $8, $9) RETURNING {ASSIGNMENT_COLUMNS}"
                    );
                    // one secret for the placement's ranks to prove to each other (see RendezvousConfig)
                    let secret = crate::generate_token();
                    let mut placed = Vec::with_capacity(ranks.len());
                    for rank in ranks {
                        let row: AssignmentRow = sqlx::query_as(&sql)
                            .bind(Uuid::new_v4())
                            .bind(id.0)
                            .bind(job.attempt)
                            .bind(rank.node_id.0)
                            .bind(rank.device_id.0)
                            .bind(rank.rank)
                            .bind(ranks.len() as i32)
                            .bind(now)
                            .bind(&secret)
                            .fetch_one(&mut *tx)
                            .await?;
                        placed.push(row.try_into()?);
                    }
                    tx.commit().await?;
                    Ok(Some((job, placed)))
                }

                async fn succeed_job(&self, id: JobId, attempt: i32, result: Option<Value>) -> StoreResult<Option<Job>> {
                    self.end_placement(id, attempt, |job| success_transition(job, result)).await
                }

                async fn fail_placement(
                    &self,
                    id: JobId,
                    attempt: i32,
                    why: &str,
                    retryable: bool,
                ) -> StoreResult<Option<Job>> {
                    self.end_placement(id, attempt, |job| failure_transition(job, why, retryable)).await
                }

                async fn preempt_job(&self, id: JobId, attempt: i32, reason: &str) -> StoreResult<Option<Job>> {
                    self.halt_placement(id, attempt, JobState::Queued, reason).await
                }

                async fn stop_job(&self, id: JobId, attempt: i32, reason: &str) -> StoreResult<Option<Job>> {
                    self.halt_placement(id, attempt, JobState::Stopped, reason).await
                }

                async fn cancel_job(&self, id: JobId, reason: &str) -> StoreResult<Option<Cancellation>> {
                    for _ in 0..CANCEL_ROUNDS {
                        let Some(job) = crate::jobs::JobStore::get_job(self, id).await? else { return Ok(None) };
                        if job.state.is_terminal() {
                            return Ok(Some(Cancellation::AlreadyEnded(job)));
                        }
                        let mut tx = self.pool().begin().await?;
                        let transition = Transition::new(id, job.state, JobState::Cancelled, reason);
                        if let Some(cancelled) = Self::transition_in(&mut tx, &transition).await? {
                            Self::cancel_pending_in(&mut tx, id, None).await?;
                            tx.commit().await?;
                            return Ok(Some(Cancellation::Cancelled(cancelled)));
                        }
                        // The scheduler or an agent moved the job between the read and the write: look again.
                        tx.rollback().await?;
                    }
                    Err(StoreError::Conflict(format!("job {id} kept changing state; try again")))
                }

                async fn resume_job(&self, id: JobId, reason: &str) -> StoreResult<Option<Job>> {
                    let Some(job) = crate::jobs::JobStore::get_job(self, id).await? else { return Ok(None) };
                    if !matches!(job.state, JobState::Failed | JobState::Cancelled | JobState::Stopped) {
                        return Err(StoreError::Conflict(format!(
                            "job {id} is {}: only a failed, cancelled or stopped job can be resumed",
                            job.state
                        )));
                    }
                    let budget = resumed_restart_budget(&job);
                    let now = now();
                    let mut tx = self.pool().begin().await?;
                    let sql = format!(
                        "UPDATE jobs SET state = 'queued', updated_at = $3, finished_at = NULL, result = NULL, \
                         error = NULL, lease_owner = NULL, lease_expires = NULL, max_restarts = $4 \
                         WHERE id = $1 AND state = $2 AND attempt = $5 RETURNING {JOB_COLUMNS}"
                    );
                    let row: Option<JobRow> = sqlx::query_as(&sql)
                        .bind(id.0)
                        .bind(job.state.as_str())
                        .bind(now)
                        .bind(budget)
                        .bind(job.attempt)
                        .fetch_optional(&mut *tx)
                        .await?;
                    let Some(row) = row else {
                        tx.rollback().await?;
                        return Err(StoreError::Conflict(format!("job {id} changed while it was resumed; try again")));
                    };
                    let resumed: Job = row.try_into()?;
                    let change = (job.state.as_str(), JobState::Queued.as_str());
                    let attempts = (resumed.attempt, resumed.user_attempt());
                    Self::insert_state_event(&mut tx, id, now, change, attempts, reason).await?;
                    tx.commit().await?;
                    Ok(Some(resumed))
                }

                async fn renew_node_leases(&self, node_id: NodeId, lease: Duration) -> StoreResult<u64> {
                    let _urgent = self.write_gate().map(|gate| gate.urgent());
                    let done = sqlx::query(
                        "UPDATE jobs SET lease_expires = $2 WHERE state IN ('scheduled', 'running') \
                         AND lease_owner IS NOT NULL AND id IN (SELECT job_id FROM assignments WHERE node_id = $1 \
                         AND attempt = jobs.attempt AND state IN ('pending', 'delivered', 'running'))",
                    )
                    .bind(node_id.0)
                    .bind(lease_expiry(lease))
                    .execute(self.pool())
                    .await?;
                    Ok(done.rows_affected())
                }
            }
        };
    };
}

pub(crate) use impl_lifecycle_store;

#[cfg(test)]
mod tests {
    use ringtrain_core::spec::DeviceKind;
    use ringtrain_core::{JobId, JobState, TeamId};
    use serde_json::json;
    use uuid::Uuid;

    use super::{failure_transition, success_transition};
    use crate::{now, Job, LeaseChange};

    /// A running job at placement `attempt`, of which `preemptions` ended in a preemption.
    fn running(attempt: i32, preemptions: i32, max_restarts: i32) -> Job {
        let at = now();
        let spec = json!({"model": {"name": "mlp"}, "dataset": "synthetic"});
        Job {
            id: JobId(Uuid::new_v4()),
            seq: 1,
            team_id: TeamId(Uuid::new_v4()),
            created_by: None,
            name: None,
            spec: ringtrain_core::JobSpec::parse(&spec.to_string()).expect("a valid spec"),
            spec_json: spec,
            effective: None,
            dataset_size: None,
            state: JobState::Running,
            priority: 0,
            device: DeviceKind::Cpu,
            devices: 1,
            attempt,
            preemptions,
            max_restarts,
            lease_owner: Some("server".into()),
            lease_expires: Some(at),
            created_at: at,
            updated_at: at,
            started_at: Some(at),
            finished_at: None,
            tags: Vec::new(),
            note: String::new(),
            result: None,
            error: None,
            unplaceable: None,
            study: None,
        }
    }

    #[test]
    fn a_retryable_failure_requeues_while_restarts_remain() {
        // First run of a job allowed one restart: requeued, no error, lease cleared.
        let t = failure_transition(&running(1, 0, 1), "rank 0 exited 1", true);
        assert_eq!((t.from, t.to), (JobState::Running, JobState::Queued));
        assert_eq!(t.reason, "placement 1 (attempt 1) failed, retrying: rank 0 exited 1");
        assert_eq!(t.error, None);
        assert_eq!(t.lease, LeaseChange::Clear);

        // Its second run used the one restart: failed, with the cause as the job's error.
        let t = failure_transition(&running(2, 0, 1), "rank 0 exited 1", true);
        assert_eq!(t.to, JobState::Failed);
        assert_eq!(t.reason, "placement 2 (attempt 2) failed: rank 0 exited 1");
        assert_eq!(t.error.as_deref(), Some("rank 0 exited 1"));
    }

    #[test]
    fn preemptions_use_none_of_the_restart_budget() {
        // Third placement, two of the earlier ones preempted: still the first attempt, so it may restart.
        let t = failure_transition(&running(3, 2, 1), "node lost", true);
        assert_eq!(t.to, JobState::Queued);
        assert_eq!(t.reason, "placement 3 (attempt 1) failed, retrying: node lost");
    }

    #[test]
    fn a_failure_that_is_not_retryable_fails_at_once() {
        let t = failure_transition(&running(1, 0, 5), "bad spec", false);
        assert_eq!(t.to, JobState::Failed);
        assert_eq!(t.reason, "placement 1 (attempt 1) failed: bad spec");
        assert_eq!(t.error.as_deref(), Some("bad spec"));
        // No restarts allowed at all.
        assert_eq!(failure_transition(&running(1, 0, 0), "x", true).to, JobState::Failed);
    }

    #[test]
    fn success_keeps_the_result() {
        let job = running(2, 1, 0);
        let t = success_transition(&job, Some(json!({"accuracy": 0.9})));
        assert_eq!((t.job, t.from, t.to), (job.id, JobState::Running, JobState::Succeeded));
        assert_eq!(t.reason, "placement 2 (attempt 1) succeeded");
        assert_eq!(t.result, Some(json!({"accuracy": 0.9})));
        assert_eq!((t.error, t.lease, t.owner, t.attempt), (None, LeaseChange::Clear, None, None));
    }

    #[test]
    fn a_resumed_job_gets_its_restart_budget_again() {
        // the spec's budget is 3; four runs failed (one preemption did not count)
        let job = running(5, 1, 3);
        assert_eq!(super::resumed_restart_budget(&job), 4 + 3);
        let resumed = Job { max_restarts: super::resumed_restart_budget(&job), attempt: 6, ..job };
        assert!(resumed.may_restart(), "the first failure after a resume is retried");
    }
}
