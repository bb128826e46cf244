//! `jobs metrics ID` and `jobs schedule ID`: what a job reported and the learning rates it trains with.

use std::io::Write;

use anyhow::Result;
use serde_json::Value;
use uuid::Uuid;

use crate::commands::connection::{encode, Connection};

#[derive(Debug, clap::Args)]
pub struct MetricsArgs {
    /// The job's id.
    id: Uuid,
    #[command(flatten)]
    connection: Connection,
    /// `iteration` or `epoch` reports only.
    #[arg(long)]
    kind: Option<String>,
    /// Only this rank's reports.
    #[arg(long)]
    rank: Option<u32>,
    /// CSV (kind, rank, epoch, iteration, then every field) instead of one JSON object per line.
    #[arg(long)]
    csv: bool,
}

#[derive(Debug, clap::Args)]
pub struct ScheduleArgs {
    /// The job's id.
    id: Uuid,
    #[command(flatten)]
    connection: Connection,
    /// The whole answer as JSON (with `--per-iteration`: the lr of every iteration).
    #[arg(long)]
    json: bool,
    #[arg(long, requires = "json")]
    per_iteration: bool,
}

/// Every report of the job, page by page.
pub async fn metrics(args: &MetricsArgs) -> Result<()> {
    let api = args.connection.client()?;
    let mut filters = String::new();
    if let Some(kind) = &args.kind {
        filters += &format!("&kind={}", encode(kind));
    }
    if let Some(rank) = args.rank {
        filters += &format!("&rank={rank}");
    }
    let mut out = std::io::stdout().lock();
    let mut columns: Option<Vec<String>> = None;
    let mut cursor: Option<String> = None;
    loop {
        let after = cursor.as_ref().map_or_else(String::new, |c| format!("&cursor={}", encode(c)));
        let page: Value = api.get(&format!("/v1/jobs/{}/metrics?limit=10000{filters}{after}", args.id)).await?;
        for point in page["points"].as_array().into_iter().flatten() {
            if !args.csv {
                writeln!(out, "{point}")?;
                continue;
            }
            let fields = point["fields"].as_object().cloned().unwrap_or_default();
            let names = columns.get_or_insert_with(|| {
                let names: Vec<String> = fields.keys().cloned().collect();
                let _ = writeln!(out, "kind,rank,epoch,iteration,{}", names.join(","));
                names
            });
            let values: Vec<String> =
                names.iter().map(|n| fields.get(n).map_or_else(String::new, |v| v.to_string())).collect();
            writeln!(
                out,
                "{},{},{},{},{}",
                point["kind"].as_str().unwrap_or(""),
                point["rank"],
                point["epoch"],
                point["iteration"],
                values.join(",")
            )?;
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return Ok(()),
        }
    }
}

/// The schedule, one line per epoch (lr at its first and last iteration), or the answer as JSON.
pub async fn schedule(args: &ScheduleArgs) -> Result<()> {
    let api = args.connection.client()?;
    let query = if args.per_iteration { "?per_iteration=true" } else { "" };
    let view: Value = api.get(&format!("/v1/jobs/{}/schedule{query}", args.id)).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
        return Ok(());
    }
    let effective = &view["effective"];
    println!(
        "global batch {}, lr {} (x{} of {} for {}), {} warmup iterations, {} iterations",
        effective["global_batch"],
        effective["scaled_lr"],
        effective["scaling_factor"],
        effective["base_lr"],
        effective["reference_batch"],
        effective["warmup_iterations"],
        effective["total_iterations"]
    );
    println!("{:>6}  {:>12}  {:>12}", "epoch", "lr first", "lr last");
    for epoch in view["epochs"].as_array().into_iter().flatten() {
        println!(
            "{:>6}  {:>12.6}  {:>12.6}",
            epoch["epoch"],
            epoch["lr_first"].as_f64().unwrap_or(f64::NAN),
            epoch["lr_last"].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}
