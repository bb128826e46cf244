//! `bench pipeline`: a built-in ResNet cut into stages, each stage a thread of this process with its own
//! libtorch thread, the micro-batches flowing through them over real TCP links (1F1B), next to the unsplit
//! model on one "device" given the same cores. Prints throughput, each stage's compute per step and idle
//! share (the time it waited for a neighbour: the pipeline's fill and drain, and the stages' imbalance),
//! and the transfer time and bytes per step: what cutting a model costs and gives on this machine.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtrain_core::spec::{ModelName, ModelSpec};
use ringtrain_worker::models;
use ringtrain_worker::optim::SgdConfig;
use ringtrain_worker::pipeline::{Stage, StageLinks, StageStep};
use ringtrain_worker::RendezvousConfig;
use serde_json::json;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::free_address;

const WARMUP_STEPS: usize = 2;

#[derive(Debug, clap::Args)]
pub struct PipelineArgs {
    /// A built-in ResNet: resnet8, resnet20, resnet56 or resnet50.
    #[arg(long, default_value = "resnet20")]
    model: String,
    /// Where to cut, in the network's order (e.g. layer2, or layer1.2,layer2.2 for three stages).
    #[arg(long, default_value = "layer2", value_delimiter = ',')]
    cuts: Vec<String>,
    /// Samples per micro-batch n.
    #[arg(long, default_value_t = 32)]
    batch: i64,
    /// Micro-batches per step v (the worker's virtual ranks), one row each.
    #[arg(long, default_value = "2,8", value_delimiter = ',')]
    micro_batches: Vec<usize>,
    /// Input images: channels and side.
    #[arg(long, default_value_t = 3)]
    channels: i64,
    #[arg(long, default_value_t = 32)]
    image: i64,
    /// Timed steps (after 2 warm-up steps).
    #[arg(long, default_value_t = 8)]
    steps: usize,
    #[arg(long)]
    json: bool,
}

/// One configuration's figures.
#[derive(Debug, Clone)]
struct Row {
    what: String,
    micro_batches: usize,
    images_per_s: f64,
    step: Duration,
    /// Per stage: the share of the step it waited, the time it spent sending, the bytes it sent.
    stages: Vec<StageStep>,
}

pub fn run(args: &PipelineArgs) -> Result<()> {
    let name: ModelName =
        serde_json::from_value(json!(args.model)).with_context(|| format!("--model {}", args.model))?;
    if !matches!(name, ModelName::Resnet8 | ModelName::Resnet20 | ModelName::Resnet56 | ModelName::Resnet50) {
        bail!("--model: only the ResNets are cut into stages");
    }
    let stages = args.cuts.len() + 1;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if !args.json {
        println!(
            "{} cut after {} ({stages} stages), n = {} per micro-batch, {}×{}×{} inputs, {cores} cores here",
            args.model,
            args.cuts.join(", "),
            args.batch,
            args.channels,
            args.image,
            args.image
        );
        println!("unsplit: one thread of {stages} libtorch threads; split: a thread per stage, 1 libtorch thread each");
        println!(
            "{:<20} {:>3} {:>9} {:>8} {:>20} {:>16} {:>13} {:>8}",
            "", "v", "images/s", "step ms", "compute ms/stage", "idle per stage", "send ms/step", "MB/step"
        );
    }
    for &v in &args.micro_batches {
        let unsplit = measure(args, name, &[], v, stages as i32)?;
        let split = measure(args, name, &args.cuts, v, 1)?;
        let speedup = split.images_per_s / unsplit.images_per_s;
        for row in [unsplit, split] {
            print_row(args, &row, speedup);
        }
    }
    Ok(())
}

