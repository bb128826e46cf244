//! `ringtrain train`: run one rank of a job (`--rank R --world K --rendezvous HOST:PORT`), or start K local
//! rank processes and wait for them (`--local K`). Metrics go to stdout as JSON lines.
//!
//! Over 450 lines because a rank's whole start is here in order (spec, confinement, virtual ranks, the
//! watchdogs on its parent and its memory, injected faults) beside `--local`, which starts the same ranks;
//! launching processes on GPUs and free ports is in `launch`, the training itself in `ringtrain-worker`.

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ringtrain_core::dataset::DatasetRef;
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::JobSpec;
use ringtrain_protocol::rank::RankCommand;
use ringtrain_worker::metrics::Metric;
use ringtrain_worker::models::OperatorCheck;
use ringtrain_worker::{Backend, FaultInjection, JobError, RendezvousConfig, Stopped, TrainOptions, Trainer};

use super::launch::{free_local_port, new_rendezvous_secret, one_gpu_per_rank, wait_all};

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
    /// A fork (a spec with `init_from`): start from the weights of the newest checkpoint in this folder,
    /// at iteration 0 of this spec's schedule (ignored when resuming).
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// Ranks each process plays (micro-batches with their own BN statistics, gradients accumulated). Default:
    /// workers / devices when the processes are the spec's `devices`, else 1.
    #[arg(long)]
    virtual_ranks: Option<usize>,
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
    /// Sum the gradients while backward runs instead of after it (CPU ranks; see docs/ARCHITECTURE.md, "The
    /// all-reduce can overlap backward": it pays only where communication does not take the step's cores).
    #[arg(long)]
    overlap: bool,
    /// The safetensors file of an uploaded dataset, or the folder of a sharded one in a bucket
    /// (`shards:s3://...`), which the agent copied into its cache.
    #[arg(long)]
    dataset_file: Option<PathBuf>,
    /// The TorchScript file of the spec's uploaded model (`model.uploaded`): with --dataset-file, or on a
    /// `shards:` folder of named tensors.
    #[arg(long)]
    model_file: Option<PathBuf>,
    /// The uploaded model's inputs in `forward`'s order, comma-separated: the dataset's tensors x.NAME.
    /// Default: the dataset's one x.
    #[arg(long, requires = "model_file", value_delimiter = ',')]
    model_inputs: Option<Vec<String>>,
    /// Cut the model (a built-in ResNet) into pipeline stages after these layers (e.g. layer2, or
    /// layer1.2,layer3.0): the processes are workers × stages, ranks w·S..w·S+S−1 worker w's stages, each
    /// stage's gradients summed with the same stage of the other workers (over the TCP ring).
    #[arg(long, value_delimiter = ',')]
    pipeline_cuts: Option<Vec<String>>,
    /// Exit as soon as the process that started this one is gone (agents set it, so a killed agent leaves no
    /// ranks behind).
    #[arg(long)]
    exit_with_parent: bool,
    /// The process that started this one (agents pass their pid): with `--exit-with-parent`, a parent that
    /// died before this rank started watching is noticed too (the rank would otherwise see its new parent,
    /// the reaper, as the one to watch, and train on as an orphan whose reports reach no one).
    #[arg(long, requires = "exit_with_parent")]
    parent_pid: Option<u32>,
    /// When this file appears, every rank stops after the current iteration, with a checkpoint of it
    /// (exit status 4). Agents use it to preempt a job without losing work.
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// What gradients travel on: auto (NCCL for GPU ranks when libnccl loads; shared memory for CPU ranks
    /// given --shared-memory; else the TCP ring), ring, shm, nccl.
    #[arg(long, default_value = "auto")]
    collective: Backend,
    /// A shared memory segment every rank on this machine was handed (a passed descriptor,
    /// /proc/self/fd/N, empty or sized by another rank): CPU ranks all-reduce through it. `--local` and the
    /// agent pass it when all of a job's ranks are on one machine.
    #[arg(long)]
    shared_memory: Option<PathBuf>,
    /// Rank 0: the socket to accept the rendezvous on (a passed descriptor, /proc/self/fd/N), already bound
    /// to --rendezvous's port by the agent, which reported that port before this rank started.
    #[arg(long)]
    rendezvous_listener: Option<PathBuf>,
    /// Tests on one GPU only: --local K ranks all on GPU 0, each told it is its own host (NCCL_HOSTID), so
    /// NCCL accepts them and connects them over loopback sockets (NCCL refuses two ranks on one GPU).
    #[arg(long, hide = true)]
    share_gpu_for_tests: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// How a rank confines itself (see `ringtrain_sandbox`): agents always pass `--sandbox-dir`, and
