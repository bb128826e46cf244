//! `bench allreduce`: all-reduce bandwidth with the nccl-tests definitions (algbw = bytes / time, busbw =
//! algbw · 2(k−1)/k), for the TCP ring (k ranks as threads, real sockets on 127.0.0.1, next to this
//! machine's memcpy bandwidth, the ceiling of any host all-reduce) or NCCL (k rank processes, one GPU each,
//! sums and broadcasts checked exact on the GPU).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use ringtrain_worker::{Collective, NcclCollective, RendezvousConfig};
use serde_json::json;
use tch::{Device, Kind, Tensor};

use super::{on_ring, on_shared_memory, parse_size};
use crate::commands::launch::run_gpu_ranks;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// The two host all-reduces side by side: the TCP ring, then shared memory.
    Host,
    Ring,
    Shm,
    Nccl,
}

#[derive(Debug, clap::Args)]
pub struct AllreduceArgs {
    /// host: the TCP ring and shared memory side by side; ring: the TCP ring; shm: shared memory (ranks
    /// are threads for these three); nccl: NCCL on GPUs (one process per rank and GPU).
    #[arg(long, value_enum, default_value = "host")]
    backend: Transport,
    /// shm: floats per slot of the shared segment (a round's size per rank).
    #[arg(long, default_value_t = ringtrain_worker::collective::DEFAULT_SLOT_ELEMS)]
    slot_elems: usize,
    #[arg(long, default_value_t = 2)]
    world: usize,
    /// Buffer sizes, e.g. 1MB,16MB,64MB,256MB (KB/MB/GB are powers of 1024).
    #[arg(long, default_value = "1MB,16MB,64MB,256MB", value_delimiter = ',')]
    sizes: Vec<String>,
    /// One JSON object per measurement instead of a table.
    #[arg(long)]
    json: bool,
    /// nccl: run only this rank (with --rendezvous); without it, all --world ranks are started here.
    #[arg(long, requires = "rendezvous")]
    rank: Option<usize>,
    #[arg(long)]
    rendezvous: Option<SocketAddr>,
    #[arg(long, default_value_t = 60)]
    join_timeout_s: u64,
    #[arg(long, default_value_t = 60)]
    comm_timeout_s: u64,
    /// nccl on a one-GPU machine: every rank on GPU 0, each its own NCCL "host" (tests only).
    #[arg(long, hide = true)]
    share_gpu_for_tests: bool,
}

pub fn run(args: &AllreduceArgs) -> Result<()> {
    let sizes: Vec<usize> = args.sizes.iter().map(|s| parse_size(s)).collect::<Result<_>>()?;
    match (args.backend, args.rank, args.rendezvous) {
        (Transport::Host, _, _) => host(args, &sizes, &[Transport::Ring, Transport::Shm]),
        (Transport::Ring | Transport::Shm, _, _) => host(args, &sizes, &[args.backend]),
        (Transport::Nccl, Some(rank), Some(rendezvous)) => nccl_rank(args, &sizes, rank, rendezvous),
        (Transport::Nccl, _, _) => nccl_processes(args),
    }
}

/// Starts the --world rank processes of an NCCL measurement and waits for them; rank 0 prints.
fn nccl_processes(args: &AllreduceArgs) -> Result<()> {
    let world = args.world.max(1);
    run_gpu_ranks(world, args.share_gpu_for_tests, |rank, rendezvous| {
        let mut argv: Vec<String> =
            ["bench", "allreduce", "--backend", "nccl", "--rendezvous", rendezvous].map(String::from).into();
        for (flag, value) in [
            ("--world", world.to_string()),
            ("--rank", rank.to_string()),
            ("--sizes", args.sizes.join(",")),
            ("--join-timeout-s", args.join_timeout_s.to_string()),
            ("--comm-timeout-s", args.comm_timeout_s.to_string()),
        ] {
            argv.extend([flag.to_string(), value]);
        }
        if args.json {
            argv.push("--json".into());
        }
        argv
    })
}

