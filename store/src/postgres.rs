//! The Postgres store: production, several server replicas against one database.

use std::time::Duration;

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::Postgres;

use crate::error::{StoreError, StoreResult};
use crate::model::{Backend, Job};
use crate::rows::{self, JobRow, JOB_COLUMNS};
use crate::shared::{impl_store, lease_expiry};

/// The migrations of this build, embedded at compile time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// The session advisory lock whose holder is the scheduler leader ("ringtrain" in ASCII).
const LEADER_LOCK: i64 = 0x7269_6e67_7472_6169;
/// The NOTIFY channel for "jobs or assignments changed".
const CHANGES_CHANNEL: &str = "ringtrain_changes";

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The connection holding the leader lock, while this process leads. The lock lives as long as the
    /// session: if the connection dies, so does the leadership, and another server takes it.
    leader: Arc<tokio::sync::Mutex<Option<PoolConnection<Postgres>>>>,
}

impl PgStore {
    const BACKEND: Backend = Backend::Postgres;
    /// The collation clause that makes text comparisons byte order.
    const BYTE_ORDER: &'static str = "COLLATE \"C\"";

    /// Connects and applies the migrations.
    pub async fn connect(url: &str) -> StoreResult<PgStore> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(StoreError::Database)?;
        Self::from_pool(pool).await
    }

    /// Wraps an existing pool (tests get one from `#[sqlx::test]`) and applies the migrations.
    pub async fn from_pool(pool: PgPool) -> StoreResult<PgStore> {
        MIGRATOR.run(&pool).await?;
        Ok(PgStore { pool, leader: Arc::default() })
    }

    async fn try_lead_impl(&self) -> StoreResult<bool> {
        let mut leader = self.leader.lock().await;
        if let Some(connection) = leader.as_mut() {
            // Still the same session? Then the lock is still ours.
            if sqlx::query("SELECT 1").execute(&mut **connection).await.is_ok() {
                return Ok(true);
            }
            *leader = None;
        }
        let mut connection = self.pool.acquire().await?;
        let (locked,): (bool,) =
            sqlx::query_as("SELECT pg_try_advisory_lock($1)").bind(LEADER_LOCK).fetch_one(&mut *connection).await?;
        if locked {
            // Kept out of the pool for as long as we lead.
            *leader = Some(connection);
        }
        Ok(locked)
    }

    async fn notify_changes_impl(&self) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, '')").bind(CHANGES_CHANNEL).execute(&self.pool).await?;
        Ok(())
    }

    async fn listen_for_changes_impl(&self, on_change: Box<dyn Fn() + Send + Sync>) -> StoreResult<()> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANGES_CHANNEL).await?;
        loop {
            // PgListener reconnects by itself; a notification lost in a reconnect is covered by the periodic
            // passes and the agents' bounded long-poll.
            listener.recv().await?;
            on_change();
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// One statement: lock up to `limit` queued rows nobody else has locked (`SKIP LOCKED`, so concurrent
    /// claimers split the queue instead of waiting on or double-taking a row), move them to `scheduled`, and
    /// write their events. The pick is a materialized CTE, not `WHERE id IN (SELECT ... LIMIT n)`: as a
    /// semi-join the planner may run that subquery more than once and claim more than n rows.
    async fn claim_queued_impl(&self, owner: &str, limit: i64, lease: Duration) -> StoreResult<Vec<Job>> {
        let sql = format!(
            "WITH picked AS MATERIALIZED ( \
                SELECT id AS picked_id FROM jobs WHERE state = 'queued' ORDER BY priority DESC, seq LIMIT $4 \
                FOR UPDATE SKIP LOCKED), \
             claimed AS ( \
                UPDATE jobs SET state = 'scheduled', attempt = attempt + 1, lease_owner = $1, lease_expires = $2, \
                    updated_at = $3 \
                FROM picked WHERE jobs.id = picked.picked_id AND jobs.state = 'queued' RETURNING {JOB_COLUMNS}), \
             events AS ( \
                INSERT INTO job_events (job_id, at, kind, from_state, to_state, attempt, reason) \
                SELECT id, $3, 'state', 'queued', 'scheduled', attempt, 'claimed by ' || $1 FROM claimed) \
             SELECT {JOB_COLUMNS} FROM claimed"
        );
        let rows: Vec<JobRow> = sqlx::query_as(&sql)
            .bind(owner)
            .bind(lease_expiry(lease))
            .bind(crate::now())
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows::jobs(rows)
    }
}

impl_store!(PgStore, sqlx::Postgres, MIGRATOR);
