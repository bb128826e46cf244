pub mod schedule;
pub mod train;
