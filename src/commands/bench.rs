//! `ringtrain bench`: measurements printed side by side with the reference they are judged against, as a
//! table or (`--json`) one JSON object per measurement.
//!
//! - `allreduce`: the TCP ring's algbw and busbw (nccl-tests definitions: algbw = bytes / time, busbw =
//!   algbw · 2(k−1)/k) next to this machine's memcpy bandwidth, the ceiling of any host all-reduce.
//! - `train`: samples/s and time per step by phase, for k ranks next to one rank without communication.
//! - `submit` (in `latency`): submit -> first iteration through the platform, next to the ranks alone.

use std::net::TcpListener;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ringtrain_core::JobSpec;
use ringtrain_worker::data::shuffle::epoch_permutation;
use ringtrain_worker::trainer::PhaseTimes;
use ringtrain_worker::{Collective, RendezvousConfig, RingCollective, TrainOptions, Trainer};
use serde_json::json;

#[derive(Debug, clap::Subcommand)]
pub enum Bench {
    /// All-reduce bandwidth of the TCP ring (k ranks as threads, real sockets on 127.0.0.1).
    Allreduce(AllreduceArgs),
    /// Training throughput and time per step by phase.
    Train(TrainArgs),
    /// Time of one placement-policy pass on a synthetic cluster (pure CPU, no database).
    Scheduler(SchedulerArgs),
    /// Submit -> first iteration reported, through a running server and its agents (e.g. `ringtrain up`), next
    /// to the same spec's k rank processes started directly.
    Submit(super::latency::SubmitArgs),
    /// REST API load: job submissions per second with p50/p99 latency, and `GET /v1/jobs` page latency with a
    /// large run history, against a running `ringtrain serve` (use Postgres for the figures that matter).
    Api(ApiArgs),
}

#[derive(Debug, clap::Args)]
pub struct ApiArgs {
    /// The server, HOST:PORT (loopback: this is a local benchmark).
    #[arg(long, default_value = "127.0.0.1:8080")]
    server: String,
    /// An admin token (the benchmark creates its own team).
    #[arg(long, env = "RINGTRAIN_TOKEN")]
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

#[derive(Debug, clap::Args)]
pub struct AllreduceArgs {
    #[arg(long, default_value_t = 2)]
    world: usize,
    /// Buffer sizes, e.g. 1MB,16MB,64MB,256MB (KB/MB/GB are powers of 1024).
    #[arg(long, default_value = "1MB,16MB,64MB,256MB", value_delimiter = ',')]
    sizes: Vec<String>,
    /// One JSON object per measurement instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    #[arg(long, default_value = "lenet5")]
    model: String,
    /// Per-rank batch n.
    #[arg(long, default_value_t = 32)]
    batch: u32,
    /// Ranks k (threads of this process, talking over the TCP ring); 1 rank without communication is
    /// measured too, as the reference.
    #[arg(long, default_value_t = 2)]
    world: u32,
    /// Timed steps (after 3 warm-up steps).
    #[arg(long, default_value_t = 30)]
    steps: u32,
    #[arg(long, default_value = "fashion-mnist")]
    dataset: String,
    /// libtorch threads (shared by the ranks of this process).
    #[arg(long, default_value_t = 1)]
    threads: i32,
    #[arg(long)]
    json: bool,
}

pub fn run(bench: Bench) -> ExitCode {
    let outcome = match bench {
        Bench::Allreduce(args) => allreduce(&args),
        Bench::Train(args) => train(&args),
        Bench::Scheduler(args) => scheduler(&args),
        Bench::Api(args) => api(&args),
        Bench::Submit(args) => super::latency::run(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn parse_size(text: &str) -> Result<usize> {
    let upper = text.trim().to_ascii_uppercase();
    let (digits, unit) = upper.split_at(upper.find(|c: char| !c.is_ascii_digit()).unwrap_or(upper.len()));
    let n: usize = digits.parse().with_context(|| format!("bad size {text:?}"))?;
    let scale = match unit {
        "" | "B" => 1,
        "KB" | "K" => 1 << 10,
        "MB" | "M" => 1 << 20,
        "GB" | "G" => 1 << 30,
        other => anyhow::bail!("unknown unit {other:?} in {text:?}"),
    };
    Ok(n * scale)
}

/// Single-threaded memcpy bandwidth over a buffer of `bytes` (GB/s, 1e9 bytes).
fn memcpy_gbps(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(started.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    bytes as f64 / best / 1e9
}

fn free_address() -> Result<std::net::SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Runs `body` on `world` ranks connected in a ring (threads), returning rank 0's result.
fn on_ring<T: Send + 'static>(
    world: usize,
    body: impl Fn(&mut dyn Collective) -> Result<T> + Send + Sync + Clone + 'static,
) -> Result<T> {
    let address = free_address()?;
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let body = body.clone();
            std::thread::spawn(move || -> Result<T> {
                let config = RendezvousConfig {
                    address,
                    rank,
                    world,
                    join_timeout: Duration::from_secs(30),
                    io_timeout: Duration::from_secs(120),
                };
                let mut ring = RingCollective::connect(&config)?;
                body(&mut ring)
            })
        })
        .collect();
    let mut results: Vec<Result<T>> =
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))).collect();
    for r in results.iter().skip(1) {
        if let Err(e) = r {
            anyhow::bail!("a rank failed: {e:#}");
        }
    }
    results.swap_remove(0)
}

