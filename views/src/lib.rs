//! The user API's answers as types, one module per resource: the server builds and serialises them (and
//! documents them in the OpenAPI document through `utoipa`), the client deserialises them, and the command
//! line prints from their fields. The agent's half of the wire is `ringtrain-protocol`'s, pinned the same
//! way (`tests/wire_shape.rs` here and there).
//!
//! - [`jobs`]: a job, the run history's pages, what a queued job waits for, what a run did and left behind
//!   (`/v1/jobs`);
//! - [`studies`]: studies and their points (`/v1/studies`);
//! - [`teams`]: teams, tokens, storage and usage (`/v1/teams`, `/v1/tokens`, `/v1/me`);
//! - [`artifacts`]: uploaded data sets and models (`/v1/datasets`, `/v1/models`);
//! - [`nodes`]: the worker pool, each device with who holds it (`GET /v1/nodes`);
//! - [`schedules`]: a spec's schedule at several world sizes (`POST /v1/schedules/preview?workers=…`);
//! - [`uploads`]: a data set uploaded in parts (`/v1/datasets/uploads`).
//!
//! The store's records that the API answers as they are (a team, a token, a data set, an event, …) are
//! defined here and re-exported by `ringtrain-store`, so there is one definition of each.

pub mod artifacts;
pub mod jobs;
pub mod nodes;
pub mod schedules;
pub mod studies;
pub mod teams;
pub mod uploads;

/// `GET /v1/jobs/{id}/schedule` and a preview without `workers` answer the schedule as the core computes it.
pub use ringtrain_core::ScheduleView;
