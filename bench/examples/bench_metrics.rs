//! The metrics benchmark without the ringtrain binary (so without libtorch):
//! `cargo run --release -p ringtrain-bench --example bench_metrics -- DATABASE_URL [POINTS] [RANKS]`, on a
//! database it may fill (it adds a team and a job). Prints the same JSON report as
//! `ringtrain-bench metrics --json`.

use ringtrain_bench::store_scale::{metrics, MetricsBenchConfig};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(url) = args.first() else {
        eprintln!("usage: bench_metrics DATABASE_URL [POINTS] [RANKS]");
        std::process::exit(2);
    };
    let defaults = MetricsBenchConfig::default();
    let config = MetricsBenchConfig {
        points: args.get(1).and_then(|a| a.parse().ok()).unwrap_or(defaults.points),
        ranks: args.get(2).and_then(|a| a.parse().ok()).unwrap_or(defaults.ranks),
        ..defaults
    };
    match metrics(url, &config).await {
        Ok(report) => println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default()),
        Err(err) => {
            eprintln!("error: {err}");
            std::process::exit(1);
        }
    }
}