fn allreduce(args: &AllreduceArgs) -> Result<()> {
    let sizes: Vec<usize> = args.sizes.iter().map(|s| parse_size(s)).collect::<Result<_>>()?;
    let world = args.world.max(1);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let memcpy = memcpy_gbps(largest.max(1 << 20));
    let timings = on_ring(world, {
        let sizes = sizes.clone();
        move |comm| {
            let mut out = Vec::new();
            for &bytes in &sizes {
                let mut buf = vec![1.0f32; bytes / 4];
                comm.all_reduce_sum(&mut buf)?; // warm-up: connections, page faults
                let mut iterations = 0u32;
                comm.barrier()?;
                let started = Instant::now();
                // at least 3 iterations and about a second; every rank runs the same count (rank 0 decides)
                loop {
                    comm.all_reduce_sum(&mut buf)?;
                    iterations += 1;
                    let mut go_on =
                        [if iterations < 3 || started.elapsed() < Duration::from_secs(1) { 1.0 } else { 0.0 }];
                    comm.broadcast(&mut go_on, 0)?;
                    if go_on[0] == 0.0 || iterations >= 50 {
                        break;
                    }
                }
                out.push(started.elapsed().as_secs_f64() / f64::from(iterations));
            }
            Ok(out)
        }
    })?;
    let bus_factor = 2.0 * (world as f64 - 1.0) / world as f64;
    if !args.json {
        println!("all-reduce (sum, f32), TCP ring, world {world}: ranks are threads of one process on 127.0.0.1");
        println!("reference: memcpy {memcpy:.2} GB/s (one thread, {} MiB)", largest.max(1 << 20) >> 20);
        println!("{:>10} {:>12} {:>12} {:>12} {:>14}", "size", "time (ms)", "algbw GB/s", "busbw GB/s", "memcpy GB/s");
    }
    for (&bytes, &seconds) in sizes.iter().zip(&timings) {
        let algbw = bytes as f64 / seconds / 1e9;
        let busbw = algbw * bus_factor;
        if args.json {
            println!(
                "{}",
                json!({"bench": "allreduce", "size_bytes": bytes, "world": world, "seconds": seconds,
                       "algbw_gbps": algbw, "busbw_gbps": busbw, "memcpy_gbps": memcpy})
            );
        } else {
            println!(
                "{:>10} {:>12.3} {:>12.3} {:>12.3} {:>14.2}",
                format!("{}MB", bytes as f64 / (1 << 20) as f64),
                seconds * 1e3,
                algbw,
                busbw,
                memcpy
            );
        }
    }
    Ok(())
}

