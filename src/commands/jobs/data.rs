//! `jobs metrics ID` and `jobs schedule ID`: what a job reported and the learning rates it trains with.

use std::io::Write;

use crate::commands::ids::{resolve, IdArg, Kind};
use anyhow::Result;
use ringtrain_views::jobs::records::MetricPoint;

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
    let mut kept: Vec<MetricPoint> = Vec::new();
    let mut cursor: Option<String> = None;
    let id = id.to_string();
    loop {
        let after = cursor.as_ref().map_or_else(String::new, |c| format!("&cursor={}", encode(c)));
        let page = api.job_metrics(&id, &format!("limit=10000{filters}{after}")).await?;
        for point in page.points {
            if args.csv {
                kept.push(point);
            } else {
                writeln!(out, "{}", serde_json::to_string(&point)?)?;
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
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
fn write_csv(out: &mut impl Write, points: &[MetricPoint]) -> std::io::Result<()> {
    let mut names: Vec<&str> = Vec::new();
    for point in points {
        for name in point.fields.keys() {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    writeln!(out, "kind,rank,epoch,iteration,attempt{}", names.iter().map(|n| format!(",{n}")).collect::<String>())?;
    for point in points {
        let values: String =
            names.iter().map(|n| point.fields.get(*n).map_or_else(|| ",".to_string(), |v| format!(",{v}"))).collect();
        writeln!(out, "{},{},{},{},{}{values}", point.kind, point.rank, point.epoch, point.iteration, point.attempt)?;
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
        ]
        .map(|point| serde_json::from_value(point).unwrap());
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