/// One rank of an NCCL measurement, on CUDA device 0 (its only visible GPU).
fn nccl_rank(args: &AllreduceArgs, sizes: &[usize], rank: usize, rendezvous: SocketAddr) -> Result<()> {
    if !tch::Cuda::is_available() {
        bail!("--backend nccl needs a GPU: {}", ringtrain_worker::doctor::why_no_cuda());
    }
    let device = Device::Cuda(0);
    let config = RendezvousConfig {
        address: rendezvous,
        rank,
        world: args.world.max(1),
        join_timeout: Duration::from_secs(args.join_timeout_s),
        io_timeout: Duration::from_secs(args.comm_timeout_s),
        secret: crate::commands::train::rendezvous_secret(),
    };
    let mut comm = NcclCollective::connect(&config, device)?;
    let world = comm.world_size();
    let mut staging = Vec::new();
    if rank == 0 && !args.json {
        println!(
            "all-reduce (sum, f32), NCCL, world {world}: one process per rank{}",
            if args.share_gpu_for_tests {
                ", all on GPU 0 as separate NCCL hosts over loopback sockets (a correctness check, not NVLink bandwidth)"
            } else {
                ", one GPU each"
            }
        );
        println!("{:>10} {:>12} {:>12} {:>12} {:>8}", "size", "time (ms)", "algbw GB/s", "busbw GB/s", "exact");
    }
    for &bytes in sizes {
        let n = (bytes / 4) as i64;
        let exact = check_exact(&mut comm, n, device, &mut staging)?;
        let mut buf = Tensor::ones([n], (Kind::Float, device));
        comm.barrier()?;
        let started = Instant::now();
        let mut iterations = 0u32;
        // at least 5 iterations and about a second; every rank runs the same count (rank 0 decides)
        loop {
            comm.all_reduce_sum_tensor(&mut buf, &mut staging)?;
            iterations += 1;
            let mut go_on = [if iterations < 5 || started.elapsed() < Duration::from_secs(1) { 1.0 } else { 0.0 }];
            comm.broadcast(&mut go_on, 0)?;
            if go_on[0] == 0.0 || iterations >= 200 {
                break;
            }
        }
        let seconds = started.elapsed().as_secs_f64() / f64::from(iterations);
        let algbw = bytes as f64 / seconds / 1e9;
        let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
        if rank != 0 {
            continue;
        }
        if args.json {
            println!(
                "{}",
                json!({"bench": "allreduce", "backend": "nccl", "size_bytes": bytes, "world": world,
                       "seconds": seconds, "algbw_gbps": algbw, "busbw_gbps": busbw, "exact": exact})
            );
        } else {
            println!(
                "{:>10} {:>12.3} {:>12.3} {:>12.3} {:>8}",
                format!("{}MB", bytes as f64 / (1 << 20) as f64),
                seconds * 1e3,
                algbw,
                busbw,
                exact
            );
        }
    }
    Ok(())
}

/// Whether a sum (rank r contributes r + 1 everywhere: k(k+1)/2 expected) and a broadcast of rank 0's
/// pattern come out exactly right on every element, checked on the GPU.
fn check_exact(comm: &mut dyn Collective, n: i64, device: Device, staging: &mut Vec<f32>) -> Result<bool> {
    let (rank, world) = (comm.rank() as f64, comm.world_size() as f64);
    let mut sum = Tensor::full([n], rank + 1.0, (Kind::Float, device));
    comm.all_reduce_sum_tensor(&mut sum, staging)?;
    let sum_ok = sum.eq(world * (world + 1.0) / 2.0).all().int64_value(&[]) == 1;
    let pattern = Tensor::arange(n, (Kind::Float, device)).remainder(251.0);
    let mut copy = if rank == 0.0 { pattern.copy() } else { Tensor::zeros([n], (Kind::Float, device)) };
    comm.broadcast_tensor(&mut copy, 0, staging)?;
    let broadcast_ok = copy.eq_tensor(&pattern).all().int64_value(&[]) == 1;
    Ok(sum_ok && broadcast_ok)
}

/// Host all-reduces on ranks that are threads of this process, each backend in turn, next to this machine's
/// memcpy bandwidth.
fn host(args: &AllreduceArgs, sizes: &[usize], backends: &[Transport]) -> Result<()> {
    let world = args.world.max(1);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let memcpy = memcpy_gbps(largest.max(1 << 20));
    let bus_factor = 2.0 * (world as f64 - 1.0) / world as f64;
    if !args.json {
        println!("all-reduce (sum, f32), world {world}: ranks are threads of one process (ring: TCP on 127.0.0.1; shm: one shared memfd)");
        println!("reference: memcpy {memcpy:.2} GB/s (one thread, {} MiB)", largest.max(1 << 20) >> 20);
        println!(
            "{:>8} {:>10} {:>12} {:>12} {:>12} {:>14} {:>10}",
            "backend", "size", "time (ms)", "algbw GB/s", "busbw GB/s", "memcpy GB/s", "of memcpy"
        );
    }
    for &backend in backends {
        let name = if backend == Transport::Shm { "shm" } else { "ring" };
        let timings = match backend {
            Transport::Shm => on_shared_memory(world, args.slot_elems, measure(sizes))?,
            _ => on_ring(world, measure(sizes))?,
        };
        for (&bytes, &seconds) in sizes.iter().zip(timings.iter()) {
            let algbw = bytes as f64 / seconds / 1e9;
            let busbw = algbw * bus_factor;
            if args.json {
                println!(
                    "{}",
                    json!({"bench": "allreduce", "backend": name, "size_bytes": bytes, "world": world, "seconds": seconds,
                           "algbw_gbps": algbw, "busbw_gbps": busbw, "memcpy_gbps": memcpy})
                );
            } else {
                println!(
                    "{:>8} {:>10} {:>12.3} {:>12.3} {:>12.3} {:>14.2} {:>9.0}%",
                    name,
                    format!("{}MB", bytes as f64 / (1 << 20) as f64),
                    seconds * 1e3,
                    algbw,
                    busbw,
                    memcpy,
                    busbw / memcpy * 100.0
                );
            }
        }
    }
    Ok(())
}

/// The seconds one all-reduce of each size takes on a rank (every rank runs the same iterations).
fn measure(sizes: &[usize]) -> impl Fn(&mut dyn Collective) -> Result<Vec<f64>> + Send + Sync + Clone + 'static {
    let sizes = sizes.to_vec();
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
                let mut go_on = [if iterations < 3 || started.elapsed() < Duration::from_secs(1) { 1.0 } else { 0.0 }];
                comm.broadcast(&mut go_on, 0)?;
                if go_on[0] == 0.0 || iterations >= 50 {
                    break;
                }
            }
            out.push(started.elapsed().as_secs_f64() / f64::from(iterations));
        }
        Ok(out)
    }
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
