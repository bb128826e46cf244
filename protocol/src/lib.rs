//! How a node agent talks to the server (`/v1/agent`), written once and used by both sides: the API routes
//! deserialize what the agent serializes, with the same types. Also the conventions between an agent and the
//! rank processes it starts (exit statuses).
//!
//! - [`records`]: what the server answers with (a node, an assignment, a checkpoint);
//! - [`agent`]: the bodies and queries of each call, in the order an agent makes them;
//! - [`rank`]: how a rank process tells its agent how it ended, and where its checkpoints are;
//! - [`timing`]: the heartbeat, lease and long-poll durations both sides must agree on;
//! - [`doctor`]: what a ringtrain binary and its machine can do, as the rank binary reports it to its agent;
//! - [`model`]: what `ringtrain model check` says of an uploaded TorchScript model, to the server.

pub mod agent;
pub mod doctor;
pub mod model;
pub mod rank;
pub mod records;
pub mod timing;

pub use agent::{
    ArchiveParams, AssignmentUpdate, AttemptBody, EndpointReport, HeartbeatAck, LogAck, LogBatch, LogLine, MetricsAck,
    MetricsBatch, Outcome, Poll, PollQuery, RegisterDevice, RegisterNode, ResultAck, ResultReport, SelfTestCheck,
    SelfTestReport, Work, MAX_LOG_LINE_BYTES,
};
pub use records::{Assignment, Checkpoint, Device, Node};
