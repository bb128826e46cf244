//! The training engine: the only crate that links libtorch. Data-parallel synchronous SGD with the recipe
//! of Goyal et al. 2017, one process per rank, gradients all-reduced over NCCL (GPU ranks) or a TCP ring.

mod batch_norm;
pub mod checkpoint;
pub mod collective;
pub(crate) mod cuda;
pub mod data;
pub mod doctor;
pub mod faults;
pub mod gradients;
pub mod metrics;
pub mod model_check;
pub mod models;
pub mod optim;
pub mod peak_memory;
pub mod pipeline;
pub mod precision;
pub mod process_usage;
pub mod signals;
pub mod trainer;

pub use collective::{
    Backend, Collective, NcclCollective, RendezvousConfig, RingCollective, ShmCollective, ShmSegment, SoloCollective,
};
pub use faults::FaultInjection;
pub use trainer::{JobError, Stopped, TrainOptions, Trainer};
