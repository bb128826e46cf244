//! `ringtrain-bench scheduler` and `ringtrain-bench api`: the control plane's figures (one placement-policy pass; REST API
//! submissions and pages under load).

use anyhow::Result;
use serde_json::json;

#[derive(Debug, clap::Args)]
pub struct ApiArgs {
    /// The server, HOST:PORT (loopback: this is a local benchmark).
    #[arg(long, default_value = "127.0.0.1:8080")]
    server: String,
    /// An admin token (the benchmark creates its own team).
    #[arg(long, env = "RINGTRAIN_TOKEN", hide_env_values = true)]
    token: String,
    /// Timed submissions.
    #[arg(long, default_value_t = 2000)]
    submissions: usize,
    /// Parallel connections.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Jobs in the team's history before pages are timed.
    #[arg(long, default_value_t = 100_000)]
    history: usize,
    /// Pages timed per kind of page.
    #[arg(long, default_value_t = 200)]
    pages: usize,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SchedulerArgs {
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    devices_per_node: u32,
    #[arg(long, default_value_t = 20)]
    teams: usize,
    /// Timed passes (after one warm-up pass); min and median are reported.
    #[arg(long, default_value_t = 20)]
    passes: usize,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn scheduler(args: &SchedulerArgs) -> Result<()> {
    let config = ringtrain_bench::plan_pass::BenchConfig {
        queued: args.jobs,
        nodes: args.nodes,
        devices_per_node: args.devices_per_node,
        teams: args.teams,
        passes: args.passes,
        ..Default::default()
    };
    let report = ringtrain_bench::plan_pass::run(&config);
    if args.json {
        let mut object = serde_json::to_value(&report)?;
        object["bench"] = json!("scheduler");
        println!("{object}");
        return Ok(());
    }
    println!(
        "placement policy, one pass: {} queued jobs, {} nodes x {} devices, {} teams, {} running jobs ({:.0}% busy)",
        config.queued,
        config.nodes,
        config.devices_per_node,
        config.teams,
        report.running,
        config.busy_fraction * 100.0
    );
    println!(
        "{:>8} {:>10} {:>10} {:>10} {:>8} {:>12} {:>13} {:>8}",
        "passes", "min ms", "median ms", "max ms", "starts", "preemptions", "reservations", "waiting"
    );
    println!(
        "{:>8} {:>10.2} {:>10.2} {:>10.2} {:>8} {:>12} {:>13} {:>8}",
        config.passes,
        report.min_ms,
        report.median_ms,
        report.max_ms,
        report.starts,
        report.preemptions,
        report.reservations,
        report.waiting
    );
    let reasons: Vec<String> = report.reasons.iter().map(|(code, n)| format!("{code} {n}")).collect();
    println!("every waiting job's reason and place is recorded in the pass: {}", reasons.join(", "));
    Ok(())
}

pub fn api(args: &ApiArgs) -> Result<()> {
    let options = ringtrain_bench::api_load::BenchOptions {
        address: args.server.clone(),
        admin_token: args.token.clone(),
        submissions: args.submissions,
        concurrency: args.concurrency,
        history: args.history,
        pages: args.pages,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(ringtrain_bench::api_load::run(&options)).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut value = serde_json::to_value(&report)?;
    value["bench"] = json!("api");
    if args.json {
        println!("{value}");
    } else {
        println!("REST API against {} ({} connections)", args.server, args.concurrency);
        println!("{}", serde_json::to_string_pretty(&value)?);
    }
    Ok(())
}
