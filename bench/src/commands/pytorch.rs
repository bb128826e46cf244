//! `ringtrain-bench pytorch`: ringtrain against plain PyTorch on this machine, in one run, figure by
//! figure: the all-reduce against Gloo, a training step against eager PyTorch (one rank) and DDP over
//! Gloo (k ranks), and a whole run of a spec against the same recipe written as a plain PyTorch script. The
//! PyTorch side is `scripts/bench/pytorch_reference.py` under a Python that has torch; the ringtrain side is
//! this binary's own `bench allreduce`, `bench train` and `train --local`, run as child processes, as a user
//! would run them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ringtrain_bench::python::{check_python, json_lines};
use serde_json::{json, Value};

#[derive(Debug, clap::Args)]
pub struct PytorchArgs {
    /// A Python with torch (e.g. scripts/bench/pytorch-venv.sh's, which installs one).
    #[arg(long, env = "RINGTRAIN_PYTORCH_PYTHON", default_value = "python3")]
    python: PathBuf,
    /// The PyTorch side.
    #[arg(long, default_value = "scripts/bench/pytorch_reference.py")]
    script: PathBuf,
    /// What to compare: allreduce, steps, recipe (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "allreduce,steps,recipe")]
    only: Vec<String>,
    /// Ranks of the all-reduce and of the k-rank step.
    #[arg(long, default_value_t = 2)]
    world: u32,
    /// Timed training steps per step figure (fewer make the figures noisy on a shared machine).
    #[arg(long, default_value_t = 150)]
    steps: u32,
    /// The spec both sides train end to end (its `workers` processes each).
    #[arg(long, default_value = "examples/fashion-mnist-lenet5.json")]
    spec: PathBuf,
    /// Where the whole runs write (default: a temporary folder, removed after).
    #[arg(long)]
    out: Option<PathBuf>,
    /// One JSON object per figure instead of a table.
    #[arg(long)]
    json: bool,
}

/// One figure of both sides: `higher_is_better` says which way the ratio reads.
struct Figure {
    name: String,
    unit: &'static str,
    ringtrain: f64,
    pytorch: f64,
    higher_is_better: bool,
    /// The target for ringtrain's lead (see [`Figure::lead`]), if it sets one; a figure without one
    /// shows the difference instead (the final test errors).
    target: Option<f64>,
    detail: Value,
}

impl Figure {
    /// How many times better ringtrain is (below 1: worse).
    fn lead(&self) -> f64 {
        if self.higher_is_better {
            self.ringtrain / self.pytorch
        } else {
            self.pytorch / self.ringtrain
        }
    }
}

pub fn run(args: &PytorchArgs) -> Result<()> {
    check_python(&args.python)?;
    let scratch = match &args.out {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            None
        }
        None => Some(tempfile::Builder::new().prefix("ringtrain-bench-pytorch-").tempdir()?),
    };
    let out = args.out.clone().unwrap_or_else(|| scratch.as_ref().map(|d| d.path().to_path_buf()).unwrap_or_default());
    let mut figures = Vec::new();
    for part in &args.only {
        match part.as_str() {
            "allreduce" => figures.push(allreduce(args)?),
            "steps" => {
                figures.push(steps(args, "lenet5", 1, 1.2)?);
                figures.push(steps(args, "resnet20", args.world, 1.15)?);
            }
            "recipe" => figures.extend(recipe(args, &out)?),
            other => bail!("--only {other:?}: use allreduce, steps or recipe"),
        }
    }
    print(args, &figures);
    Ok(())
}

/// The product binary (`--ringtrain`) with `args`.
pub(super) fn ringtrain(args: &[&str]) -> Result<Command> {
    let mut command = Command::new(super::product());
    command.args(args);
    Ok(command)
}

fn python(args: &PytorchArgs, rest: &[&str]) -> Command {
    let mut command = Command::new(&args.python);
    command.arg(&args.script).args(rest);
    command
}

pub(super) fn number(value: &Value, key: &str) -> Result<f64> {
    value[key].as_f64().with_context(|| format!("no {key} in {value}"))
}

/// The all-reduce of 64 MB: shared memory (what a job on one node uses) against Gloo; busbw.
fn allreduce(args: &PytorchArgs) -> Result<Figure> {
    let world = args.world.to_string();
    let ours = json_lines(
        &mut ringtrain(&["bench", "allreduce", "--world", &world, "--sizes", "64MB", "--backend", "shm", "--json"])?,
        "ringtrain bench allreduce (shared memory)",
    )?;
    let ours = ours.first().context("bench allreduce printed nothing")?;
    let theirs = json_lines(
        &mut python(args, &["allreduce", "--world", &world, "--bytes", &(64u64 << 20).to_string()]),
        "PyTorch Gloo all-reduce",
    )?;
    let theirs = theirs.first().context("the Gloo all-reduce printed nothing")?;
    Ok(Figure {
        name: format!("all-reduce 64 MB, {world} ranks: shm vs Gloo"),
        unit: "GB/s busbw",
        ringtrain: number(ours, "busbw_gbps")?,
        pytorch: number(theirs, "busbw_gbps")?,
        higher_is_better: true,
        target: Some(2.0),
        detail: json!({"ringtrain": ours, "pytorch": theirs}),
    })
}