/// `--local` gives each rank one of its own when it trains an uploaded model.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxArgs {
    /// Confine this rank before it opens any input: it reads only its spec, data, model and resume point,
    /// writes only DIR (its HOME and TMPDIR) and --out, executes nothing, and uses TCP only for its ring.
    #[arg(long)]
    sandbox_dir: Option<PathBuf>,
    /// The largest file the rank may write, in MiB (its checkpoints' largest file, with room).
    #[arg(long, default_value_t = 2048)]
    max_file_mib: u64,
    /// Run even where this kernel cannot confine the rank (no Landlock or seccomp): single-team installs.
    #[arg(long)]
    allow_unsandboxed: bool,
    /// Skip the operator allow-list of an uploaded model (tests of the sandbox only: they show the sandbox
    /// alone confines a hostile model).
    #[arg(long, hide = true)]
    skip_operator_check: bool,
}

impl SandboxArgs {
    fn enforcement(&self) -> ringtrain_sandbox::Enforcement {
        if self.allow_unsandboxed {
            ringtrain_sandbox::Enforcement::BestEffort
        } else {
            ringtrain_sandbox::Enforcement::Required
        }
    }

    fn operator_check(&self) -> OperatorCheck {
        if self.skip_operator_check {
            OperatorCheck::Skipped
        } else {
            OperatorCheck::Enforced
        }
    }
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
    let began = std::time::Instant::now();
    let spec = load_spec(&args.spec)?;
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    }
    if args.exit_with_parent {
        // an agent's rank: Slurm's grace signal is its agent's to answer (with a checkpoint)
        ringtrain_worker::signals::leave_grace_signal_to_agent();
    }
    // First, before any thread starts or any input but the spec is opened.
    if let Some(dir) = &args.sandbox.sandbox_dir {
        let applied = ringtrain_sandbox::enter(&rank_confinement(args, &spec, dir), args.sandbox.enforcement())
            .map_err(|e| JobError(format!("rank {rank}: {e}")))?;
        let _ = writeln!(std::io::stderr(), "rank {rank}: {applied}");
    }
    if args.exit_with_parent {
        exit_with_parent(args.parent_pid);
    }
    exit_on_out_of_memory(rank);
    let device = match spec.device {
        DeviceKind::Cpu => tch::Device::Cpu,
        DeviceKind::Gpu if tch::Cuda::is_available() => tch::Device::Cuda(0),
        // never train a GPU job on the CPU by accident; and retrying elsewhere is the scheduler's business,
        // not this rank's: the job's spec cannot run on this binary
        DeviceKind::Gpu => {
            let why = ringtrain_worker::doctor::why_no_cuda();
            return Err(
                JobError(format!("the spec asks for a GPU, but libtorch sees no CUDA device here: {why}")).into()
            );
        }
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
        secret: rendezvous_secret(),
    };
    let segment = match &args.shared_memory {
        Some(path) => Some(shared_segment(path, config.world)?),
        None => None,
    };
    if let Some(path) = &args.rendezvous_listener {
        let socket = ringtrain_sandbox::take_passed(path).context("--rendezvous-listener")?;
        ringtrain_worker::collective::listen_on(std::net::TcpListener::from(socket));
    }
    // the cuts: the spec's placement (a job of the service), or --pipeline-cuts (a local run)
    let cuts = match (&args.pipeline_cuts, spec.pipeline_cuts()) {
        (Some(given), Some(spec_cuts)) if given.as_slice() != spec_cuts => {
            bail!("--pipeline-cuts {} differs from the spec's placement.cuts {}", given.join(","), spec_cuts.join(","))
        }
        (Some(given), _) => Some(given.clone()),
        (None, spec_cuts) => spec_cuts.map(<[String]>::to_vec),
    };
    // a composite uploaded model's modules per stage: the spec's placement.stages
    let modules = spec.pipeline_modules().map(<[Vec<String>]>::to_vec);
    if cuts.is_some() && modules.is_some() {
        bail!("--pipeline-cuts cut a built-in model; the spec places a composite model's modules (placement.stages)");
    }
    let stages = match (&cuts, &modules) {
        (Some(cuts), _) => cuts.len() + 1,
        (None, Some(modules)) => modules.len(),
        (None, None) => 1,
    };
    if config.world % stages != 0 {
        bail!("--world {} is not a whole number of workers of {stages} pipeline stages", config.world);
    }
    let (mut comm, links) = match stages {
        1 => (args.collective.connect(&config, device, segment)?, None),
        _ => {
            let (ring, links) = ringtrain_worker::pipeline::connect(&config, stages)?;
            (Box::new(ring) as Box<dyn ringtrain_worker::Collective>, Some(links))
        }
    };
    // One line for the job's logs: what this rank runs, where, and from where it resumes. (Written, not
    // eprintln!: a closed stderr must not panic the rank.)
    let resume = match (&args.resume, &args.init_from) {
        (Some(resume), _) => format!("from {}", resume.display()),
        (None, Some(init)) => format!("from the start, with the weights in {}", init.display()),
        (None, None) => "from the start".to_string(),
    };
    let _ = writeln!(
        std::io::stderr(),
        "rank {rank} of {}: {} on {device:?}, {threads} threads, all-reduce: {}, {resume}",
        config.world,
        spec.model.label(),
        comm.backend()
    );
    let options = TrainOptions {
        out_dir: args.out.clone(),
        resume_from: args.resume.clone(),
        init_from: args.init_from.clone(),
        virtual_ranks: virtual_ranks(args, &spec, config.world / stages),
        bucket_bytes: args.bucket_mb.max(1) << 20,
        overlap_backward: args.overlap,
        device,
        dataset_file: args.dataset_file.clone(),
        model_file: args.model_file.clone(),
        model_inputs: args.model_inputs.clone(),
        stop_file: args.stop_file.clone(),
        operator_check: args.sandbox.operator_check(),
        started: Some(began),
        // a sharded data set's images are decoded on as many threads as the rank computes with
        loader_threads: threads.max(1) as usize,
        pipeline: (stages > 1).then(|| ringtrain_worker::trainer::PipelineStage {
            stage: rank % stages,
            cuts: cuts.unwrap_or_default(),
            modules: modules.unwrap_or_default(),
        }),
        ..Default::default()
    };
    let mut trainer = Trainer::new(&spec, comm.as_mut(), options)?.with_faults(faults_from_env(rank));
    if let Some(links) = links {
        trainer = trainer.with_stage_links(links);
    }
    if let Some(buckets) = trainer.overlapped_buckets() {
        let _ =
            writeln!(std::io::stderr(), "rank {rank}: gradients summed in {buckets} buckets overlapped with backward");
    }
    let stdout = std::io::stdout();
    // a worker's stages agree on every figure: its first stage reports them
    let reports = rank % stages == 0;
    let mut sink = |metric: &Metric| {
        if !reports {
            return;
        }
        let mut out = stdout.lock();
        let _ = serde_json::to_writer(&mut out, metric);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    };
    trainer.run(&mut sink)?;
    Ok(())
}

