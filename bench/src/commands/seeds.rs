//! `ringtrain-bench seeds`: accuracy over several seeds, ringtrain against the same recipe in plain PyTorch.
//! One seed's final test error says little (the seeds of one LeNet-5 recipe spread over about a point), so a
//! spec is trained end to end once per seed by `ringtrain train --local K`, once for each `model.init`
//! asked for, and by `scripts/bench/pytorch_reference.py recipe` with the reference's own initialisation
//! (PyTorch's layer defaults unless told otherwise). Printed per seed and as mean ± standard deviation, with
//! each ringtrain column's difference from the reference seed by seed (paired: the same seed, the same data
//! order's semantics) and the wall times, in one run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use ringtrain_bench::python::{check_python, json_lines};

use super::pytorch::{number, ringtrain};

#[derive(Debug, clap::Args)]
pub struct SeedsArgs {
    /// A Python with torch (scripts/bench/pytorch-venv.sh installs one and prints its path).
    #[arg(long, env = "RINGTRAIN_PYTORCH_PYTHON", default_value = "python3")]
    python: PathBuf,
    /// The PyTorch side.
    #[arg(long, default_value = "scripts/bench/pytorch_reference.py")]
    script: PathBuf,
    /// The spec both sides train (its seed is replaced by each of --seeds).
    #[arg(long, default_value = "examples/fashion-mnist-lenet5-k1.json")]
    spec: PathBuf,
    /// Train this built-in model instead of the spec's (e.g. mlp: the same recipe, another model).
    #[arg(long)]
    model: Option<String>,
    /// The seeds: a range (3-7) or a list (1,5,9).
    #[arg(long, default_value = "3-7")]
    seeds: String,
    /// ringtrain's initialisations (model.init), a column each: goyal, pytorch, tch. Default: the
    /// spec's own (the default initialisation when it names none).
    #[arg(long, value_delimiter = ',')]
    init: Vec<String>,
    /// How the PyTorch reference initialises LeNet-5 and the MLP: pytorch (its layer defaults), goyal or tch.
    #[arg(long, default_value = "pytorch")]
    reference_init: String,
    /// Where the runs write (default: a temporary folder, removed after).
    #[arg(long)]
    out: Option<PathBuf>,
    /// One JSON object per run and one summary object instead of a table.
    #[arg(long)]
    json: bool,
}

/// One column: a ringtrain initialisation, or the reference.
struct Column {
    label: String,
    /// Per seed: (final test error, wall seconds).
    runs: Vec<(f64, f64)>,
}

impl Column {
    fn errors(&self) -> Vec<f64> {
        self.runs.iter().map(|r| r.0).collect()
    }

    fn walls(&self) -> Vec<f64> {
        self.runs.iter().map(|r| r.1).collect()
    }
}

pub fn run(args: &SeedsArgs) -> Result<()> {
    check_python(&args.python)?;
    let seeds = parse_seeds(&args.seeds)?;
    let base: Value = serde_json::from_str(
        &std::fs::read_to_string(&args.spec).with_context(|| format!("cannot read {}", args.spec.display()))?,
    )
    .with_context(|| format!("{} is not JSON", args.spec.display()))?;
    let scratch = tempfile::Builder::new().prefix("ringtrain-bench-seeds-").tempdir()?;
    let out = args.out.clone().unwrap_or_else(|| scratch.path().to_path_buf());
    std::fs::create_dir_all(&out)?;
    let inits: Vec<Option<String>> =
        if args.init.is_empty() { vec![None] } else { args.init.iter().cloned().map(Some).collect() };
    let mut columns: Vec<Column> = inits
        .iter()
        .map(|init| Column { label: format!("ringtrain {}", init.as_deref().unwrap_or("default")), runs: vec![] })
        .collect();
    let mut reference = Column { label: format!("PyTorch ({} init)", args.reference_init), runs: vec![] };
    let workers = base["workers"].as_u64().unwrap_or(1).to_string();
    for &seed in &seeds {
        for (column, init) in columns.iter_mut().zip(&inits) {
            let tag = format!("seed-{seed}-{}", init.as_deref().unwrap_or("default"));
            let spec =
                write_spec(&base, args.model.as_deref(), seed, init.as_deref(), &out.join(format!("{tag}.json")))?;
            let run = train_ringtrain(&spec, &workers, &out.join(&tag))?;
            report(args, &column.label, seed, run);
            column.runs.push(run);
        }
        let tag = format!("seed-{seed}-pytorch-{}", args.reference_init);
        let spec = write_spec(&base, args.model.as_deref(), seed, None, &out.join(format!("{tag}.json")))?;
        let run = train_reference(args, &spec, &workers, &out.join(&tag))?;
        report(args, &reference.label, seed, run);
        reference.runs.push(run);
    }
    let model = args.model.clone().or_else(|| base["model"]["name"].as_str().map(str::to_string)).unwrap_or_default();
    let what = format!("{} (model {model}), seeds {}", args.spec.display(), args.seeds);
    if args.json {
        print_summary_json(&what, &seeds, &columns, &reference);
    } else {
        print_table(&what, &seeds, &columns, &reference);
    }
    Ok(())
}

/// `3-7` or `1,5,9`.
fn parse_seeds(text: &str) -> Result<Vec<u64>> {
    let seeds: Vec<u64> = match text.split_once('-') {
        Some((a, b)) => {
            let (a, b): (u64, u64) = (a.trim().parse()?, b.trim().parse()?);
            (a..=b).collect()
        }
        None => text.split(',').map(|s| s.trim().parse::<u64>()).collect::<Result<_, _>>()?,
    };
    if seeds.len() < 2 {
        bail!("--seeds {text:?}: give at least two seeds (a spread needs two)");
    }
    Ok(seeds)
}

