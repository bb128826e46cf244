//! Times the placement policy's pass without the ringtrain binary (so without libtorch):
//! `cargo run --release -p ringtrain-bench --example bench_scheduler -- [JOBS] [NODES] [PASSES]`.
//! Prints the same JSON report as `ringtrain-bench scheduler --json`.

use ringtrain_bench::plan_pass::{run, BenchConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let defaults = BenchConfig::default();
    let config = BenchConfig {
        queued: number(0, defaults.queued),
        nodes: number(1, defaults.nodes),
        passes: number(2, defaults.passes),
        ..defaults
    };
    let report = run(&config);
    println!("{}", serde_json::to_string(&report).unwrap_or_default());
}
