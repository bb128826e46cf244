//! `ringtrain serve --slurm-partition ...`: a Slurm pool's settings (see `ringtrain_api::slurm_pool`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use ringtrain_api::slurm_pool::SlurmPoolConfig;
use ringtrain_core::spec::DeviceKind;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct SlurmArgs {
    /// Ask Slurm for devices in this partition (or comma-separated partitions) when the policy says a
    /// queued job waits because the pool lacks them: one Slurm job per ringtrain job, running the agent on
    /// each of its nodes (operator guide, "Running on Slurm").
    #[arg(long, env = "RINGTRAIN_SLURM_PARTITION")]
    pub slurm_partition: Option<String>,
    /// The Slurm account its jobs are charged to (default: this user's default account).
    #[arg(long, env = "RINGTRAIN_SLURM_ACCOUNT")]
    pub slurm_account: Option<String>,
    /// The kind of device the Slurm pool offers: gpu (--gres=gpu:N) or cpu (--cpus-per-task=N).
    #[arg(long, env = "RINGTRAIN_SLURM_DEVICE", default_value = "gpu", value_parser = ["gpu", "cpu"])]
    pub slurm_device: String,
    /// Devices a Slurm job takes on each node (GPUs, or CPU slots: one rank each).
    #[arg(long, env = "RINGTRAIN_SLURM_DEVICES_PER_NODE", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub slurm_devices_per_node: u32,
    /// The most nodes one Slurm job asks for: a job needing more fails at once, saying so.
    #[arg(long, env = "RINGTRAIN_SLURM_MAX_NODES", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub slurm_max_nodes: u32,
    /// A Slurm job's time limit, in minutes; its agents are signalled --slurm-grace-s before it.
    #[arg(long, env = "RINGTRAIN_SLURM_TIME_MINUTES", default_value_t = 24 * 60,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub slurm_time_minutes: u32,
    /// Seconds before the time limit at which Slurm signals the agents (USR1).
    #[arg(long, env = "RINGTRAIN_SLURM_GRACE_S", default_value_t = 120)]
    pub slurm_grace_s: u32,
    /// Slurm jobs of this server pending at once, at most.
    #[arg(long, env = "RINGTRAIN_SLURM_MAX_PENDING", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub slurm_max_pending: u64,
    /// The ringtrain program as the nodes see it (default: this one's path, for an install every node
    /// shares).
    #[arg(long, env = "RINGTRAIN_SLURM_AGENT_COMMAND")]
    pub slurm_agent_command: Option<String>,
    /// More arguments for the agents, separated by spaces (e.g. "--idx-root /data --cache-max-gib 200").
    #[arg(long, env = "RINGTRAIN_SLURM_AGENT_ARGS", allow_hyphen_values = true)]
    pub slurm_agent_args: Option<String>,
    /// This server's URL as the nodes reach it (default: the address it listens on, unless that is every
    /// interface).
    #[arg(long, env = "RINGTRAIN_SLURM_SERVER_URL")]
    pub slurm_server_url: Option<String>,
    /// A folder the nodes see too (a shared file system): each Slurm job's agent tokens (mode 0600) and
    /// Slurm's output. Default: DATA_DIR/slurm.
    #[arg(long, env = "RINGTRAIN_SLURM_DIR")]
    pub slurm_dir: Option<PathBuf>,
    /// Where sbatch, squeue and scancel are (default: the PATH).
    #[arg(long, env = "RINGTRAIN_SLURM_BIN_DIR")]
    pub slurm_bin_dir: Option<PathBuf>,
    /// The slurm.conf the commands read (SLURM_CONF; default: the site's).
    #[arg(long, env = "RINGTRAIN_SLURM_CONF")]
    pub slurm_conf: Option<PathBuf>,
}

impl SlurmArgs {
    /// The pool's settings, or None without --slurm-partition. `url` is the server's own (its scheme and
    /// the address it listens on).
    pub fn config(&self, data_dir: &Path, listening: SocketAddr, url: &str) -> anyhow::Result<Option<SlurmPoolConfig>> {
        let Some(partition) = self.slurm_partition.clone().filter(|p| !p.trim().is_empty()) else { return Ok(None) };
        let server_url = match &self.slurm_server_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None if listening.ip().is_unspecified() => anyhow::bail!(
                "--slurm-server-url: this server listens on every interface ({listening}); say which URL the \
                 Slurm nodes reach it at"
            ),
            None => url.to_string(),
        };
        let agent_command = match &self.slurm_agent_command {
            Some(command) => command.clone(),
            None => std::env::current_exe()
                .context("--slurm-agent-command: this program's path is unknown; name the one the nodes run")?
                .display()
                .to_string(),
        };
        let agent_args =
            self.slurm_agent_args.as_deref().unwrap_or_default().split_whitespace().map(str::to_string).collect();
        let mut agent_args: Vec<String> = agent_args;
        if server_url.starts_with("http://") && !agent_args.iter().any(|a| a == "--allow-insecure-http") {
            // the operator chose plain HTTP for the nodes (a private network): the agents are told so
            agent_args.push("--allow-insecure-http".into());
        }
        Ok(Some(SlurmPoolConfig {
            slurm: ringtrain_api::slurm_pool::Slurm {
                bin_dir: self.slurm_bin_dir.clone(),
                conf: self.slurm_conf.clone(),
            },
            partition,
            account: self.slurm_account.clone(),
            kind: if self.slurm_device == "cpu" { DeviceKind::Cpu } else { DeviceKind::Gpu },
            devices_per_node: self.slurm_devices_per_node,
            max_nodes: self.slurm_max_nodes,
            time_limit_minutes: self.slurm_time_minutes,
            grace_seconds: self.slurm_grace_s,
            max_pending: self.slurm_max_pending as usize,
            agent_command,
            agent_args,
            server_url,
            dir: self.slurm_dir.clone().unwrap_or_else(|| data_dir.join("slurm")),
        }))
    }
}
