//! The server's limits as command-line flags, shared by `serve` and `up` (the operator guide's Limits table lists
//! them with their defaults).

use std::time::Duration;

use ringtrain_api::ApiConfig;

/// The API's own defaults: the flags' defaults are read from them, so the two cannot drift apart.
fn defaults() -> ApiConfig {
    ApiConfig::new("")
}

#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Requests of users and callers without a token handled at once, over all of them; beyond it 429 with
    /// Retry-After (agents have a pool of their own).
    #[arg(long, env = "RINGTRAIN_MAX_IN_FLIGHT", default_value_t = defaults().admission.max_in_flight)]
    pub max_in_flight: usize,
    /// Requests of node agents handled at once, in a pool of their own: no other caller can take their
    /// slots, so a flood cannot keep heartbeats out (and nodes lost).
    #[arg(long, env = "RINGTRAIN_MAX_AGENT_IN_FLIGHT", default_value_t = defaults().admission.max_agent_in_flight)]
    pub max_agent_in_flight: usize,
    /// Requests one source address may have in flight without a valid token (behind a reverse proxy, every
    /// caller shares the proxy's address).
    #[arg(long, env = "RINGTRAIN_MAX_IN_FLIGHT_PER_ADDRESS", default_value_t = defaults().admission.max_in_flight_per_address)]
    pub max_in_flight_per_address: usize,
    /// Sustained requests per second one source address may make without a valid token (0: no limit).
    #[arg(long, env = "RINGTRAIN_ADDRESS_RATE_LIMIT", default_value_t = defaults().admission.address_rate_per_second)]
    pub address_rate_limit: f64,
    /// Requests one source address may make in a burst without a valid token.
    #[arg(long, env = "RINGTRAIN_ADDRESS_RATE_BURST", default_value_t = defaults().admission.address_rate_burst)]
    pub address_rate_burst: f64,
    /// Sustained requests per second one token may make (0: no limit); beyond it 429 with Retry-After.
    #[arg(long, env = "RINGTRAIN_RATE_LIMIT", default_value_t = defaults().admission.rate_per_second)]
    pub rate_limit: f64,
    /// Requests one token may make in a burst after being idle.
    #[arg(long, env = "RINGTRAIN_RATE_BURST", default_value_t = defaults().admission.rate_burst)]
    pub rate_burst: f64,
    /// Event streams one token may follow at once.
    #[arg(long, env = "RINGTRAIN_MAX_STREAMS_PER_TOKEN", default_value_t = defaults().admission.max_streams_per_token)]
    pub max_streams_per_token: usize,
    /// Seconds an event stream lives before the server ends it (clients reconnect with Last-Event-ID).
    #[arg(long, env = "RINGTRAIN_MAX_STREAM_SECONDS", default_value_t = defaults().admission.max_stream_lifetime.as_secs())]
    pub max_stream_seconds: u64,
    /// Iteration reports one job may store per second; beyond it an evenly spaced subset is kept (0: all).
    #[arg(long, env = "RINGTRAIN_METRIC_ROWS_PER_SECOND", default_value_t = defaults().metric_rows_per_second)]
    pub metric_rows_per_second: f64,
    /// Queued jobs one team may have; a submission beyond is 429.
    #[arg(long, env = "RINGTRAIN_MAX_QUEUED_PER_TEAM", default_value_t = defaults().max_queued_per_team)]
    pub max_queued_per_team: i64,
    /// Seconds a queued job the pool cannot place (too many devices, or none of its kind) waits, marked with
    /// the reason, before it fails.
    #[arg(long, env = "RINGTRAIN_UNPLACEABLE_GRACE_SECONDS", default_value_t = ringtrain_scheduler::LoopConfig::default().unplaceable_grace.as_secs())]
    pub unplaceable_grace_seconds: u64,
    /// Seconds a placement runs before the scheduler may preempt it to give a team its guarantee back
    /// (thrash protection: a reclaim waits rather than stop a job that has barely started).
    #[arg(long, env = "RINGTRAIN_MIN_RUN_BEFORE_PREEMPTION_SECONDS", default_value_t = defaults().scheduling.min_run_before_preemption.as_secs())]
    pub min_run_before_preemption_seconds: u64,
    /// Seconds an elastic job's placement runs before it may grow onto idle devices (each growth is a stop at
    /// a checkpoint and a restart on more devices).
    #[arg(long, env = "RINGTRAIN_GROW_INTERVAL_SECONDS", default_value_t = defaults().scheduling.grow_interval.as_secs())]
    pub grow_interval_seconds: u64,
    /// Lines of rank output one job may store per second (0: no limit); beyond it lines are dropped.
    #[arg(long, env = "RINGTRAIN_LOG_LINES_PER_SECOND", default_value_t = defaults().log_lines_per_second)]
    pub log_lines_per_second: f64,
    /// Lines of rank output one job may store in all; beyond it lines are dropped.
    #[arg(long, env = "RINGTRAIN_MAX_LOG_LINES_PER_JOB", default_value_t = defaults().max_log_lines_per_job)]
    pub max_log_lines_per_job: i64,
    /// Days rank output is kept after its job ended.
    #[arg(long, env = "RINGTRAIN_LOG_RETENTION_DAYS", default_value_t = defaults().log_retention.as_secs() / 86_400)]
    pub log_retention_days: u64,
    /// Bytes of datasets and checkpoints a team may keep, unless the platform admin set its own quota.
    #[arg(long, env = "RINGTRAIN_TEAM_STORAGE_BYTES", default_value_t = defaults().team_storage_bytes)]
    pub team_storage_bytes: u64,
    /// Free bytes uploads must leave on the data directory's disk (507 beyond).
    #[arg(long, env = "RINGTRAIN_MIN_FREE_BYTES", default_value_t = defaults().min_free_bytes)]
    pub min_free_bytes: u64,
    /// Checkpoints kept per job besides its final weights (the newest; older ones are deleted).
    #[arg(long, env = "RINGTRAIN_KEEP_CHECKPOINTS", default_value_t = defaults().keep_checkpoints, value_parser = clap::value_parser!(i64).range(1..))]
    pub keep_checkpoints: i64,
}

