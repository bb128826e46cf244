//! The few definitions every aggregate shares and none owns: which database a store runs on, and the clock
//! every timestamp is taken from. Each record type lives with the trait of the aggregate that owns its table
//! (a [`Job`](crate::Job) in [`jobs`](crate::jobs), a [`Team`](crate::Team) in [`teams`](crate::teams), ...);
//! all of them are re-exported at the crate root.

use chrono::{DateTime, Utc};

/// Which database a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Timestamps are kept to the microsecond: Postgres stores no more, so a value reads back equal on both.
pub fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}