fn bench_spec(args: &TrainArgs, world: u32) -> Result<JobSpec> {
    let samples = u64::from((args.steps + 3) * world * args.batch);
    let text = json!({
        "model": {"name": args.model},
        "dataset": args.dataset,
        "train_samples": samples,
        "test_samples": 1,
        "workers": world,
        "per_worker_batch": args.batch,
        "epochs": 1,
        "lr": {"warmup": {"kind": "none"}, "decay": {"kind": "none"}},
    })
    .to_string();
    JobSpec::from_json(&text)
        .map_err(|e| anyhow::anyhow!("{}", e.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")))
}

/// Per-step phase times of rank 0 over the timed steps, and the wall time.
fn measure(spec: JobSpec, steps: u32, world: usize) -> Result<(PhaseTimes, f64)> {
    on_ring(world, move |comm| {
        let mut trainer = Trainer::new(&spec, comm, TrainOptions::default())?;
        let permutation = epoch_permutation(spec.seed, 0, trainer.effective().train_size as usize);
        for t in 0..3 {
            trainer.train_step(t as u64, t, &permutation)?;
        }
        trainer.times = PhaseTimes::default();
        let started = Instant::now();
        for t in 3..3 + steps as usize {
            trainer.train_step(t as u64, t, &permutation)?;
        }
        Ok((trainer.times, started.elapsed().as_secs_f64()))
    })
}

fn train(args: &TrainArgs) -> Result<()> {
    tch::set_num_threads(args.threads);
    let mut rows = Vec::new();
    let worlds: Vec<u32> = if args.world > 1 { vec![1, args.world] } else { vec![1] };
    for &world in &worlds {
        let (times, wall) = measure(bench_spec(args, world)?, args.steps, world as usize)?;
        let per_step = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(args.steps);
        let samples_per_s = f64::from(args.steps * world * args.batch) / wall;
        rows.push(json!({
            "bench": "train", "model": args.model, "batch": args.batch, "world": world,
            "samples_per_s": samples_per_s, "step_ms": wall * 1e3 / f64::from(args.steps),
            "forward_ms": per_step(times.forward), "backward_ms": per_step(times.backward),
            "allreduce_ms": per_step(times.allreduce), "optimizer_ms": per_step(times.optimizer),
            "reference": world == 1,
        }));
    }
    if args.json {
        for row in rows {
            println!("{row}");
        }
        return Ok(());
    }
    println!(
        "training step, {} batch {} per rank, {} ({} libtorch thread(s); ranks are threads of one process)",
        args.model, args.batch, args.dataset, args.threads
    );
    println!(
        "{:>6} {:>12} {:>10} {:>11} {:>12} {:>13} {:>13}",
        "world", "samples/s", "step ms", "forward ms", "backward ms", "allreduce ms", "optimizer ms"
    );
    for row in &rows {
        println!(
            "{:>6} {:>12.0} {:>10.2} {:>11.2} {:>12.2} {:>13.2} {:>13.2}{}",
            row["world"].as_u64().unwrap_or(0),
            row["samples_per_s"].as_f64().unwrap_or(0.0),
            row["step_ms"].as_f64().unwrap_or(0.0),
            row["forward_ms"].as_f64().unwrap_or(0.0),
            row["backward_ms"].as_f64().unwrap_or(0.0),
            row["allreduce_ms"].as_f64().unwrap_or(0.0),
            row["optimizer_ms"].as_f64().unwrap_or(0.0),
            if row["reference"] == true { "   (reference: one rank, no communication)" } else { "" }
        );
    }
    Ok(())
}

fn scheduler(args: &SchedulerArgs) -> Result<()> {
    let config = ringtrain_scheduler::bench::BenchConfig {
        queued: args.jobs,
        nodes: args.nodes,
        devices_per_node: args.devices_per_node,
        teams: args.teams,
        passes: args.passes,
        ..Default::default()
    };
    let report = ringtrain_scheduler::bench::run(&config);
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
        "{:>8} {:>10} {:>10} {:>10} {:>8} {:>12} {:>13}",
        "passes", "min ms", "median ms", "max ms", "starts", "preemptions", "reservations"
    );
    println!(
        "{:>8} {:>10.2} {:>10.2} {:>10.2} {:>8} {:>12} {:>13}",
        config.passes,
        report.min_ms,
        report.median_ms,
        report.max_ms,
        report.starts,
        report.preemptions,
        report.reservations
    );
    Ok(())
}

fn api(args: &ApiArgs) -> Result<()> {
    let options = ringtrain_api::bench::BenchOptions {
        address: args.server.clone(),
        admin_token: args.token.clone(),
        submissions: args.submissions,
        concurrency: args.concurrency,
        history: args.history,
        pages: args.pages,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(ringtrain_api::bench::run(&options)).map_err(|e| anyhow::anyhow!("{e}"))?;
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

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1MB").unwrap(), 1 << 20);
        assert_eq!(parse_size("256mb").unwrap(), 256 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("3XB").is_err());
    }
}
