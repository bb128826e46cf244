//! The run-history benchmark without the ringtrain binary (so without libtorch):
//! `cargo run --release -p ringtrain-bench --example bench_history -- POSTGRES_URL [JOBS]`, on a database it
//! may fill (it adds a team and its jobs). Prints the same JSON report as `ringtrain-bench history --json`.

use ringtrain_bench::store_scale::{history, HistoryBenchConfig};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(url) = args.first() else {
        eprintln!("usage: bench_history POSTGRES_URL [JOBS]");
        std::process::exit(2);
    };
    let defaults = HistoryBenchConfig::default();
    let config =
        HistoryBenchConfig { jobs: args.get(1).and_then(|a| a.parse().ok()).unwrap_or(defaults.jobs), ..defaults };
    match history(url, &config).await {
        Ok(report) => println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default()),
        Err(err) => {
            eprintln!("error: {err}");
            std::process::exit(1);
        }
    }
}