fn print_row(args: &PipelineArgs, row: &Row, speedup: f64) {
    let step_s = row.step.as_secs_f64();
    let idle: Vec<String> =
        row.stages.iter().map(|s| format!("{:.0}%", 100.0 * s.traffic.waiting.as_secs_f64() / step_s)).collect();
    let send_ms: f64 = row.stages.iter().map(|s| s.traffic.sending.as_secs_f64() * 1e3).sum();
    let mb: f64 = row.stages.iter().map(|s| s.traffic.bytes_sent as f64 / 1e6).sum();
    if args.json {
        let line = json!({
            "bench": "pipeline", "model": args.model, "cuts": if row.stages.len() > 1 { args.cuts.clone() } else { vec![] },
            "micro_batches": row.micro_batches, "batch": args.batch, "images_per_s": row.images_per_s,
            "step_ms": step_s * 1e3, "speedup_over_unsplit": (row.stages.len() > 1).then_some(speedup),
            "compute_ms_per_stage": row.stages.iter().map(|s| s.compute.as_secs_f64() * 1e3).collect::<Vec<_>>(),
            "idle_share": row.stages.iter().map(|s| s.traffic.waiting.as_secs_f64() / step_s).collect::<Vec<_>>(),
            "send_ms_per_step": send_ms, "bytes_per_step": mb * 1e6,
        });
        println!("{line}");
        return;
    }
    let split = row.stages.len() > 1;
    let what = if split { format!("{} ({speedup:.2}×)", row.what) } else { row.what.clone() };
    let compute: Vec<String> = row.stages.iter().map(|s| format!("{:.0}", s.compute.as_secs_f64() * 1e3)).collect();
    println!(
        "{:<20} {:>3} {:>9.1} {:>8.1} {:>20} {:>16} {:>13.2} {:>8.2}",
        what,
        row.micro_batches,
        row.images_per_s,
        step_s * 1e3,
        compute.join(" / "),
        if split { idle.join(" / ") } else { "-".into() },
        send_ms,
        mb
    );
}

/// Trains `steps` steps of v micro-batches on `cuts.len() + 1` stage threads (one: the unsplit model) with
/// `threads` libtorch threads, and times them.
fn measure(args: &PipelineArgs, name: ModelName, cuts: &[String], v: usize, threads: i32) -> Result<Row> {
    tch::set_num_threads(threads);
    let stages = cuts.len() + 1;
    let address = free_address()?;
    let samples = v as i64 * args.batch;
    let x = Tensor::randn([samples, args.channels, args.image, args.image], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(10, [samples], (Kind::Int64, Device::Cpu));
    let shape = [args.channels, args.image, args.image];
    let handles: Vec<_> = (0..stages)
        .map(|rank| {
            let (x, y, cuts, steps) = (x.shallow_clone(), y.shallow_clone(), cuts.to_vec(), args.steps);
            std::thread::spawn(move || -> Result<(Duration, Vec<StageStep>)> {
                let config = RendezvousConfig {
                    address,
                    rank,
                    world: stages,
                    join_timeout: Duration::from_secs(30),
                    io_timeout: Duration::from_secs(300),
                    secret: None,
                };
                let links = StageLinks::connect(&config)?;
                let vs = VarStore::new(Device::Cpu);
                let model = models::build_stage(&ModelSpec::new(name), &vs, &shape, 10, true, &cuts, rank)?;
                let mut stage = Stage::new(model, vs, sgd(), v, links);
                for _ in 0..WARMUP_STEPS {
                    stage.train_step(0.01, &x, &y)?;
                }
                let started = Instant::now();
                let timed = (0..steps).map(|_| stage.train_step(0.01, &x, &y).map(|done| done.step));
                let timed = timed.collect::<Result<Vec<_>>>()?;
                Ok((started.elapsed(), timed))
            })
        })
        .collect();
    let mut per_stage = Vec::new();
    let mut wall = Duration::ZERO;
    for handle in handles {
        let (elapsed, steps) = handle.join().map_err(|_| anyhow::anyhow!("a stage panicked"))??;
        wall = wall.max(elapsed);
        per_stage.push(mean(&steps));
    }
    let step = wall / args.steps as u32;
    Ok(Row {
        what: if stages > 1 { format!("{stages} stages") } else { "unsplit".into() },
        micro_batches: v,
        images_per_s: samples as f64 / step.as_secs_f64(),
        step,
        stages: per_stage,
    })
}

fn mean(steps: &[StageStep]) -> StageStep {
    let count = steps.len().max(1) as u32;
    let mut sum = StageStep::default();
    for s in steps {
        sum.compute += s.compute;
        sum.traffic.sending += s.traffic.sending;
        sum.traffic.waiting += s.traffic.waiting;
        sum.traffic.bytes_sent += s.traffic.bytes_sent;
    }
    sum.compute /= count;
    sum.traffic.sending /= count;
    sum.traffic.waiting /= count;
    sum.traffic.bytes_sent /= count as u64;
    sum
}

fn sgd() -> SgdConfig {
    SgdConfig::goyal(0.9, 1e-4)
}
