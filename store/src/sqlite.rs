//! The embedded SQLite store: the single-machine default (`ringtrain up`), one file under the data directory.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Sqlite;

use crate::backend::SqlBackend;
use crate::error::{StoreError, StoreResult};
use crate::records::Backend;
use crate::write_gate::WriteGate;

/// The migrations of this build, embedded at compile time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    gate: Arc<WriteGate>,
}

impl SqliteStore {
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
        migrate(&pool).await?;
        Ok(SqliteStore { pool, gate: Arc::default() })
    }
}

/// Applies the migrations on one connection with foreign keys off, as SQLite's recipe for changing a table
/// (rebuild, copy, drop, rename) needs: with them on, dropping the old `jobs` would cascade into every table
/// that references it (https://www.sqlite.org/lang_altertable.html#otheralter). sqlx runs each migration in
/// a transaction, where the pragma cannot change, hence before. Any dangling reference afterwards is an
/// error, and the connection goes back to the pool with foreign keys on.
async fn migrate(pool: &SqlitePool) -> StoreResult<()> {
    let mut connection = pool.acquire().await?;
    sqlx::query("PRAGMA foreign_keys = OFF").execute(&mut *connection).await?;
    let migrated = MIGRATOR.run(&mut *connection).await;
    let dangling: Vec<(String,)> =
        sqlx::query_as("SELECT \"table\" FROM pragma_foreign_key_check").fetch_all(&mut *connection).await?;
    sqlx::query("PRAGMA foreign_keys = ON").execute(&mut *connection).await?;
    migrated?;
    match dangling.first() {
        None => Ok(()),
        Some((table,)) => Err(StoreError::Corrupt(format!(
            "after the migrations, {} row(s) of table {table} and others refer to rows that do not exist",
            dangling.len()
        ))),
    }
}

impl SqlBackend for SqliteStore {
    type Db = Sqlite;
    const KIND: Backend = Backend::Sqlite;
    /// SQLite's default BINARY collation already compares bytes.
    const BYTE_ORDER: &'static str = "";
    const FIND_TEXT: &'static str = "instr";

    fn push_contains(query: &mut sqlx::QueryBuilder<'_, Sqlite>, haystack: &str, needle: &str) {
        query.push(format!(" AND instr({haystack}, ")).push_bind(needle.to_owned()).push(") > 0");
    }

    fn seconds_between(from: &str, to: &str) -> String {
        format!("((julianday({to}) - julianday({from})) * 86400.0)")
    }

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        &MIGRATOR
    }

    fn write_gate(&self) -> Option<&WriteGate> {
        Some(&self.gate)
    }

    /// One server owns a SQLite file, so it always leads.
    async fn try_lead(&self) -> StoreResult<bool> {
        Ok(true)
    }

    // the one server is told in-process
    const BUMP_CHANGE_VERSION: &'static str = "UPDATE change_version SET seq = seq + 1 WHERE id = 1 RETURNING seq";

    // SQLite has no LATERAL; the embedded database's queues are the quickstart's
    const QUEUE_WINDOW: &'static str = "(SELECT * FROM (SELECT jobs.*, ROW_NUMBER() OVER \
         (PARTITION BY team_id, device ORDER BY priority DESC, seq) AS place_in_team \
         FROM jobs WHERE state = 'queued') WHERE place_in_team <= $1)";

    const ANNOUNCE_TOKEN_REVOKED: Option<&'static str> = None;

    async fn listen(&self, _on_notice: Box<dyn Fn(crate::Notice) + Send + Sync>) -> StoreResult<()> {
        Ok(())
    }
}
