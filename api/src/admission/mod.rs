//! What the server lets in, and how much: [`requests`] admits each request to a pool (agents', users',
//! strangers' per source address) under rate and in-flight limits, before any handler runs; [`log_budget`]
//! and [`metric_budget`] bound what one job's ranks may store per second (log lines, metric rows), saving
//! up a burst and thinning beyond it.

pub mod log_budget;
pub mod metric_budget;
pub mod requests;
