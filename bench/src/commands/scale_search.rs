//! `ringtrain-bench scale-search`: the scale search against the full grid it prunes. On a
//! server and one agent started here, the `scale_search` template runs first (the reference and the lr
//! multipliers for the larger batch, under successive halving); then the same points as a plain study, every
//! one trained to the end. Printed side by side: each multiplier's final test error in the grid and where
//! the search left it, and the search's choice against the grid's best, with the device-hours of each.
//! The target: within 0.5 point of the grid's best for at most 40% of its device-hours.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtrain_client::ApiClient;
use serde_json::{json, Value};

use super::soak::cluster::SoakCluster;

#[derive(Debug, clap::Args)]
pub struct ScaleSearchArgs {
    /// The model (Fashion-MNIST): lenet5, resnet8, resnet20 or mlp.
    #[arg(long, default_value = "lenet5")]
    model: String,
    /// Training samples per epoch.
    #[arg(long, default_value_t = 60_000)]
    train_samples: u32,
    #[arg(long, default_value_t = 8)]
    epochs: u32,
    /// The reference's lr (at its batch, kn = base-workers × 32; momentum 0.9).
    #[arg(long, default_value_t = 0.01)]
    base_lr: f64,
    /// Workers of the small-batch reference (kn = this × 32).
    #[arg(long, default_value_t = 1)]
    base_workers: u32,
    /// Workers to scale to (kn = this × 32).
    #[arg(long, default_value_t = 32)]
    target_workers: u32,
    /// Multipliers tried, from the square-root rule to the linear one.
    #[arg(long, default_value_t = 6)]
    candidates: u32,
    /// CPU slots of the agent, and the devices each candidate holds (default: this machine's cores).
    #[arg(long)]
    slots: Option<u32>,
    /// Where the server and agent keep their files (default: a temporary folder, removed after).
    #[arg(long)]
    work_dir: Option<std::path::PathBuf>,
    /// The two studies' views as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// A folder to write each study's plot (error vs epoch per point, SVG) and view (JSON) into.
    #[arg(long, short)]
    out: Option<std::path::PathBuf>,
}

pub fn run(args: &ScaleSearchArgs) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
    let slots = args.slots.unwrap_or(cores).max(1);
    anyhow::ensure!(args.target_workers % slots == 0, "--slots ({slots}) must divide --target-workers");
    let root = match &args.work_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("ringtrain-bench-scale-search-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("server"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (search, grid) = runtime.block_on(both(args, slots, &root))?;
    if args.work_dir.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    if args.json {
        println!("{}", serde_json::to_string(&json!({"search": search, "grid": grid}))?);
        return Ok(());
    }
    print!("{}", report(args, slots, &search, &grid));
    Ok(())
}

async fn both(args: &ScaleSearchArgs, slots: u32, root: &std::path::Path) -> Result<(Value, Value)> {
    let cluster = SoakCluster::start(root, None, 1, slots).await?;
    let api = &cluster.admin;
    let base = json!({
        "model": {"name": args.model}, "dataset": "fashion-mnist", "train_samples": args.train_samples,
        "workers": args.base_workers, "per_worker_batch": 32, "epochs": args.epochs, "seed": 1,
        "lr": {"base": args.base_lr, "reference_batch": args.base_workers * 32, "warmup": {"kind": "gradual", "epochs": 1},
               "decay": {"kind": "cosine"}},
        "checkpoint_every_epochs": 1, "log_every_iterations": 20
    });
    let request = json!({"template": "scale_search", "name": "bench-scale-search", "base": base,
        "target_workers": args.target_workers, "devices": slots, "candidates": args.candidates});
    let started = Instant::now();
    let mut search = run_study(api, &request).await?;
    // the bench's own figure beside the view's: the study's wall time, submission to its last point's end
    search["wall_seconds"] = started.elapsed().as_secs_f64().into();
    eprintln!("the search ended after {:.0} s; now the full grid", started.elapsed().as_secs_f64());
    // the same points, written out by the search's definition, every one to its end
    let grid_request = json!({"name": "bench-full-grid", "base": search["definition"]["base"],
        "points": search["definition"]["points"], "reference": 0});
    let started = Instant::now();
    let mut grid = run_study(api, &grid_request).await?;
    grid["wall_seconds"] = started.elapsed().as_secs_f64().into();
    if let Some(out) = &args.out {
        for view in [&search, &grid] {
            let (svg, json) = save(api, view, out).await?;
            eprintln!("wrote {} and {}", svg.display(), json.display());
        }
    }
    Ok((search, grid))
}

/// The study's plot (SVG) and its view (JSON) in `out`, named after the study, as `ringtrain study show
/// --out` writes them.
async fn save(
    api: &ApiClient,
    view: &Value,
    out: &std::path::Path,
) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let id = view["id"].as_str().context("the study has no id")?;
    let name = view["name"].as_str().unwrap_or("study").replace(['/', ' ', ':'], "_");
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let (svg, json) = (out.join(format!("{name}.svg")), out.join(format!("{name}.json")));
    api.download(&format!("/v1/studies/{id}/plot.svg"), &svg, None, Duration::from_secs(60)).await?;
    std::fs::write(&json, serde_json::to_string_pretty(view)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    Ok((svg, json))
}