/// The shared memory segment the launcher passed (see `--shared-memory`), sized and mapped.
fn shared_segment(path: &std::path::Path, world: usize) -> Result<ringtrain_worker::ShmSegment> {
    let fd = ringtrain_sandbox::take_passed(path).context("--shared-memory")?;
    ringtrain_worker::ShmSegment::adopt(fd, world)
        .with_context(|| format!("the shared memory segment {}", path.display()))
}

/// What a rank may touch: its inputs (the spec, the data: an upload, an `idx:` folder or the built-in
/// Fashion-MNIST; the model; the resume point; the folder its stop file appears in), its private folder
/// and --out, and TCP for its ring and rendezvous.
fn rank_confinement(args: &Args, spec: &JobSpec, private: &std::path::Path) -> ringtrain_sandbox::Confinement {
    let mut read = vec![args.spec.clone()];
    read.extend(args.dataset_file.iter().cloned());
    read.extend(args.model_file.iter().cloned());
    read.extend(args.resume.iter().cloned());
    read.extend(args.init_from.iter().cloned());
    read.extend(args.stop_file.as_ref().and_then(|f| f.parent()).map(std::path::Path::to_path_buf));
    match &spec.dataset {
        DatasetRef::Idx { path } | DatasetRef::Shards { path } => read.push(PathBuf::from(path)),
        DatasetRef::FashionMnist => read.push(PathBuf::from(ringtrain_worker::data::FASHION_MNIST_DIR)),
        DatasetRef::Synthetic { .. } | DatasetRef::Uploaded(_) => {}
    }
    read.retain(|p| p.exists());
    let mut write = vec![private.to_path_buf()];
    write.extend(args.out.iter().cloned());
    ringtrain_sandbox::Confinement {
        read,
        write,
        kept: args.shared_memory.iter().chain(&args.rendezvous_listener).cloned().collect(),
        gpu: spec.device == DeviceKind::Gpu,
        network: ringtrain_sandbox::Network::Ring { ports: args.rendezvous.iter().map(SocketAddr::port).collect() },
        limits: ringtrain_sandbox::Limits::rank(args.sandbox.max_file_mib << 20),
    }
}

