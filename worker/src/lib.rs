//! The training engine: the only crate that links libtorch. Data-parallel synchronous SGD with the recipe
//! of Goyal et al. 2017, one process per rank, gradients all-reduced over a TCP ring.

mod batch_norm;
pub mod checkpoint;
pub mod collective;
pub mod data;
pub mod faults;
pub mod gradients;
pub mod metrics;
pub mod models;
pub mod optim;
pub mod trainer;

pub use collective::{Collective, RendezvousConfig, RingCollective, SoloCollective};
pub use faults::FaultInjection;
pub use trainer::{JobError, Stopped, TrainOptions, Trainer};
