//! `ringtrain train`: run one rank of a job (`--rank R --world K --rendezvous HOST:PORT`), or start K local
//! rank processes and wait for them (`--local K`). Metrics go to stdout as JSON lines.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::JobSpec;
use ringtrain_worker::metrics::Metric;
use ringtrain_worker::{FaultInjection, JobError, RendezvousConfig, RingCollective, Stopped, TrainOptions, Trainer};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The job spec (JSON).
    #[arg(long)]
    spec: PathBuf,
    /// This process's rank (0-based), with --world and --rendezvous.
    #[arg(long, requires_all = ["world", "rendezvous"], conflicts_with = "local")]
    rank: Option<usize>,
    /// The number of rank processes.
    #[arg(long)]
    world: Option<usize>,
    /// Where rank 0 listens and the other ranks connect (HOST:PORT).
    #[arg(long)]
    rendezvous: Option<SocketAddr>,
    /// Start this many rank processes on this machine and wait for them.
    #[arg(long)]
    local: Option<usize>,
    /// Where rank 0 writes checkpoints/ and result.json.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Resume from the newest checkpoint in this folder (an earlier run's OUT/checkpoints).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Ranks each process plays (micro-batches with their own BN statistics, gradients accumulated).
    #[arg(long, default_value_t = 1)]
    virtual_ranks: usize,
    /// libtorch threads per rank process (default: 1 on CPU, so k ranks share the cores fairly).
    #[arg(long)]
    threads: Option<i32>,
    /// Seconds a peer may stay silent before it is declared stalled.
    #[arg(long, default_value_t = 120)]
    comm_timeout_s: u64,
    /// Seconds to wait for every rank to join.
    #[arg(long, default_value_t = 120)]
    join_timeout_s: u64,
    /// Gradient bucket size in MiB.
    #[arg(long, default_value_t = 25)]
    bucket_mb: usize,
    /// The safetensors file of an uploaded dataset.
    #[arg(long)]
    dataset_file: Option<PathBuf>,
    /// Exit as soon as the process that started this one is gone (agents set it, so a killed agent leaves no
    /// ranks behind).
    #[arg(long)]
    exit_with_parent: bool,
    /// When this file appears, every rank stops after the current iteration, with a checkpoint of it
    /// (exit status 4). Agents use it to preempt a job without losing work.
    #[arg(long)]
    stop_file: Option<PathBuf>,
}

/// The exit statuses the agent tells apart: a job that cannot succeed by retrying (see [`JobError`]), and a
/// rank that stopped on request (`--stop-file`) after a checkpoint of where it stopped.
pub use ringtrain_protocol::rank::{EXIT_JOB_ERROR, EXIT_STOPPED};

pub fn run(args: Args) -> ExitCode {
    let outcome = match (args.local, args.rank) {
        (Some(k), _) => run_local(&args, k),
        (None, Some(rank)) => run_rank(&args, rank),
        (None, None) => Err(anyhow::anyhow!("give either --local K, or --rank R --world K --rendezvous HOST:PORT")),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let who = args.rank.map_or_else(|| "train".to_string(), |r| format!("rank {r}"));
            eprintln!("{who}: error: {err:#}");
            if err.downcast_ref::<JobError>().is_some() {
                ExitCode::from(EXIT_JOB_ERROR)
            } else if err.downcast_ref::<Stopped>().is_some() {
                ExitCode::from(EXIT_STOPPED)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn load_spec(path: &PathBuf) -> Result<JobSpec> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    JobSpec::from_json(&text).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(|e| format!("  {e}")).collect();
        JobError(format!("invalid spec {}:\n{}", path.display(), lines.join("\n"))).into()
    })
}

fn run_rank(args: &Args, rank: usize) -> Result<()> {
    if args.exit_with_parent {
        exit_with_parent();
    }
    let spec = load_spec(&args.spec)?;
    let device = match spec.device {
        DeviceKind::Cpu => tch::Device::Cpu,
        DeviceKind::Gpu if tch::Cuda::is_available() => tch::Device::Cuda(0),
        DeviceKind::Gpu => bail!("the spec asks for a GPU, but libtorch sees no CUDA device here"),
    };
    let threads = args.threads.unwrap_or(if device == tch::Device::Cpu { 1 } else { 4 });
    tch::set_num_threads(threads);
    tch::set_num_interop_threads(1);

    let config = RendezvousConfig {
        address: args.rendezvous.context("--rendezvous is required with --rank")?,
        rank,
        world: args.world.context("--world is required with --rank")?,
        join_timeout: Duration::from_secs(args.join_timeout_s),
        io_timeout: Duration::from_secs(args.comm_timeout_s),
    };
    let mut comm = RingCollective::connect(&config)?;
    let options = TrainOptions {
        out_dir: args.out.clone(),
        resume_from: args.resume.clone(),
        virtual_ranks: args.virtual_ranks,
        bucket_bytes: args.bucket_mb.max(1) << 20,
        device,
        dataset_file: args.dataset_file.clone(),
        stop_file: args.stop_file.clone(),
        ..Default::default()
    };
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    }
    let mut trainer = Trainer::new(&spec, &mut comm, options)?.with_faults(faults_from_env(rank));
    let stdout = std::io::stdout();
    let mut sink = |metric: &Metric| {
        let mut out = stdout.lock();
        let _ = serde_json::to_writer(&mut out, metric);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    };
    trainer.run(&mut sink)?;
    Ok(())
}

