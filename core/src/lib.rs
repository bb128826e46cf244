//! ringtrain's pure core: the job spec and its validation, the learning-rate schedule of Goyal et al. 2017
//! ("Accurate, Large Minibatch SGD"), and the domain ids and states. No I/O and no libtorch, so the
//! server, the scheduler and the trainer all agree on the same numbers.

pub mod cluster;
pub mod composite;
pub mod dataset;
pub mod error;
pub mod hex;
pub mod ids;
pub mod job;
pub mod memory;
pub mod pipeline;
pub mod random;
pub mod reading;
pub mod schedule;
pub mod spec;
pub mod study;
pub mod timeline;
pub mod validate;

pub use cluster::{AssignmentState, NodeState};
pub use dataset::DatasetRef;
pub use error::FieldError;
pub use hex::hex;
pub use ids::{AssignmentId, CheckpointId, DatasetId, DeviceId, JobId, ModelId, NodeId, StudyId, TeamId, TokenId};
pub use job::JobState;
pub use reading::{read_spec, SpecReading};
pub use schedule::{Effective, ScheduleView};
pub use spec::JobSpec;
pub use timeline::Timeline;
