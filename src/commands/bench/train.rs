//! `bench train`: samples/s and time per step by phase. On CPUs, k ranks as threads over the TCP ring next
//! to one rank without communication (the reference). On GPUs, one process per rank and GPU (NCCL by
//! default); phase times are GPU times (measured with a device synchronise at each phase boundary, in extra
//! steps after the timed ones, so the throughput figures keep host/device overlap). The GPU reference,
//! PyTorch eager on the same GPU, is scripts/device/resnet50_eager.py, run next to this by
//! scripts/device/check.sh.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use ringtrain_core::JobSpec;
use ringtrain_worker::collective::DEFAULT_SLOT_ELEMS;
use ringtrain_worker::trainer::PhaseTimes;
use ringtrain_worker::{Backend, Collective, RendezvousConfig, TrainOptions, Trainer};
use serde_json::{json, Value};

use super::{on_ring, on_shared_memory};
use crate::commands::launch::{free_local_port, run_gpu_ranks};

const WARMUP_STEPS: u32 = 3;

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    #[arg(long, default_value = "lenet5")]
    model: String,
    /// Per-rank batch n.
    #[arg(long, default_value_t = 32)]
    batch: u32,
    /// Ranks k. CPU: threads of this process (over shared memory, as a job's ranks on one node; or the TCP
    /// ring), next to 1 rank without communication. GPU: one process per rank, one GPU each.
    #[arg(long, default_value_t = 2)]
    world: u32,
    /// Timed steps (after 3 warm-up steps).
    #[arg(long, default_value_t = 30)]
    steps: u32,
    #[arg(long, default_value = "fashion-mnist")]
    dataset: String,
    /// A safetensors dataset (x, y) instead of --dataset, e.g. ImageNet-sized images for resnet50.
    #[arg(long)]
    dataset_file: Option<PathBuf>,
    /// The side images of a `shards:` --dataset are cropped to (the spec's `image_size`).
    #[arg(long)]
    image_size: Option<u32>,
    /// cpu or gpu.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// fp32 or bf16 (autocast; see the spec field `precision`).
    #[arg(long, default_value = "fp32")]
    precision: String,
    /// What gradients travel on: auto (CPU: shared memory; GPU: NCCL), ring, shm, nccl.
    #[arg(long, default_value = "auto")]
    collective: Backend,
    /// The optimizer step: fused (one pass over each CPU parameter) or tensor-ops (libtorch's ops, as before
    /// the fused step: the same bits).
    #[arg(long, default_value = "fused", value_parser = ["fused", "tensor-ops"])]
    optimizer: String,
    /// Where a GPU rank gathers its batches: device (the data set kept on the GPU, as jobs train) or host
    /// (gathered on the host and copied each step, the loader before batches stayed on the device). No
    /// effect on CPUs.
    #[arg(long, default_value = "device", value_parser = ["device", "host"])]
    data: String,
    /// Sum the gradients while backward runs (on) or after it (off); CPU ranks: also both, a row of each.
    #[arg(long, default_value = "off", value_parser = ["on", "off", "both"])]
    overlap: String,
    /// Threads decoding a `shards:` data set's images ahead of the steps (default: --threads).
    #[arg(long)]
    loader_threads: Option<usize>,
    /// libtorch threads (shared by the ranks of this process on CPUs).
    #[arg(long, default_value_t = 1)]
    threads: i32,
    #[arg(long)]
    json: bool,
    /// GPU: run only this rank (with --rendezvous); without it, all --world ranks are started here.
    #[arg(long, requires = "rendezvous", hide = true)]
    rank: Option<usize>,
    #[arg(long, hide = true)]
    rendezvous: Option<SocketAddr>,
    /// GPU ranks on a one-GPU machine: every rank on GPU 0, each its own NCCL "host" (tests only).
    #[arg(long, hide = true)]
    share_gpu_for_tests: bool,
}

pub fn run(args: &TrainArgs) -> Result<()> {
    match (args.device.as_str(), args.rank, args.rendezvous) {
        ("cpu", _, _) => on_cpu(args),
        ("gpu", Some(rank), Some(rendezvous)) => gpu_rank(args, rank, rendezvous),
        ("gpu", _, _) if args.overlap == "both" => bail!("--overlap both is for CPU ranks: on GPUs run on and off"),
        ("gpu", _, _) if args.world <= 1 => gpu_rank(args, 0, format!("127.0.0.1:{}", free_local_port()?).parse()?),
        ("gpu", _, _) => gpu_processes(args),
        (other, _, _) => bail!("--device {other:?}: use cpu or gpu"),
    }
}

