//! The conventions between a rank process (`ringtrain train`) and whoever starts and reads it (the agent,
//! `train --local`, `ringtrain-bench submit`, the server): its command line ([`RankCommand`]), the exit statuses its
//! agent tells apart (anything else that is not success is a crash, a retryable failure), and its
//! checkpoint folders' names and files ([`checkpoint`]).

pub mod checkpoint;
mod command;

pub use checkpoint::{checkpoint_files, CheckpointName, CheckpointProgress};
pub use command::RankCommand;

/// The rank's job cannot succeed by retrying (bad data, bad shapes, a NaN loss): the agent reports a final
/// failure rather than restarting the job.
pub const EXIT_JOB_ERROR: u8 = 3;

/// The rank stopped on request (its stop file appeared) after a checkpoint of where it stopped.
pub const EXIT_STOPPED: u8 = 4;

/// The file in a rank's `checkpoints/` folder naming its newest complete checkpoint folder (`epoch-NNNN`).
pub const LATEST: &str = "latest";

/// The environment variable through which an agent (or `train --local`) gives a rank its placement's
/// rendezvous secret: not an argument, which every user of the machine could read with `ps`.
pub const RENDEZVOUS_SECRET_ENV: &str = "RINGTRAIN_RENDEZVOUS_SECRET";
