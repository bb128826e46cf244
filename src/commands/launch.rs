//! Starting rank processes on this machine (`train --local K`, the multi-process benchmarks) and waiting for
//! them: one GPU per rank, and no rank left behind when one fails.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ringtrain_worker::{JobError, Stopped};

use super::train::{EXIT_JOB_ERROR, EXIT_STOPPED};

/// A port that was free a moment ago on 127.0.0.1, for rank 0 to listen on once it starts. Chosen below the
/// kernel's ephemeral range (`ip_local_port_range`), from which every `bind(:0)` and outgoing connection
/// of this machine takes its ports: one of those took a port handed out from that range between this
/// check and rank 0's bind (seen in CI, "Address already in use"). Falls back to the ephemeral range when
/// no port below it is free.
pub fn free_local_port() -> Result<u16> {
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOWEST: u16 = 10_000;
    if ephemeral_from > LOWEST + 1_000 {
        let span = u64::from(ephemeral_from - LOWEST);
        let mut seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
                ^ (u64::from(std::process::id()) << 32);
        for _ in 0..64 {
            // xorshift: enough to spread launchers started at once over the range
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let port = LOWEST + (seed % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Each GPU rank sees only its own GPU, as CUDA device 0 (`CUDA_VISIBLE_DEVICES`), as the agent arranges
/// it: rank r gets GPU r, or the r-th of the GPUs this launcher's own CUDA_VISIBLE_DEVICES lists. With
/// `share` (tests on a one-GPU machine) every rank gets GPU 0 and its own NCCL host id, so NCCL connects
/// them like separate hosts over loopback sockets.
pub fn one_gpu_per_rank(cmd: &mut Command, rank: usize, share: bool) {
    if share {
        cmd.env("CUDA_VISIBLE_DEVICES", "0");
        cmd.env("NCCL_HOSTID", format!("ringtrain-test-{rank}"));
        for (name, value) in [("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1"), ("NCCL_NVLS_ENABLE", "0")] {
            cmd.env(name, value);
        }
    } else {
        let inherited = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let gpu = inherited.as_deref().and_then(|list| list.split(',').nth(rank)).map(str::trim);
        cmd.env("CUDA_VISIBLE_DEVICES", gpu.map_or_else(|| rank.to_string(), str::to_string));
    }
}

/// A fresh secret for the ranks started here to prove to each other (see `RendezvousConfig::secret`).
pub fn new_rendezvous_secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Runs a benchmark as `world` rank processes of this executable on this machine's GPUs (`share`: all on
/// GPU 0, for tests): `args(rank, rendezvous)` gives each one's arguments. Only rank 0's stdout is kept.
pub fn run_gpu_ranks(world: usize, share: bool, args: impl Fn(usize, &str) -> Vec<String>) -> Result<()> {
    let rendezvous = format!("127.0.0.1:{}", free_local_port()?);
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let secret = new_rendezvous_secret();
    let mut children = Vec::new();
    for rank in 0..world {
        let mut cmd = Command::new(&exe);
        cmd.args(args(rank, &rendezvous));
        cmd.env(ringtrain_protocol::rank::RENDEZVOUS_SECRET_ENV, &secret);
        one_gpu_per_rank(&mut cmd, rank, share);
        if rank != 0 {
            cmd.stdout(Stdio::null());
        }
        children.push((rank, cmd.spawn().with_context(|| format!("cannot start rank {rank}"))?));
    }
    wait_all(children)
}

/// Waits for every rank; when one fails, stops the others at once (they would fail on their own once the
/// ring breaks, but there is no reason to wait for that). Ranks that stopped on request are waited for
/// (rank 0 may still be writing the checkpoint), and the run then ends as stopped. A rank that failed with
/// a job error (exit status 3) makes the launcher fail with one too.
pub fn wait_all(mut children: Vec<(usize, Child)>) -> Result<()> {
    let mut failed: Vec<String> = Vec::new();
    let mut job_error = false;
    let mut stopped = false;
    while !children.is_empty() {
        let mut still_running = Vec::new();
        for (rank, mut child) in children {
            match child.try_wait()? {
                Some(status) if status.success() => {}
                Some(status) if status.code() == Some(i32::from(EXIT_STOPPED)) => stopped = true,
                Some(status) => {
                    job_error |= status.code() == Some(i32::from(EXIT_JOB_ERROR));
                    failed.push(format!("rank {rank} exited with {status}"));
                }
                None => still_running.push((rank, child)),
            }
        }
        children = still_running;
        if !failed.is_empty() {
            for (_, child) in &mut children {
                let _ = child.kill();
                let _ = child.wait();
            }
            if job_error {
                // the job itself cannot run (the rank said why on stderr): the launcher says so too
                return Err(JobError(failed.join("; ")).into());
            }
            bail!("{}", failed.join("; "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if stopped {
        return Err(anyhow::Error::new(Stopped { next_iteration: None })
            .context("--resume OUT/checkpoints continues where they stopped"));
    }
    Ok(())
}