impl LimitArgs {
    pub fn apply(&self, config: &mut ApiConfig) {
        config.admission.max_in_flight = self.max_in_flight;
        config.admission.max_agent_in_flight = self.max_agent_in_flight;
        config.admission.max_in_flight_per_address = self.max_in_flight_per_address;
        config.admission.address_rate_per_second = self.address_rate_limit;
        config.admission.address_rate_burst = self.address_rate_burst;
        config.admission.rate_per_second = self.rate_limit;
        config.admission.rate_burst = self.rate_burst;
        config.admission.max_streams_per_token = self.max_streams_per_token;
        config.admission.max_stream_lifetime = Duration::from_secs(self.max_stream_seconds.max(1));
        config.metric_rows_per_second = self.metric_rows_per_second;
        config.max_queued_per_team = self.max_queued_per_team;
        config.team_storage_bytes = self.team_storage_bytes;
        config.min_free_bytes = self.min_free_bytes;
        config.keep_checkpoints = self.keep_checkpoints;
        config.scheduling.min_run_before_preemption = Duration::from_secs(self.min_run_before_preemption_seconds);
        config.scheduling.grow_interval = Duration::from_secs(self.grow_interval_seconds);
        config.log_lines_per_second = self.log_lines_per_second;
        config.max_log_lines_per_job = self.max_log_lines_per_job;
        config.log_retention = Duration::from_secs(self.log_retention_days.saturating_mul(86_400));
    }

    /// The scheduler loop's share of the limits.
    pub fn apply_to_loop(&self, config: &mut ringtrain_scheduler::LoopConfig) {
        config.unplaceable_grace = Duration::from_secs(self.unplaceable_grace_seconds);
    }
}