/// The virtual ranks each of `processes` rank processes plays: as asked, or what the spec's `devices` implies
/// when the processes are its devices (how agents start them), else 1.
/// The ranks each process plays: `--virtual-ranks`, else workers / processes when the processes divide the
/// workers (an elastic job's placements hold any allowed count), else 1 (and the trainer says what is wrong).
fn virtual_ranks(args: &Args, spec: &JobSpec, processes: usize) -> usize {
    let workers = spec.workers as usize;
    args.virtual_ranks.unwrap_or(if processes > 0 && workers % processes == 0 { workers / processes } else { 1 })
}

/// The placement's rendezvous secret, from the environment (the agent, or `--local`, put it there; never an
/// argument). Without one the ranks do not authenticate each other.
pub fn rendezvous_secret() -> Option<String> {
    std::env::var(ringtrain_protocol::rank::RENDEZVOUS_SECRET_ENV).ok().filter(|s| !s.is_empty())
}

/// libtorch reports an allocation it cannot make as an error that tch turns into a panic. Out of memory is
/// the job's own doing (its model or batch is too big for the device): it exits with the job-error status,
/// saying so, so that it is not retried on another device of the same size. Any other panic keeps Rust's
/// default report and exit status.
fn exit_on_out_of_memory(rank: usize) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if is_out_of_memory(message) {
            let first_line = message.lines().next().unwrap_or(message);
            eprintln!(
                "rank {rank}: error: out of memory: the job's model or batch does not fit this device: {first_line}"
            );
            std::process::exit(i32::from(EXIT_JOB_ERROR));
        }
        default(info);
    }));
}

/// libtorch's messages for an allocation that failed, on the CPU and on CUDA.
pub fn is_out_of_memory(message: &str) -> bool {
    ["CUDA out of memory", "can't allocate memory", "out of memory", "std::bad_alloc"]
        .iter()
        .any(|m| message.contains(m))
}