/// Watches the parent process from a thread: when it dies this process is re-parented, and exits. (No
/// `prctl(PR_SET_PDEATHSIG)`: that needs unsafe code, and a one-second poll is cheap.)
fn exit_with_parent() {
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        if std::os::unix::process::parent_id() != parent {
            eprintln!("the process that started this rank is gone: exiting");
            std::process::exit(1);
        }
    });
}

/// Test-only fault injection, `VARIABLE=RANK:ITERATION`: `RINGTRAIN_CRASH` makes that rank abort at that
/// iteration; `RINGTRAIN_NAN` feeds it NaN inputs there; `RINGTRAIN_STOP` makes it ask for a stop there.
fn faults_from_env(rank: usize) -> FaultInjection {
    FaultInjection {
        crash_at_iteration: injected_at("RINGTRAIN_CRASH", rank),
        nan_inputs_at_iteration: injected_at("RINGTRAIN_NAN", rank),
        stop_at_iteration: injected_at("RINGTRAIN_STOP", rank),
    }
}

/// The iteration `variable` names for `rank`, if it names this rank.
fn injected_at(variable: &str, rank: usize) -> Option<u64> {
    let value = std::env::var(variable).ok()?;
    let (r, iteration) = value.split_once(':')?;
    (r.parse::<usize>().ok()? == rank).then(|| iteration.parse().ok()).flatten()
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_local_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn run_local(args: &Args, k: usize) -> Result<()> {
    if k == 0 {
        bail!("--local needs at least 1 process");
    }
    load_spec(&args.spec)?; // fail before starting anything
    let rendezvous = format!("127.0.0.1:{}", free_local_port()?);
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..k {
        let mut cmd = Command::new(&exe);
        cmd.arg("train").arg("--spec").arg(&args.spec);
        cmd.args(["--rank", &rank.to_string(), "--world", &k.to_string(), "--rendezvous", &rendezvous]);
        cmd.args(["--virtual-ranks", &args.virtual_ranks.to_string()]);
        cmd.args(["--comm-timeout-s", &args.comm_timeout_s.to_string()]);
        cmd.args(["--join-timeout-s", &args.join_timeout_s.to_string()]);
        cmd.args(["--bucket-mb", &args.bucket_mb.to_string()]);
        // Killing this launcher leaves no rank behind.
        cmd.arg("--exit-with-parent");
        if let Some(threads) = args.threads {
            cmd.args(["--threads", &threads.to_string()]);
        }
        for (flag, value) in [("--out", &args.out), ("--resume", &args.resume), ("--dataset-file", &args.dataset_file)]
        {
            if let Some(value) = value {
                cmd.arg(flag).arg(value);
            }
        }
        children.push((rank, cmd.spawn().with_context(|| format!("cannot start rank {rank}"))?));
    }
    wait_all(children)
}

/// Waits for every rank; when one fails, stops the others at once (they would fail on their own once the
/// ring breaks, but there is no reason to wait for that). Ranks that stopped on request are waited for
/// (rank 0 may still be writing the checkpoint), and the run then ends as stopped.
fn wait_all(mut children: Vec<(usize, Child)>) -> Result<()> {
    let mut failed: Vec<String> = Vec::new();
    let mut stopped = false;
    while !children.is_empty() {
        let mut still_running = Vec::new();
        for (rank, mut child) in children {
            match child.try_wait()? {
                Some(status) if status.success() => {}
                Some(status) if status.code() == Some(i32::from(EXIT_STOPPED)) => stopped = true,
                Some(status) => failed.push(format!("rank {rank} exited with {status}")),
                None => still_running.push((rank, child)),
            }
        }
        children = still_running;
        if !failed.is_empty() {
            for (_, child) in &mut children {
                let _ = child.kill();
                let _ = child.wait();
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
