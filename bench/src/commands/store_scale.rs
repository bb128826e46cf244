//! `ringtrain-bench metrics` and `ringtrain-bench history`: the database at scale (10^7 metric points of one job, 10^6 jobs in
//! one team's history) and the reads the API makes of it. Each runs in a fresh Postgres database on
//! `--postgres-url`'s server, dropped afterwards.

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::json;

use ringtrain_bench::store_scale::{HistoryBenchConfig, MetricsBenchConfig, ReadTimes};

#[derive(Debug, clap::Args)]
pub struct MetricsArgs {
    /// A Postgres server (any database on it): the benchmark makes its own database there and drops it.
    #[arg(long, env = "RINGTRAIN_BENCH_POSTGRES_URL", default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    postgres_url: String,
    /// Points written (64 ranks by default: 10^7 is 156,250 iterations of each).
    #[arg(long, default_value_t = 10_000_000)]
    points: u64,
    #[arg(long, default_value_t = 64)]
    ranks: u32,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// A Postgres server (any database on it): the benchmark makes its own database there and drops it.
    #[arg(long, env = "RINGTRAIN_BENCH_POSTGRES_URL", default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    postgres_url: String,
    /// Jobs in the team's history.
    #[arg(long, default_value_t = 1_000_000)]
    jobs: u64,
    #[arg(long)]
    json: bool,
}

pub fn metrics(args: &MetricsArgs) -> Result<()> {
    let config = MetricsBenchConfig { points: args.points, ranks: args.ranks, ..MetricsBenchConfig::default() };
    let report = in_fresh_database(&args.postgres_url, "metrics", |url| async move {
        Ok(ringtrain_bench::store_scale::metrics(&url, &config).await?)
    })?;
    if args.json {
        return print_json("metrics", &report);
    }
    println!(
        "metrics: {} points of one job ({} ranks), written at {:.0} points/s ({:.1} s; upserts of {} points, {} writers)",
        report.stored,
        report.config.ranks,
        report.points_per_s,
        report.write_s,
        report.config.batch,
        report.config.writers
    );
    print_reads(&report.reads);
    Ok(())
}

pub fn history(args: &HistoryArgs) -> Result<()> {
    let config = HistoryBenchConfig { jobs: args.jobs, ..HistoryBenchConfig::default() };
    let report = in_fresh_database(&args.postgres_url, "history", |url| async move {
        Ok(ringtrain_bench::store_scale::history(&url, &config).await?)
    })?;
    if args.json {
        return print_json("history", &report);
    }
    println!(
        "history: {} jobs of one team (filled in {:.1} s); pages of 50 as GET /v1/jobs reads them",
        args.jobs, report.fill_s
    );
    print_reads(&report.reads);
    Ok(())
}

fn print_reads(reads: &[ReadTimes]) {
    println!("{:<34} {:>9} {:>9} {:>10} {:>9}", "read", "returned", "min ms", "median ms", "max ms");
    for read in reads {
        println!(
            "{:<34} {:>9} {:>9.1} {:>10.1} {:>9.1}",
            read.read, read.returned, read.min_ms, read.median_ms, read.max_ms
        );
    }
}

fn print_json(bench: &str, report: &impl Serialize) -> Result<()> {
    let mut value = serde_json::to_value(report)?;
    value["bench"] = json!(bench);
    println!("{value}");
    Ok(())
}

/// Runs `body` on a new database `ringtrain_bench_<what>_<pid>` of the server at `admin_url`, dropping it after.
fn in_fresh_database<T, F, Fut>(admin_url: &str, what: &str, body: F) -> Result<T>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    use sqlx::Connection;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut admin = sqlx::PgConnection::connect(admin_url)
            .await
            .with_context(|| "cannot connect to --postgres-url (is Postgres running?)")?;
        let name = format!("ringtrain_bench_{what}_{}", std::process::id());
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await?;
        let (base, _) = admin_url.rsplit_once('/').context("--postgres-url must end in /DATABASE")?;
        let outcome = body(format!("{base}/{name}")).await;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut admin).await?;
        outcome
    })
}
