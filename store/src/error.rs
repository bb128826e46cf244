//! What can go wrong in the store, in terms the API can map to HTTP.

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A uniqueness rule was broken (a team name taken, a device already busy).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A caller asked for something the job life cycle does not allow.
    #[error("invalid transition: {0}")]
    InvalidTransition(String),
    /// The database URL or options are wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// A stored value does not decode (a state name this build does not know).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("database: {0}")]
    Database(#[source] sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        // Unique and foreign-key violations are the caller's problem (409), not an outage.
        if let sqlx::Error::Database(db) = &err {
            if db.is_unique_violation() {
                // the database's own message names its tables and constraints: it stays here
                return StoreError::Conflict("an entry with the same unique value already exists".into());
            }
        }
        StoreError::Database(err)
    }
}
