//! For test suites that must pass on both databases: [`on_both_backends!`](crate::on_both_backends).

/// Writes each test once and runs it on Postgres and on SQLite. Each test is an `async fn(T)` where `T` is
/// what `setup` (an `async fn(Arc<dyn Store>) -> T`) makes of a fresh, migrated store: a new database per
/// test from `#[sqlx::test]` on Postgres (which fails, never skips, when Postgres is unreachable), a
/// temporary file on SQLite. The calling crate needs `sqlx`, `tokio` and `tempfile` as dev-dependencies.
///
/// ```ignore
/// on_both_backends!(setup = crate::common::TestApp::new; submits_are_idempotent, cancels_end_pending_ranks);
/// ```
#[macro_export]
macro_rules! on_both_backends {
    (setup = $setup:path; $($name:ident),* $(,)?) => {$(
        mod $name {
            #[sqlx::test(migrations = false)]
            async fn postgres(pool: sqlx::PgPool) {
                let store = $crate::PgStore::from_pool(pool).await.expect("migrations apply on Postgres");
                super::$name($setup(std::sync::Arc::new(store)).await).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                // Lives until the test ends: the database file is in it.
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite:{}", dir.path().join("test.db").display());
                let store = $crate::SqliteStore::connect(&url).await.expect("SQLite opens");
                super::$name($setup(std::sync::Arc::new(store)).await).await
            }
        }
    )*};
}
