//! The private contract between the SQL written once (the aggregate modules: [`teams`](crate::teams),
//! [`jobs`](crate::jobs), [`lifecycle`](crate::lifecycle), [`metrics`](crate::metrics),
//! [`nodes`](crate::nodes), [`assignments`](crate::assignments), [`artifacts`](crate::artifacts),
//! [`usage`](crate::usage), [`logs`](crate::logs), [`studies`](crate::studies)) and the two databases. Each
//! aggregate is a small `macro_rules!` instantiated once per backend; everything it needs from the backend is
//! named here, so a backend that lacks a piece fails to compile with that piece's name.
//!
//! Why macros and not one generic `impl<DB: sqlx::Database>`: every generic body would restate
//! `for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>` plus `Encode + Type` bounds for each bound
//! type, and Rust carries only supertrait bounds forward, so a helper trait cannot absorb them (see
//! docs/ARCHITECTURE.md, "The store"). What differs between the databases is only this trait.

use std::future::Future;

use sqlx::migrate::Migrator;

use crate::error::{StoreError, StoreResult};
use crate::records::Backend;

/// What an aggregate's SQL needs from the database it runs on.
pub(crate) trait SqlBackend: Send + Sync {
    /// The sqlx database type (`sqlx::Postgres` or `sqlx::Sqlite`).
    type Db: sqlx::Database;

    const KIND: Backend;

    /// The collation clause that makes text comparisons byte order (`COLLATE "C"` on Postgres; SQLite's
    /// default `BINARY` already is).
    const BYTE_ORDER: &'static str;

    /// The function `F(haystack, needle)` that is above 0 when the text contains the needle (case-sensitive
    /// on both: `strpos` on Postgres, `instr` on SQLite, where `LIKE` ignores ASCII case).
    const FIND_TEXT: &'static str;

    /// Adds ` AND <haystack> holds <needle>` to a query: on Postgres a `LIKE '%needle%'`, which the trigram
    /// index on the run history's searched text serves (migration 0014); on SQLite `instr`, a scan.
    fn push_contains(query: &mut sqlx::QueryBuilder<'_, Self::Db>, haystack: &str, needle: &str);

    /// An SQL expression for the seconds from timestamp expression `from` to `to`.
    fn seconds_between(from: &str, to: &str) -> String;

    /// The connection pool every statement runs on.
    fn pool(&self) -> &sqlx::Pool<Self::Db>;

    /// The migrations of this build for this dialect.
    fn migrator(&self) -> &'static Migrator;

    /// What orders writes where the database has one writer at a time (SQLite): heartbeats and lease
    /// renewals go before metric batches. None where rows are locked one by one (Postgres).
    fn write_gate(&self) -> Option<&crate::write_gate::WriteGate>;

    /// Holds, or takes now, the scheduler leadership (a Postgres advisory lock; always on SQLite).
    fn try_lead(&self) -> impl Future<Output = StoreResult<bool>> + Send;

    /// The statement that moves the change version on and returns it, and tells the other servers on this
    /// database (Postgres: a NOTIFY in the same statement, delivered when it commits).
    const BUMP_CHANGE_VERSION: &'static str;

    /// A table expression of the queued jobs a scheduler pass looks at: the first `$1` of each team and device
    /// kind by (priority descending, seq), every column of `jobs`.
    const QUEUE_WINDOW: &'static str;

    /// The statement that tells the other servers, when its transaction commits, that a token was revoked
    /// (their token caches forget what they hold); None where there are no other servers (SQLite).
    const ANNOUNCE_TOKEN_REVOKED: Option<&'static str>;

    /// Reports what the other servers announce, until the connection fails ([`crate::Store::listen`]).
    fn listen(
        &self,
        on_notice: Box<dyn Fn(crate::Notice) + Send + Sync>,
    ) -> impl Future<Output = StoreResult<()>> + Send;
}

/// When a lease taken now for `lease` runs out.
pub(crate) fn lease_expiry(lease: std::time::Duration) -> chrono::DateTime<chrono::Utc> {
    crate::now() + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::days(1))
}

/// Ready means every migration this build knows was applied (an older binary against a newer schema is
/// fine; a newer binary whose migrations failed is not).
pub(crate) fn check_migrations(migrator: &Migrator, applied: impl Iterator<Item = i64>) -> StoreResult<()> {
    let applied: std::collections::HashSet<i64> = applied.collect();
    match migrator.iter().find(|m| !applied.contains(&m.version)) {
        Some(missing) => Err(StoreError::Config(format!("migration {} is not applied", missing.version))),
        None => Ok(()),
    }
}

/// The [`Store`](crate::Store) trait itself for one backend: what it is, whether it is ready, and the
/// coordination between server replicas, all delegated to its [`SqlBackend`].
macro_rules! impl_store_core {
    ($store:ty) => {
        const _: () = {
            use crate::backend::{check_migrations, SqlBackend};
            use crate::{Backend, StoreError, StoreResult};

            #[async_trait::async_trait]
            impl crate::Store for $store {
                fn backend(&self) -> Backend {
                    <Self as SqlBackend>::KIND
                }

                async fn ready(&self) -> StoreResult<()> {
                    let applied: Vec<(i64,)> = sqlx::query_as("SELECT version FROM _sqlx_migrations WHERE success")
                        .fetch_all(SqlBackend::pool(self))
                        .await
                        .map_err(StoreError::Database)?;
                    check_migrations(SqlBackend::migrator(self), applied.into_iter().map(|(v,)| v))
                }

                async fn try_lead(&self) -> StoreResult<bool> {
                    SqlBackend::try_lead(self).await
                }

                async fn listen(&self, on_notice: Box<dyn Fn(crate::Notice) + Send + Sync>) -> StoreResult<()> {
                    SqlBackend::listen(self, on_notice).await
                }
            }
        };
    };
}

pub(crate) use impl_store_core;
