//! `jobs metrics ID` and `jobs schedule ID`: what a job reported and the learning rates it trains with.

use std::io::Write;

use crate::commands::ids::{resolve, IdArg, Kind};
use anyhow::Result;
use serde_json::Value;

use crate::commands::connection::{encode, Connection};

#[derive(Debug, clap::Args)]
pub struct MetricsArgs {
    /// The job's id, or the start of it (`76acc08f`).
    id: IdArg,
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
    /// The job's id, or the start of it (`76acc08f`).
    id: IdArg,
    #[command(flatten)]
    connection: Connection,
    /// The whole answer as JSON (with `--per-iteration`: the lr of every iteration).
    #[arg(long)]
    json: bool,
    #[arg(long, requires = "json")]
    per_iteration: bool,
}

/// Every report of the job, page by page: one JSON object per line as they come, or (`--csv`) one table
/// whose columns are every field any report has (iteration and epoch reports have different ones).
pub async fn metrics(args: &MetricsArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let mut filters = String::new();
    if let Some(kind) = &args.kind {
        filters += &format!("&kind={}", encode(kind));
    }
    if let Some(rank) = args.rank {
        filters += &format!("&rank={rank}");
    }
    let mut out = std::io::stdout().lock();
    let mut kept: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let after = cursor.as_ref().map_or_else(String::new, |c| format!("&cursor={}", encode(c)));
        let page: Value = api.get(&format!("/v1/jobs/{id}/metrics?limit=10000{filters}{after}")).await?;
        for point in page["points"].as_array().into_iter().flatten() {
            if args.csv {
                kept.push(point.clone());
            } else {
                writeln!(out, "{point}")?;
            }
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    if args.csv {
        write_csv(&mut out, &kept)?;
    }
    Ok(())
}

/// The points as CSV: kind, rank, epoch, iteration, attempt, then every field any point has, in the order
/// they first appear; a point without a field leaves its cell empty.
fn write_csv(out: &mut impl Write, points: &[Value]) -> std::io::Result<()> {
    let mut names: Vec<&str> = Vec::new();
    for point in points {
        for name in point["fields"].as_object().into_iter().flat_map(|f| f.keys()) {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    writeln!(out, "kind,rank,epoch,iteration,attempt{}", names.iter().map(|n| format!(",{n}")).collect::<String>())?;
    for point in points {
        let fields = &point["fields"];
        let values: String =
            names.iter().map(|n| fields.get(n).map_or_else(|| ",".to_string(), |v| format!(",{v}"))).collect();
        writeln!(
            out,
            "{},{},{},{},{}{values}",
            point["kind"].as_str().unwrap_or(""),
            point["rank"],
            point["epoch"],
            point["iteration"],
            point["attempt"],
        )?;
    }
    Ok(())
}

/// The schedule, one line per epoch (lr at its first and last iteration), or the answer as JSON.
pub async fn schedule(args: &ScheduleArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let view = api.job_schedule(&id.to_string(), args.per_iteration).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
        return Ok(());
    }
    let effective = &view.effective;
    println!(
        "global batch {}, lr {} (x{} of {} for {}), {} warmup iterations, {} iterations",
        effective.global_batch,
        effective.scaled_lr,
        effective.scaling_factor,
        effective.base_lr,
        effective.reference_batch,
        effective.warmup_iterations,
        effective.total_iterations
    );
    println!("{:>6}  {:>12}  {:>12}", "epoch", "lr first", "lr last");
    for epoch in &view.epochs {
        println!("{:>6}  {:>12.6}  {:>12.6}", epoch.epoch, epoch.lr_first, epoch.lr_last);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn the_csv_has_every_field_of_every_kind_of_report() {
        let points = [
            json!({"kind": "epoch", "rank": 0, "epoch": 0, "iteration": 9, "attempt": 1,
                "fields": {"test_error": 0.5}}),
            json!({"kind": "iteration", "rank": 0, "epoch": 0, "iteration": 0, "attempt": 1,
                "fields": {"loss": 2.3, "lr": 0.1}}),
        ];
        let mut out = Vec::new();
        super::write_csv(&mut out, &points).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "kind,rank,epoch,iteration,attempt,test_error,loss,lr\n\
             epoch,0,0,9,1,0.5,,\n\
             iteration,0,0,0,1,,2.3,0.1\n"
        );
    }
}