/// Creates the study and waits until every point has ended: its view.
async fn run_study(api: &ApiClient, request: &Value) -> Result<Value> {
    let created: Value = api.post("/v1/studies", request).await?;
    let id = created["id"].as_str().context("no study id")?.to_string();
    let deadline = Instant::now() + Duration::from_secs(24 * 3600);
    loop {
        let view: Value = api.get(&format!("/v1/studies/{id}")).await?;
        let states = view["states"].as_object().cloned().unwrap_or_default();
        // a multiplier too large may diverge and fail (the collapse guard): a figure of the comparison, not
        // an error of the benchmark
        if states.keys().all(|s| ["succeeded", "failed", "cancelled", "stopped"].contains(&s.as_str())) {
            return Ok(view);
        }
        if Instant::now() > deadline {
            bail!("{} did not end within a day", request["name"]);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A point's final test error if it finished, else its last epoch's; none for a point that failed.
fn figure(point: &Value) -> Option<f64> {
    if point["state"] == "failed" {
        return None;
    }
    point["final_test_error"].as_f64().or_else(|| point["test_error"].as_array()?.last()?.as_f64())
}

fn report(args: &ScaleSearchArgs, slots: u32, search: &Value, grid: &Value) -> String {
    let (search_points, grid_points) = (
        search["points"].as_array().cloned().unwrap_or_default(),
        grid["points"].as_array().cloned().unwrap_or_default(),
    );
    let mut out = format!(
        "{} on Fashion-MNIST ({} samples, {} epochs): kn = {} (reference) to kn = {}, {} multipliers, each \
         candidate on {slots} device(s)\n",
        args.model,
        args.train_samples,
        args.epochs,
        args.base_workers * 32,
        args.target_workers * 32,
        args.candidates
    );
    out += &format!(
        "{:<7} {:>11} {:>16} {:>14} {:<36}\n",
        "point", "multiplier", "grid test err %", "grid device-h", "the search"
    );
    for (s, g) in search_points.iter().zip(&grid_points) {
        let multiplier = s["overrides"]["lr.multiplier"].as_f64().map_or_else(|| "ref".into(), |m| m.to_string());
        let standing = format!(
            "{} ({}, {} %)",
            s["search"].as_str().unwrap_or("-"),
            s["state"].as_str().unwrap_or("?"),
            figure(s).map_or_else(|| "-".into(), |f| format!("{:.2}", f * 100.0))
        );
        out += &format!(
            "{:<7} {:>11} {:>16} {:>14.4} {:<36}\n",
            s["point"],
            multiplier,
            figure(g).map_or_else(|| g["state"].as_str().unwrap_or("-").to_string(), |f| format!("{:.2}", f * 100.0)),
            g["device_seconds"].as_f64().unwrap_or(0.0) / 3600.0,
            standing
        );
    }
    let grid_best = grid_points
        .iter()
        .filter(|p| p["is_reference"] != true)
        .filter_map(|p| Some((figure(p)?, p["point"].as_i64()?)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let chosen = search["search"]["best_point"].as_i64();
    let chosen_error =
        chosen.and_then(|c| search_points.iter().find(|p| p["point"].as_i64() == Some(c))).and_then(figure);
    // the chosen multiplier as the grid trained it: the same point, run without stops
    let chosen_in_grid =
        chosen.and_then(|c| grid_points.iter().find(|p| p["point"].as_i64() == Some(c))).and_then(figure);
    let (spent, grid_spent) =
        (search["device_hours"].as_f64().unwrap_or(f64::NAN), grid["device_hours"].as_f64().unwrap_or(f64::NAN));
    let reference_hours = |points: &[Value]| {
        points.iter().filter(|p| p["is_reference"] == true).filter_map(|p| p["device_seconds"].as_f64()).sum::<f64>()
            / 3600.0
    };
    let (candidates_spent, candidates_grid) =
        (spent - reference_hours(&search_points), grid_spent - reference_hours(&grid_points));
    out += &format!(
        "the search chose point {} ({} % test error); the grid's best is point {} ({} %): {} points apart \
         (target: within 0.5)\n",
        chosen.map_or_else(|| "-".into(), |c| c.to_string()),
        chosen_error.map_or_else(|| "-".into(), |e| format!("{:.2}", e * 100.0)),
        grid_best.map_or_else(|| "-".into(), |b| b.1.to_string()),
        grid_best.map_or_else(|| "-".into(), |b| format!("{:.2}", b.0 * 100.0)),
        chosen_error.zip(grid_best).map_or_else(|| "-".into(), |(c, b)| format!("{:+.2}", (c - b.0) * 100.0)),
    );
    out += &format!(
        "the chosen multiplier in the grid: {} % test error, {} points from the grid's best\n",
        chosen_in_grid.map_or_else(|| "-".into(), |e| format!("{:.2}", e * 100.0)),
        chosen_in_grid.zip(grid_best).map_or_else(|| "-".into(), |(c, b)| format!("{:+.2}", (c - b.0) * 100.0)),
    );
    out += &format!(
        "device-hours: the search {spent:.4}, the full grid {grid_spent:.4}: {:.0}% of the grid (target: at most 40%)\n",
        spent / grid_spent * 100.0
    );
    out += &format!(
        "  the candidates alone (the reference is run by both, or reused with reference_job): the search \
         {candidates_spent:.4}, the grid {candidates_grid:.4}: {:.0}%\n",
        candidates_spent / candidates_grid * 100.0
    );
    out += &format!(
        "wall: the search {:.0} s, the full grid {:.0} s\n",
        search["wall_seconds"].as_f64().unwrap_or(f64::NAN),
        grid["wall_seconds"].as_f64().unwrap_or(f64::NAN)
    );
    out
}
