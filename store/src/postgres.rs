//! The Postgres store: production, several server replicas against one database.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::Postgres;

use crate::backend::SqlBackend;
use crate::error::{StoreError, StoreResult};
use crate::records::Backend;
use crate::Notice;

/// The migrations of this build, embedded at compile time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// The session advisory lock whose holder is the scheduler leader ("ringtrain" in ASCII).
const LEADER_LOCK: i64 = 0x7269_6e67_7472_6169;
/// The NOTIFY channel for "jobs or assignments changed".
const CHANGES_CHANNEL: &str = "ringtrain_changes";
/// The NOTIFY channel for "a token was revoked".
const TOKENS_CHANNEL: &str = "ringtrain_tokens";

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
        // JIT off: the control plane's statements are short, and JIT is chosen from the planner's guessed
        // cost. `teams` holds too few rows for autovacuum ever to analyse it, so the planner guesses 560
        // teams, and a 4 ms scheduler read (QUEUE_WINDOW) spent 180 ms compiling itself.
        let options = PgConnectOptions::from_str(url).map_err(StoreError::Database)?.options([("jit", "off")]);
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
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

    // the NOTIFY on CHANGES_CHANNEL goes out with the version's commit: one round trip, one commit
    const BUMP_CHANGE_VERSION: &'static str = "WITH bumped AS \
         (UPDATE change_version SET seq = seq + 1 WHERE id = 1 RETURNING seq) \
         SELECT bumped.seq FROM bumped, LATERAL (SELECT pg_notify('ringtrain_changes', '')) AS told";

    // Each team's and kind's first jobs straight from the index `jobs_team_queue` (migration 0015): the
    // window over every queued job sorted the whole queue on every pass. EXPLAIN ANALYZE, one team of 10^6
    // jobs (bench history's fill), 2026-12-05: 5.0-12.8 ms against 3.8-4.0 ms at 10^4 queued, 91-118 ms
    // against 17-23 ms at 1.1 x 10^5.
    const QUEUE_WINDOW: &'static str = "(SELECT team_queue.* FROM teams \
         CROSS JOIN (VALUES ('cpu'), ('gpu')) AS kinds (device) \
         CROSS JOIN LATERAL (SELECT * FROM jobs WHERE jobs.team_id = teams.id AND jobs.device = kinds.device \
         AND jobs.state = 'queued' ORDER BY jobs.priority DESC, jobs.seq LIMIT $1) AS team_queue)";

    // a NOTIFY inside the revoking transaction is delivered when, and only if, it commits
    const ANNOUNCE_TOKEN_REVOKED: Option<&'static str> = Some("SELECT pg_notify('ringtrain_tokens', '')");

    async fn listen(&self, on_notice: Box<dyn Fn(Notice) + Send + Sync>) -> StoreResult<()> {
        let failed = self.listen_until_failure(&*on_notice).await;
        on_notice(Notice::Lost);
        failed
    }
}

impl PgStore {
    /// Listens on a connection of its own; after a lost connection, on a new one. Not `PgListener`'s own
    /// reconnect inside `recv`: the token cache must know when notifications may have been missed (`Lost`)
    /// and when they are heard again (`Listening`, said only once `LISTEN` has been answered).
    async fn listen_until_failure(&self, on_notice: &(dyn Fn(Notice) + Send + Sync)) -> StoreResult<()> {
        loop {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener.listen_all([CHANGES_CHANNEL, TOKENS_CHANNEL]).await?;
            on_notice(Notice::Listening);
            while let Some(notification) = listener.try_recv().await? {
                on_notice(match notification.channel() {
                    TOKENS_CHANNEL => Notice::TokenRevoked,
                    _ => Notice::Changed,
                });
            }
            // the connection was lost; changes missed meanwhile are covered by the periodic passes and the
            // agents' bounded long polls, revocations by the token caches forgetting everything
            on_notice(Notice::Lost);
        }
    }
}
