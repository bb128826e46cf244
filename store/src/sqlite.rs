//! The embedded SQLite store: the single-machine default (`ringtrain up`), one file under the data directory.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::error::{StoreError, StoreResult};
use crate::model::{Backend, Job};
use crate::rows::{self, JobRow, JOB_COLUMNS};
use crate::shared::{impl_store, lease_expiry};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    const BACKEND: Backend = Backend::Sqlite;
    /// The collation clause that makes text comparisons byte order.
    const BYTE_ORDER: &'static str = "";

    /// Opens (creating if needed) the database file of a `sqlite:` URL and applies the migrations.
    ///
    /// WAL lets readers run beside the one writer; the busy timeout makes a second writer wait its turn
    /// instead of failing with SQLITE_BUSY, which is how concurrent submits and claims serialise here.
    pub async fn connect(url: &str) -> StoreResult<SqliteStore> {
        if url.contains(":memory:") || url.contains("mode=memory") {
            // Each pooled connection would get its own empty in-memory database.
            return Err(StoreError::Config(
                "an in-memory SQLite database cannot be shared by a pool: use a file".into(),
            ));
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(StoreError::Database)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .map_err(StoreError::Database)?;
        MIGRATOR.run(&pool).await?;
        Ok(SqliteStore { pool })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// One server owns a SQLite file, so it always leads.
    async fn try_lead_impl(&self) -> StoreResult<bool> {
        Ok(true)
    }

    /// The one server is told in-process.
    async fn notify_changes_impl(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn listen_for_changes_impl(&self, _on_change: Box<dyn Fn() + Send + Sync>) -> StoreResult<()> {
        Ok(())
    }

    /// SQLite has one writer at a time, so the claiming UPDATE cannot interleave with another: no row locks
    /// are needed, just `UPDATE ... WHERE seq IN (SELECT ... LIMIT n) RETURNING`. Its events go in the same
    /// transaction (SQLite has no writable CTEs).
    async fn claim_queued_impl(&self, owner: &str, limit: i64, lease: Duration) -> StoreResult<Vec<Job>> {
        let now = crate::now();
        let mut tx = self.pool.begin().await?;
        let sql = format!(
            "UPDATE jobs SET state = 'scheduled', attempt = attempt + 1, lease_owner = $1, lease_expires = $2, \
                 updated_at = $3 \
             WHERE seq IN (SELECT seq FROM jobs WHERE state = 'queued' ORDER BY priority DESC, seq LIMIT $4) \
             AND state = 'queued' RETURNING {JOB_COLUMNS}"
        );
        let rows: Vec<JobRow> = sqlx::query_as(&sql)
            .bind(owner)
            .bind(lease_expiry(lease))
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        let jobs = rows::jobs(rows)?;
        for job in &jobs {
            sqlx::query(
                "INSERT INTO job_events (job_id, at, kind, from_state, to_state, attempt, reason) \
                 VALUES ($1, $2, 'state', 'queued', 'scheduled', $3, $4)",
            )
            .bind(job.id.0)
            .bind(now)
            .bind(job.attempt)
            .bind(format!("claimed by {owner}"))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(jobs)
    }
}

impl_store!(SqliteStore, sqlx::Sqlite, MIGRATOR);