/// Samples/s of a training step: one rank against eager PyTorch, k ranks against DDP over Gloo.
fn steps(args: &PytorchArgs, model: &str, world: u32, target: f64) -> Result<Figure> {
    let (world_text, steps) = (world.to_string(), args.steps.to_string());
    let ours = json_lines(
        &mut ringtrain(&["bench", "train", "--model", model, "--world", &world_text, "--steps", &steps, "--json"])?,
        &format!("ringtrain bench train ({model}, {world} rank(s))"),
    )?;
    // bench train prints the one-rank reference first; the k-rank row is the last
    let ours = ours.last().context("bench train printed nothing")?;
    let theirs = json_lines(
        &mut python(args, &["steps", "--model", model, "--world", &world_text, "--steps", &steps, "--threads", "1"]),
        &format!("PyTorch steps ({model}, {world} rank(s))"),
    )?;
    let theirs = theirs.first().context("the PyTorch steps printed nothing")?;
    let reference = if world == 1 { "eager" } else { "DDP + Gloo" };
    Ok(Figure {
        name: format!("{model} step, {world} rank(s), batch 32: vs {reference}"),
        unit: "samples/s",
        ringtrain: number(ours, "samples_per_s")?,
        pytorch: number(theirs, "samples_per_s")?,
        higher_is_better: true,
        target: Some(target),
        detail: json!({"ringtrain": ours, "pytorch": theirs}),
    })
}

/// The spec end to end: the wall time of `ringtrain train --local K` against the PyTorch script's, and
/// the final test errors.
fn recipe(args: &PytorchArgs, out: &Path) -> Result<Vec<Figure>> {
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(&args.spec).with_context(|| format!("cannot read {}", args.spec.display()))?,
    )?;
    let workers = spec["workers"].as_u64().unwrap_or(1).to_string();
    let (ours_dir, theirs_dir) = (out.join("ringtrain"), out.join("pytorch"));
    let spec_path = args.spec.to_string_lossy().to_string();
    let started = Instant::now();
    let mut train = ringtrain(&["train", "--spec", &spec_path, "--local", &workers, "--out"])?;
    train.arg(&ours_dir).stdout(std::process::Stdio::null());
    json_lines(&mut train, &format!("ringtrain train --local {workers}"))?;
    let ours_wall = started.elapsed().as_secs_f64();
    let ours: Value = serde_json::from_slice(&std::fs::read(ours_dir.join("result.json"))?)?;
    let mut script = python(args, &["recipe", "--spec", &spec_path, "--world", &workers, "--out"]);
    script.arg(&theirs_dir);
    let theirs = json_lines(&mut script, "the PyTorch recipe")?;
    let theirs = theirs.last().context("the PyTorch recipe printed nothing")?;
    let name = spec["name"].as_str().unwrap_or("the spec");
    Ok(vec![
        Figure {
            name: format!("{name} end to end ({workers} processes): vs a plain PyTorch script"),
            unit: "s wall",
            ringtrain: ours_wall,
            pytorch: number(theirs, "wall_exit_s")?,
            higher_is_better: false,
            // the target: at most 0.8x PyTorch's wall time
            target: Some(1.25),
            detail: json!({"ringtrain": {"wall_s": ours_wall, "timeline": ours["timeline"]}, "pytorch": theirs}),
        },
        Figure {
            name: format!("{name}: final test error"),
            unit: "error",
            ringtrain: number(&ours, "final_test_error")?,
            pytorch: number(theirs, "final_test_error")?,
            higher_is_better: false,
            target: None,
            detail: Value::Null,
        },
    ])
}

fn print(args: &PytorchArgs, figures: &[Figure]) {
    if args.json {
        for f in figures {
            let row = json!({"bench": "pytorch", "figure": f.name, "unit": f.unit, "ringtrain": f.ringtrain,
                "pytorch": f.pytorch, "lead": f.lead(), "target": f.target, "detail": f.detail});
            println!("{row}");
        }
        return;
    }
    println!("ringtrain against plain PyTorch on this machine (lead: how many times better ringtrain is)");
    println!("{:<64} {:>12} {:>12} {:>12} {:>9} {:>8}", "figure", "unit", "ringtrain", "PyTorch", "lead", "target");
    for f in figures {
        let (lead, target) = match f.target {
            Some(target) => (format!("{:.2}×", f.lead()), format!("≥ {target:.2}×")),
            None => (format!("{:+.4}", f.ringtrain - f.pytorch), String::new()),
        };
        println!("{:<64} {:>12} {:>12.4} {:>12.4} {:>9} {:>8}", f.name, f.unit, f.ringtrain, f.pytorch, lead, target);
    }
}
