//! The user API's answers as types, one module per resource: the server builds and serialises them (and
//! documents them in the OpenAPI document through `utoipa`), the client deserialises them, and the command
//! line prints from their fields. The agent's half of the wire is `ringtrain-protocol`'s, pinned the same
//! way (`tests/wire_shape.rs` here and there).
//!
//! - [`nodes`]: the worker pool, each device with who holds it (`GET /v1/nodes`);
//! - [`schedules`]: a spec's schedule at several world sizes (`POST /v1/schedules/preview?workers=…`);
//! - [`uploads`]: a data set uploaded in parts (`/v1/datasets/uploads`).
//!
//! The other resources' views still live beside their routes in `ringtrain-api` and are read by key in the
//! command line; they move here one resource at a time.

pub mod nodes;
pub mod schedules;
pub mod uploads;

/// `GET /v1/jobs/{id}/schedule` and a preview without `workers` answer the schedule as the core computes it.
pub use ringtrain_core::ScheduleView;
