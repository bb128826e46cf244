//! ringtrain's durable state: teams and tokens, jobs and their events, metrics, nodes and devices,
//! assignments, checkpoints and datasets, behind one [`Store`] trait with a Postgres and an embedded SQLite
//! implementation.
//!
//! Both implementations run the same SQL text wherever the dialects agree (timestamps are bound from Rust, so
//! no `now()`; placeholders are `$N`, which SQLite understands too): that shared code lives once, in
//! [`shared`], and is instantiated for each backend. What differs — the migrations, connection set-up, and
//! job claiming (`FOR UPDATE SKIP LOCKED` on Postgres) — lives in [`postgres`] and [`sqlite`].
//!
//! Every job state change is one guarded `UPDATE ... WHERE id = $1 AND state = $2 [AND lease_owner = ...]`
//! plus its event row in the same transaction, so two writers can never both win.

mod error;
mod model;
mod rows;
mod shared;
mod token;

pub mod postgres;
pub mod sqlite;

use std::sync::Arc;

pub use error::{StoreError, StoreResult};
pub use model::*;
pub use postgres::PgStore;
pub use sqlite::SqliteStore;
pub use token::{generate_token, hash_token};

/// Opens the database a URL names (`postgres://...` or `sqlite:...`) and applies its migrations.
pub async fn connect(url: &str) -> StoreResult<Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PgStore::connect(url).await?))
    } else if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url).await?))
    } else {
        Err(StoreError::Config(format!("unsupported database URL {url:?}: expected postgres://... or sqlite:...")))
    }
}
