pub mod bench;
pub mod schedule;
pub mod serve;
pub mod train;
