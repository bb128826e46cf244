//! Runs the API benchmark against a server: `cargo run --release -p ringtrain-bench --example bench_api --
//! ADDRESS ADMIN_TOKEN [SUBMISSIONS] [CONCURRENCY] [HISTORY] [PAGES]`. Prints one JSON report.
//!
//! `bench_api serve ADDRESS DATABASE_URL ADMIN_TOKEN` runs the server itself (the same app as `ringtrain
//! serve`, in its own process), so a release-built server can be measured without building libtorch.

use std::sync::Arc;

use ringtrain_api::{app, ApiConfig, AppState};
use ringtrain_bench::api_load::{run, BenchOptions};
use ringtrain_scheduler::LoopConfig;

async fn serve(address: &str, url: &str, token: &str) -> Result<(), Box<dyn std::error::Error>> {
    let store = ringtrain_store::connect(url).await?;
    ringtrain_api::bootstrap::bootstrap(store.as_ref(), Some(token)).await?;
    let dir = std::env::temp_dir().join("ringtrain-bench-api");
    let listener = tokio::net::TcpListener::bind(address).await?;
    eprintln!("listening on {}", listener.local_addr()?);
    // as `ringtrain serve --rate-limit 0 --max-queued-per-team 10000000` (the benchmark's one token submits
    // faster, and queues more, than the defaults let one team), with its scheduler loop and its listener for
    // other servers' changes, which share the machine with the requests
    let mut config = ApiConfig::new(dir);
    config.admission.rate_per_second = 0.0;
    config.max_queued_per_team = 10_000_000;
    let state = AppState::new(Arc::clone(&store), config);
    let mut loop_config = LoopConfig::starting_now(state.config.lease);
    loop_config.view = state.config.scheduling;
    // BENCH_PASS_GAP_MS: the scheduler loop's shortest gap between passes, to measure its cost
    if let Some(ms) = std::env::var("BENCH_PASS_GAP_MS").ok().and_then(|ms| ms.parse().ok()) {
        loop_config.min_pass_gap = std::time::Duration::from_millis(ms);
    }
    if std::env::var_os("BENCH_NO_SCHEDULER").is_none() {
        tokio::spawn(state.scheduler(loop_config).run());
    }
    tokio::spawn(state.clone().listen_to_other_servers());
    let service = app(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, service).await?;
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        let [_, address, url, token] = args.as_slice() else {
            eprintln!("usage: bench_api serve ADDRESS DATABASE_URL ADMIN_TOKEN");
            std::process::exit(2);
        };
        if let Err(err) = serve(address, url, token).await {
            eprintln!("error: {err}");
            std::process::exit(1);
        }
        return;
    }
    let number = |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (Some(address), Some(token)) = (args.first(), args.get(1)) else {
        eprintln!("usage: bench_api ADDRESS ADMIN_TOKEN [SUBMISSIONS] [CONCURRENCY] [HISTORY] [PAGES]");
        std::process::exit(2);
    };
    let options = BenchOptions {
        address: address.clone(),
        admin_token: token.clone(),
        submissions: number(2, 2000),
        concurrency: number(3, 16),
        history: number(4, 100_000),
        pages: number(5, 200),
    };
    match run(&options).await {
        Ok(report) => println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default()),
        Err(err) => {
            eprintln!("error: {err}");
            std::process::exit(1);
        }
    }
}
