//! `ringtrain self-test`: does this node compute and sum right? A known matrix product in libtorch (the
//! library every rank trains with) and a known all-reduce over shared memory (how a node's ranks sum their
//! gradients), each compared with its exact answer. Node agents run it at start and while idle, and a node
//! that fails gets no new placements until a platform admin lifts its quarantine (`agent/src/health.rs`).
//!
//! `RINGTRAIN_SELF_TEST_FAULT=matmul|allreduce` corrupts that check's result before it is compared, as a
//! broken node's would be: for drills and for the tests of what follows a failure.

use std::process::ExitCode;

use anyhow::Result;
use ringtrain_protocol::{SelfTestCheck, SelfTestReport};
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// One JSON object instead of lines.
    #[arg(long)]
    json: bool,
}

/// The side of the matrices multiplied.
const SIDE: i64 = 128;
/// Floats summed by each of the all-reduce's ranks.
const SUMMED: usize = 1 << 20;
const RANKS: usize = 2;

pub fn run(args: Args) -> ExitCode {
    let fault = std::env::var("RINGTRAIN_SELF_TEST_FAULT").unwrap_or_default();
    let report = SelfTestReport {
        checks: vec![
            check("matmul", || matmul(fault == "matmul")),
            check("allreduce", || allreduce(fault == "allreduce")),
        ],
    };
    if args.json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        for c in &report.checks {
            println!("{:<10} {} {}", c.name, if c.passed { "passed" } else { "FAILED" }, c.detail);
        }
    }
    if report.failure().is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// A wrong result, as opposed to a check that could not run.
#[derive(Debug)]
struct Wrong(String);

impl std::fmt::Display for Wrong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Wrong {}

fn check(name: &str, run: impl FnOnce() -> Result<String>) -> SelfTestCheck {
    let started = std::time::Instant::now();
    let (passed, ran, detail) = match run() {
        Ok(measured) => (true, true, format!("{measured} in {:.0} ms", started.elapsed().as_secs_f64() * 1e3)),
        Err(err) => (false, err.downcast_ref::<Wrong>().is_some(), format!("{err:#}")),
    };
    SelfTestCheck { name: name.into(), passed, detail, ran }
}

/// A product of small integers, exact in float32: every entry compared with the sum computed in integers.
fn matmul(fault: bool) -> Result<String> {
    let value = |i: i64, j: i64, salt: i64| ((i * 7 + j * 3 + salt) % 11) - 5;
    let a: Vec<f32> = (0..SIDE * SIDE).map(|n| value(n / SIDE, n % SIDE, 1) as f32).collect();
    let b: Vec<f32> = (0..SIDE * SIDE).map(|n| value(n / SIDE, n % SIDE, 4) as f32).collect();
    let product = Tensor::from_slice(&a)
        .view([SIDE, SIDE])
        .matmul(&Tensor::from_slice(&b).view([SIDE, SIDE]))
        .to_kind(Kind::Float)
        .to_device(Device::Cpu);
    let mut got: Vec<f32> = Vec::<f32>::try_from(product.flatten(0, -1))?;
    if fault {
        got[SIDE as usize + 1] += 1.0;
    }
    for (n, &entry) in got.iter().enumerate() {
        let (i, j) = (n as i64 / SIDE, n as i64 % SIDE);
        let exact: i64 = (0..SIDE).map(|k| value(i, k, 1) * value(k, j, 4)).sum();
        anyhow::ensure!(
            entry == exact as f32,
            Wrong(format!("a {SIDE}×{SIDE} product of small integers is wrong at [{i}, {j}]: {entry}, not {exact}"))
        );
    }
    Ok(format!("a {SIDE}×{SIDE} product exact"))
}

/// Each of two ranks (threads over one shared segment, as a node's ranks are) adds its rank + 1 times
/// each index: every sum is known.
fn allreduce(fault: bool) -> Result<String> {
    let sums = super::bench::on_shared_memory(RANKS, 1 << 16, move |comm| {
        let rank = comm.rank();
        let mut values: Vec<f32> = (0..SUMMED).map(|i| ((i % 1000) * (rank + 1)) as f32).collect();
        comm.all_reduce_sum(&mut values)?;
        Ok(values)
    })?;
    let factor: usize = (1..=RANKS).sum();
    for (i, &sum) in sums.iter().enumerate() {
        let sum = if fault && i == 12_345 { sum + 1.0 } else { sum };
        let exact = (i % 1000) * factor;
        anyhow::ensure!(
            sum == exact as f32,
            Wrong(format!("the sum of {RANKS} ranks over shared memory is wrong at element {i}: {sum}, not {exact}"))
        );
    }
    Ok(format!("{RANKS} ranks' sum of {SUMMED} floats exact"))
}