/// Watches the parent process from a thread: when it dies this process is re-parented, and dies too. The
/// parent is `expected` when given (checked at once: it may have died while this process was loading),
/// else whoever the parent is now. (No `prctl(PR_SET_PDEATHSIG)`: that needs unsafe code, has the same
/// race, and a getppid every 100 ms is cheap.)
///
/// It dies by SIGKILL to itself, not `exit`: `exit` from this thread runs libtorch's static destructors
/// while the main thread goes on training, for seconds (an orphaned rank kept its all-reduce partner
/// training to the end, its metrics reaching no one), and then panics in a torn-down context.
fn exit_with_parent(expected: Option<u32>) {
    let parent = expected.unwrap_or_else(std::os::unix::process::parent_id);
    let gone = move || {
        if std::os::unix::process::parent_id() != parent {
            // Not eprintln!: stderr is a pipe to the dead parent, and eprintln! panics on a broken pipe,
            // which would end only this thread and leave the rank training on.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "the process that started this rank (pid {parent}) is gone: exiting");
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
            std::process::abort();
        }
    };
    gone();
    // a tenth of a second: an orphan's lines reach no one, so it should take as few steps as possible
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        gone();
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

fn run_local(args: &Args, k: usize) -> Result<()> {
    if k == 0 {
        bail!("--local needs at least 1 process");
    }
    let spec = load_spec(&args.spec)?; // fail before starting anything
    let gpu = spec.device == DeviceKind::Gpu;
    if gpu && !args.share_gpu_for_tests && tch::Cuda::is_available() && k > tch::Cuda::device_count() as usize {
        bail!("--local {k} needs {k} GPUs (one per rank), but libtorch sees {}", tch::Cuda::device_count());
    }
    let rendezvous = format!("127.0.0.1:{}", free_local_port()?);
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let secret = new_rendezvous_secret();
    // An uploaded model is tenant code: each rank confines itself to a private folder of its own.
    let private = match (&args.sandbox.sandbox_dir, &args.model_file) {
        (None, Some(_)) => Some(tempfile::Builder::new().prefix("ringtrain-ranks-").tempdir()?),
        _ => None,
    };
    // The ranks are all here: CPU ranks sum gradients through one shared segment, not sockets. It stays
    // open across exec, so each rank finds it at the same number.
    let pipelined = args.pipeline_cuts.is_some() || spec.stages() > 1;
    let segment = match (gpu, args.collective, k, pipelined) {
        (false, Backend::Auto | Backend::Shm, 2.., false) => Some(ringtrain_sandbox::shared_memory_file(true)?),
        _ => None,
    };
    let shared_memory = segment.as_ref().map(|fd| ringtrain_sandbox::passed_path(fd.as_raw_fd()));
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..k {
        let sandbox_dir = match (&private, &args.sandbox.sandbox_dir) {
            (Some(private), _) => {
                let dir = private.path().join(format!("rank-{rank}"));
                std::fs::create_dir(&dir)?;
                Some(dir)
            }
            (None, shared) => shared.clone(),
        };
        let command = RankCommand {
            spec: args.spec.clone(),
            rank,
            world: k,
            rendezvous: rendezvous.clone(),
            out: args.out.clone(),
            resume: args.resume.clone(),
            init_from: args.init_from.clone(),
            virtual_ranks: args.virtual_ranks,
            threads: args.threads,
            comm_timeout_s: Some(args.comm_timeout_s),
            join_timeout_s: Some(args.join_timeout_s),
            bucket_mb: Some(args.bucket_mb),
            overlap: args.overlap,
            collective: Some(args.collective.name().to_string()),
            shared_memory: shared_memory.clone(),
            dataset_file: args.dataset_file.clone(),
            model_file: args.model_file.clone(),
            model_inputs: args.model_inputs.clone(),
            pipeline_cuts: args.pipeline_cuts.clone(),
            // killing this launcher leaves no rank behind
            exit_with_parent: true,
            max_file_mib: sandbox_dir.as_ref().map(|_| args.sandbox.max_file_mib),
            sandbox_dir,
            allow_unsandboxed: args.sandbox.allow_unsandboxed,
            skip_operator_check: args.sandbox.skip_operator_check,
            ..Default::default()
        };
        let mut cmd = Command::new(&exe);
        cmd.args(command.args());
        if gpu {
            one_gpu_per_rank(&mut cmd, rank, args.share_gpu_for_tests);
        }
        cmd.env(ringtrain_protocol::rank::RENDEZVOUS_SECRET_ENV, &secret);
        children.push((rank, cmd.spawn().with_context(|| format!("cannot start rank {rank}"))?));
    }
    wait_all(children)
}

#[cfg(test)]
mod tests {
    use super::{is_out_of_memory, Args, RankCommand};

    /// What the agent, `--local` and the bench build is what this subcommand parses, flag for flag.
    #[test]
    fn a_rank_command_line_parses_as_train_arguments() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: Sub,
        }
        #[derive(clap::Subcommand)]
        enum Sub {
            Train(Args),
        }
        let command = RankCommand {
            spec: "spec.json".into(),
            rank: 1,
            world: 4,
            rendezvous: "10.0.0.1:4000".into(),
            out: Some("out".into()),
            resume: Some("resume".into()),
            init_from: Some("init".into()),
            virtual_ranks: Some(2),
            threads: Some(3),
            comm_timeout_s: Some(60),
            join_timeout_s: Some(30),
            bucket_mb: Some(8),
            overlap: true,
            collective: Some("ring".into()),
            shared_memory: Some("/proc/self/fd/5".into()),
            rendezvous_listener: Some("/proc/self/fd/6".into()),
            dataset_file: Some("/proc/self/fd/3".into()),
            model_file: Some("/proc/self/fd/4".into()),
            model_inputs: Some(vec!["numeric".into(), "tokens".into()]),
            pipeline_cuts: Some(vec!["layer2".into(), "layer3.1".into()]),
            exit_with_parent: true,
            parent_pid: Some(77),
            stop_file: Some("stop".into()),
            sandbox_dir: Some("private".into()),
            max_file_mib: Some(4096),
            allow_unsandboxed: true,
            skip_operator_check: true,
        };
        let line = std::iter::once(std::ffi::OsString::from("ringtrain")).chain(command.args());
        let Sub::Train(args) = <Cli as clap::Parser>::try_parse_from(line).unwrap().command;
        assert_eq!(args.spec, std::path::PathBuf::from("spec.json"));
        assert_eq!((args.rank, args.world), (Some(1), Some(4)));
        assert_eq!(args.rendezvous, Some("10.0.0.1:4000".parse().unwrap()));
        assert_eq!((args.out.as_deref(), args.resume.as_deref()), (Some("out".as_ref()), Some("resume".as_ref())));
        assert_eq!(args.init_from.as_deref(), Some("init".as_ref()));
        assert_eq!((args.virtual_ranks, args.threads), (Some(2), Some(3)));
        assert_eq!((args.comm_timeout_s, args.join_timeout_s, args.bucket_mb), (60, 30, 8));
        assert!(args.overlap);
        assert_eq!(args.collective.name(), "ring");
        assert_eq!(args.dataset_file, Some("/proc/self/fd/3".into()));
        assert_eq!(args.pipeline_cuts, Some(vec!["layer2".into(), "layer3.1".into()]));
        assert_eq!(args.shared_memory, Some("/proc/self/fd/5".into()));
        assert_eq!(args.rendezvous_listener, Some("/proc/self/fd/6".into()));
        assert_eq!(args.model_file, Some("/proc/self/fd/4".into()));
        assert_eq!(args.model_inputs, Some(vec!["numeric".to_string(), "tokens".to_string()]));
        assert!(args.exit_with_parent);
        assert_eq!((args.parent_pid, args.stop_file), (Some(77), Some("stop".into())));
        assert_eq!(args.sandbox.sandbox_dir, Some("private".into()));
        assert_eq!(args.sandbox.max_file_mib, 4096);
        assert!(args.sandbox.allow_unsandboxed && args.sandbox.skip_operator_check);
    }

    #[test]
    fn libtorch_allocation_failures_are_recognised() {
        assert!(is_out_of_memory("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.15 GiB total)"));
        assert!(is_out_of_memory(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 17179869184 bytes."
        ));
        assert!(!is_out_of_memory("shape '[32, 10]' is invalid for input of size 100"));
    }
}