fn bench_spec(args: &TrainArgs, world: u32) -> Result<JobSpec> {
    let mut spec = json!({
        "model": {"name": args.model},
        "dataset": args.dataset,
        "test_samples": 1,
        "workers": world,
        "per_worker_batch": args.batch,
        "epochs": 1,
        "lr": {"warmup": {"kind": "none"}, "decay": {"kind": "none"}},
        "device": args.device,
        "precision": args.precision,
    });
    if args.dataset_file.is_none() {
        spec["train_samples"] = json!(u64::from((args.steps + WARMUP_STEPS) * world * args.batch));
    }
    if let Some(size) = args.image_size {
        spec["image_size"] = json!(size);
    }
    JobSpec::from_json(&spec.to_string())
        .map_err(|e| anyhow::anyhow!("{}", e.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")))
}

/// What one measurement gives: phase times per step over the timed steps (GPU: over extra synchronised
/// steps), and the wall time of the timed steps.
pub(super) struct Measured {
    times: PhaseTimes,
    phase_steps: u32,
    pub(super) wall: f64,
}

pub(super) fn measure(
    spec: &JobSpec,
    steps: u32,
    comm: &mut dyn Collective,
    options: TrainOptions,
) -> Result<Measured> {
    let gpu = options.device.is_cuda();
    let mut trainer = Trainer::new(spec, comm, options)?;
    let per_epoch = trainer.effective().iterations_per_epoch.max(1);
    let mut permutation = Vec::new();
    let mut step = |trainer: &mut Trainer, t: u64| -> Result<()> {
        if t % per_epoch == 0 {
            permutation = trainer.begin_epoch(t / per_epoch, 0);
        }
        trainer.train_step(t, (t % per_epoch) as usize, &permutation)?;
        Ok(())
    };
    for t in 0..u64::from(WARMUP_STEPS) {
        step(&mut trainer, t)?;
    }
    trainer.times = PhaseTimes::default();
    let started = Instant::now();
    let timed = u64::from(WARMUP_STEPS)..u64::from(WARMUP_STEPS + steps);
    for t in timed.clone() {
        step(&mut trainer, t)?;
    }
    if gpu {
        tch::Cuda::synchronize(0);
    }
    let wall = started.elapsed().as_secs_f64();
    if !gpu {
        return Ok(Measured { times: trainer.times, phase_steps: steps, wall });
    }
    let phase_steps = (steps / 2).max(3);
    trainer.times = PhaseTimes::default();
    trainer.sync_phases(true);
    for t in timed.end..timed.end + u64::from(phase_steps) {
        step(&mut trainer, t)?;
    }
    Ok(Measured { times: trainer.times, phase_steps, wall })
}

fn row(args: &TrainArgs, world: u32, m: &Measured, reference: bool, overlap: bool) -> Value {
    let per_step = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(m.phase_steps);
    let step_ms = m.wall * 1e3 / f64::from(args.steps);
    json!({
        "bench": "train", "model": args.model, "batch": args.batch, "world": world, "device": args.device,
        "precision": args.precision,
        "data": if args.device == "gpu" { args.data.as_str() } else { "host" },
        "samples_per_s": f64::from(args.steps * world * args.batch) / m.wall,
        "step_ms": step_ms,
        "forward_ms": per_step(m.times.forward), "backward_ms": per_step(m.times.backward),
        "allreduce_ms": per_step(m.times.allreduce), "optimizer_ms": per_step(m.times.optimizer),
        // what the step waited for the all-reduce, as a share of the step (the job page's "all-reduce share")
        "allreduce_exposed_share": per_step(m.times.allreduce) / step_ms.max(1e-9),
        "allreduce_total_ms": per_step(m.times.allreduce_total),
        "overlap": overlap,
        "reference": reference,
    })
}

fn on_cpu(args: &TrainArgs) -> Result<()> {
    tch::set_num_threads(args.threads);
    let mut rows = Vec::new();
    let worlds: Vec<u32> = if args.world > 1 { vec![1, args.world] } else { vec![1] };
    let overlaps: &[bool] = match args.overlap.as_str() {
        "both" => &[false, true],
        "off" => &[false],
        _ => &[true],
    };
    for &world in &worlds {
        // one rank has nothing to overlap: one row
        for &overlap_backward in if world == 1 { &[false][..] } else { overlaps } {
            let spec = bench_spec(args, world)?;
            let (steps, dataset_file) = (args.steps, args.dataset_file.clone());
            let fused_optimizer = args.optimizer == "fused";
            let loader_threads = args.loader_threads.unwrap_or(args.threads.max(1) as usize);
            let body = move |comm: &mut dyn Collective| {
                let options = TrainOptions {
                    dataset_file: dataset_file.clone(),
                    fused_optimizer,
                    overlap_backward,
                    loader_threads,
                    ..Default::default()
                };
                measure(&spec, steps, comm, options)
            };
            let measured = match args.collective {
                Backend::Ring => on_ring(world as usize, body)?,
                Backend::Auto | Backend::Shm => on_shared_memory(world as usize, DEFAULT_SLOT_ELEMS, body)?,
                Backend::Nccl => bail!("--collective nccl needs --device gpu"),
            };
            rows.push(row(args, world, &measured, world == 1, overlap_backward && world > 1));
        }
    }
    let over = if args.collective == Backend::Ring { "the TCP ring" } else { "shared memory" };
    let how = format!("ranks are threads of one process, gradients over {over}, {} optimizer", args.optimizer);
    print_rows(args, &rows, &how)
}

/// One GPU rank (CUDA device 0: the launcher gives each rank its own GPU); rank 0 prints.
fn gpu_rank(args: &TrainArgs, rank: usize, rendezvous: SocketAddr) -> Result<()> {
    if !tch::Cuda::is_available() {
        bail!("--device gpu: {}", ringtrain_worker::doctor::why_no_cuda());
    }
    tch::set_num_threads(args.threads.max(4));
    let device = tch::Device::Cuda(0);
    let world = args.world.max(1);
    let config = RendezvousConfig {
        address: rendezvous,
        rank,
        world: world as usize,
        join_timeout: Duration::from_secs(120),
        io_timeout: Duration::from_secs(120),
        secret: crate::commands::train::rendezvous_secret(),
    };
    let mut comm = args.collective.connect(&config, device, None)?;
    let overlap_backward = args.overlap == "on";
    let loader_threads = args.loader_threads.unwrap_or(args.threads.max(4) as usize);
    let mut options = TrainOptions {
        device,
        dataset_file: args.dataset_file.clone(),
        overlap_backward,
        loader_threads,
        ..Default::default()
    };
    if args.data == "host" {
        options.data_on_device_max_bytes = 0;
    }
    let measured = measure(&bench_spec(args, world)?, args.steps, comm.as_mut(), options)?;
    if rank == 0 {
        let note = format!("one process per rank and GPU, gradients over {}", comm.backend());
        print_rows(args, &[row(args, world, &measured, false, overlap_backward && world > 1)], &note)?;
    }
    Ok(())
}

fn gpu_processes(args: &TrainArgs) -> Result<()> {
    run_gpu_ranks(args.world as usize, args.share_gpu_for_tests, |rank, rendezvous| {
        let mut argv: Vec<String> =
            ["bench", "train", "--device", "gpu", "--rendezvous", rendezvous].map(String::from).into();
        for (flag, value) in [
            ("--model", args.model.clone()),
            ("--precision", args.precision.clone()),
            ("--batch", args.batch.to_string()),
            ("--world", args.world.to_string()),
            ("--steps", args.steps.to_string()),
            ("--dataset", args.dataset.clone()),
            ("--collective", args.collective.name().to_string()),
            ("--data", args.data.clone()),
            ("--overlap", args.overlap.clone()),
            ("--threads", args.threads.to_string()),
            ("--rank", rank.to_string()),
            ("--loader-threads", args.loader_threads.unwrap_or(args.threads.max(4) as usize).to_string()),
        ] {
            argv.extend([flag.to_string(), value]);
        }
        if let Some(file) = &args.dataset_file {
            argv.extend(["--dataset-file".to_string(), file.display().to_string()]);
        }
        if let Some(size) = args.image_size {
            argv.extend(["--image-size".to_string(), size.to_string()]);
        }
        if args.json {
            argv.push("--json".into());
        }
        argv
    })
}

fn print_rows(args: &TrainArgs, rows: &[Value], how: &str) -> Result<()> {
    if args.json {
        for row in rows {
            println!("{row}");
        }
        return Ok(());
    }
    println!(
        "training step, {} {} batch {} per rank, {} on {} ({} libtorch thread(s); {how})",
        args.model,
        args.precision,
        args.batch,
        args.dataset_file.as_ref().map_or(args.dataset.clone(), |f| f.display().to_string()),
        args.device,
        args.threads
    );
    println!(
        "{:>6} {:>8} {:>12} {:>10} {:>11} {:>12} {:>13} {:>9} {:>13} {:>13}",
        "world",
        "overlap",
        "samples/s",
        "step ms",
        "forward ms",
        "backward ms",
        "allreduce ms",
        "share",
        "in all ms",
        "optimizer ms"
    );
    println!("(allreduce ms: what a step waited for the all-reduce after backward; share: of the step; in all: every all-reduce, overlapped or not)");
    for row in rows {
        println!(
            "{:>6} {:>8} {:>12.0} {:>10.2} {:>11.2} {:>12.2} {:>13.2} {:>8.2}% {:>13.2} {:>13.2}{}",
            row["world"].as_u64().unwrap_or(0),
            if row["overlap"] == true { "on" } else { "off" },
            row["samples_per_s"].as_f64().unwrap_or(0.0),
            row["step_ms"].as_f64().unwrap_or(0.0),
            row["forward_ms"].as_f64().unwrap_or(0.0),
            row["backward_ms"].as_f64().unwrap_or(0.0),
            row["allreduce_ms"].as_f64().unwrap_or(0.0),
            row["allreduce_exposed_share"].as_f64().unwrap_or(0.0) * 100.0,
            row["allreduce_total_ms"].as_f64().unwrap_or(0.0),
            row["optimizer_ms"].as_f64().unwrap_or(0.0),
            if row["reference"] == true { "   (reference: one rank, no communication)" } else { "" }
        );
    }
    Ok(())
}