/// The spec with this seed (and model, init) written to `path`.
fn write_spec(base: &Value, model: Option<&str>, seed: u64, init: Option<&str>, path: &Path) -> Result<PathBuf> {
    let mut spec = base.clone();
    spec["seed"] = json!(seed);
    if let Some(model) = model {
        spec["model"] = json!({"name": model});
    }
    if let Some(init) = init {
        spec["model"]["init"] = json!(init);
    }
    std::fs::write(path, serde_json::to_vec_pretty(&spec)?)?;
    Ok(path.to_path_buf())
}

fn train_ringtrain(spec: &Path, workers: &str, out: &Path) -> Result<(f64, f64)> {
    let started = Instant::now();
    let mut train = ringtrain(&["train", "--local", workers, "--spec"])?;
    train.arg(spec).arg("--out").arg(out).stdout(std::process::Stdio::null());
    json_lines(&mut train, &format!("ringtrain train --spec {}", spec.display()))?;
    let wall = started.elapsed().as_secs_f64();
    let result: Value = serde_json::from_slice(&std::fs::read(out.join("result.json"))?)?;
    Ok((number(&result, "final_test_error")?, wall))
}

fn train_reference(args: &SeedsArgs, spec: &Path, workers: &str, out: &Path) -> Result<(f64, f64)> {
    let mut script = std::process::Command::new(&args.python);
    script.arg(&args.script).args(["recipe", "--world", workers, "--init", &args.reference_init, "--spec"]);
    script.arg(spec).arg("--out").arg(out);
    let printed = json_lines(&mut script, &format!("the PyTorch recipe, {}", spec.display()))?;
    let result = printed.last().context("the PyTorch recipe printed nothing")?;
    Ok((number(result, "final_test_error")?, number(result, "wall_exit_s")?))
}

fn report(args: &SeedsArgs, label: &str, seed: u64, (error, wall): (f64, f64)) {
    if args.json {
        println!(
            "{}",
            json!({"bench": "seeds", "run": label, "seed": seed, "final_test_error": error, "wall_s": wall})
        );
    } else {
        eprintln!("  seed {seed}, {label}: test error {:.2}%, {wall:.0} s", 100.0 * error);
    }
}

/// Mean and sample standard deviation (n - 1).
fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// Seed by seed, this column's error minus the reference's.
fn paired(column: &Column, reference: &Column) -> Vec<f64> {
    column.errors().iter().zip(reference.errors()).map(|(a, b)| a - b).collect()
}

fn print_table(what: &str, seeds: &[u64], columns: &[Column], reference: &Column) {
    let all: Vec<&Column> = columns.iter().chain(std::iter::once(reference)).collect();
    println!("final test error over {} seeds: {what}", seeds.len());
    print!("{:<8}", "seed");
    for c in &all {
        print!(" {:>22}", c.label);
    }
    println!();
    for (i, seed) in seeds.iter().enumerate() {
        print!("{seed:<8}");
        for c in &all {
            print!(" {:>21.2}%", 100.0 * c.runs[i].0);
        }
        println!();
    }
    print!("{:<8}", "mean±sd");
    for c in &all {
        let (mean, sd) = mean_sd(&c.errors());
        print!(" {:>16.2} ± {:.2}", 100.0 * mean, 100.0 * sd);
    }
    println!();
    print!("{:<8}", "wall s");
    for c in &all {
        let (mean, sd) = mean_sd(&c.walls());
        print!(" {:>16.0} ± {:<3.0}", mean, sd);
    }
    println!();
    for c in columns {
        let diff = paired(c, reference);
        let (mean, sd) = mean_sd(&diff);
        let better = diff.iter().filter(|d| **d < 0.0).count();
        println!(
            "{} − {}: {:+.2} ± {:.2} points (seed by seed), lower on {better} of {} seeds",
            c.label,
            reference.label,
            100.0 * mean,
            100.0 * sd,
            diff.len()
        );
    }
}

fn print_summary_json(what: &str, seeds: &[u64], columns: &[Column], reference: &Column) {
    let summary = |c: &Column| {
        let (mean, sd) = mean_sd(&c.errors());
        let (wall, wall_sd) = mean_sd(&c.walls());
        json!({"label": c.label, "errors": c.errors(), "mean": mean, "sd": sd, "wall_mean_s": wall, "wall_sd_s": wall_sd})
    };
    let differences: Vec<Value> = columns
        .iter()
        .map(|c| {
            let diff = paired(c, reference);
            let (mean, sd) = mean_sd(&diff);
            json!({"column": c.label, "minus": reference.label, "differences": diff, "mean": mean, "sd": sd})
        })
        .collect();
    let row = json!({"bench": "seeds", "what": what, "seeds": seeds,
        "ringtrain": columns.iter().map(summary).collect::<Vec<_>>(), "reference": summary(reference),
        "differences": differences});
    println!("{row}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_a_range_or_a_list_of_at_least_two() {
        assert_eq!(parse_seeds("3-7").unwrap(), vec![3, 4, 5, 6, 7]);
        assert_eq!(parse_seeds("1, 5,9").unwrap(), vec![1, 5, 9]);
        assert!(parse_seeds("4").is_err());
        assert!(parse_seeds("x-2").is_err());
    }

    #[test]
    fn the_spread_is_the_sample_standard_deviation() {
        let (mean, sd) = mean_sd(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(mean, 2.5);
        assert!((sd - 1.290_994).abs() < 1e-6);
    }
}
