//! The Postgres store: production, several server replicas against one database.

use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::Postgres;

use crate::backend::SqlBackend;
use crate::error::{StoreError, StoreResult};
use crate::records::Backend;

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
}

impl SqlBackend for PgStore {
    type Db = Postgres;
    const KIND: Backend = Backend::Postgres;
    const BYTE_ORDER: &'static str = "COLLATE \"C\"";
    const FIND_TEXT: &'static str = "strpos";

    fn push_contains(query: &mut sqlx::QueryBuilder<'_, Postgres>, haystack: &str, needle: &str) {
        // `\` is LIKE's default escape character: the needle's own `%`, `_` and `\` match only themselves
        let escaped = needle.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
        query.push(format!(" AND {haystack} LIKE ")).push_bind(format!("%{escaped}%"));
    }

    fn seconds_between(from: &str, to: &str) -> String {
        format!("EXTRACT(EPOCH FROM ({to} - {from}))")
    }

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        &MIGRATOR
    }

    /// Postgres locks rows: a heartbeat never waits behind a metric insert.
    fn write_gate(&self) -> Option<&crate::write_gate::WriteGate> {
        None
    }

    async fn try_lead(&self) -> StoreResult<bool> {
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

    async fn notify_changes(&self) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, '')").bind(CHANGES_CHANNEL).execute(&self.pool).await?;
        Ok(())
    }

    async fn listen_for_changes(&self, on_change: Box<dyn Fn() + Send + Sync>) -> StoreResult<()> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANGES_CHANNEL).await?;
        loop {
            // PgListener reconnects by itself; a notification lost in a reconnect is covered by the periodic
            // passes and the agents' bounded long-poll.
            listener.recv().await?;
            on_change();
        }
    }
}
