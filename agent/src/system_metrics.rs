//! Each rank's use of its node over time, taken by the agent from the kernel's own counters (never from
//! the rank, whose output tenant code may shape): every [`SystemSampler::EVERY`], the CPU cores the process
//! kept busy since the previous sample and its resident memory, relayed as a `system` report beside the
//! rank's training metrics. A `system` report's iteration is the Unix second it was taken at, so samples
//! of every attempt stay apart under the store's (kind, iteration, rank) key and the store's downsampled
//! reads thin them by time.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// The kind of the agent's reports; a rank's own line of this kind is not relayed.
pub const KIND: &str = "system";

/// Seconds between two samples unless `RINGTRAIN_SYSTEM_METRICS_S` says otherwise (the tests sample every
/// second).
const DEFAULT_EVERY: Duration = Duration::from_secs(10);

/// A rank's CPU time and resident memory at one moment, read from `/proc/PID`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reading {
    cpu_seconds: f64,
    resident_bytes: u64,
    at: Instant,
}

/// Samples one rank process.
#[derive(Debug)]
pub struct SystemSampler {
    pid: u32,
    rank: i32,
    previous: Option<Reading>,
}

/// The clock ticks of `/proc/PID/stat`'s times: USER_HZ, which Linux fixes at 100 for this interface on
/// every architecture it runs ringtrain on (whatever the kernel's own HZ).
const TICKS_PER_SECOND: f64 = 100.0;

impl SystemSampler {
    /// How often ranks are sampled.
    pub fn every() -> Duration {
        std::env::var("RINGTRAIN_SYSTEM_METRICS_S")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|&s| s > 0)
            .map_or(DEFAULT_EVERY, Duration::from_secs)
    }

    pub fn new(pid: u32, rank: i32) -> SystemSampler {
        let mut sampler = SystemSampler { pid, rank, previous: None };
        // the first report needs a reading before it to measure the cores against
        sampler.previous = sampler.read();
        sampler
    }

    /// The report of this moment: `cpu_cores` (busy cores since the previous sample) and `resident_bytes`.
    /// None when the process is gone or its counters cannot be read.
    pub fn sample(&mut self) -> Option<Map<String, Value>> {
        let now = self.read()?;
        let previous = self.previous.replace(now)?;
        let wall = now.at.duration_since(previous.at).as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        let cores = ((now.cpu_seconds - previous.cpu_seconds) / wall).max(0.0);
        let second = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let Value::Object(report) = serde_json::json!({
            "kind": KIND,
            "rank": self.rank,
            "epoch": 0,
            "iteration": second,
            "cpu_cores": (cores * 1000.0).round() / 1000.0,
            "resident_bytes": now.resident_bytes,
        }) else {
            unreachable!("a JSON object")
        };
        Some(report)
    }

    fn read(&self) -> Option<Reading> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        Some(Reading {
            cpu_seconds: cpu_ticks(&stat)? as f64 / TICKS_PER_SECOND,
            resident_bytes: resident_kib(&status)? * 1024,
            at: Instant::now(),
        })
    }
}

/// User plus system time of a `/proc/PID/stat` line, in clock ticks. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted after its closing parenthesis: utime and stime are the
/// 14th and 15th fields, the 12th and 13th after it.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// `VmRSS` of a `/proc/PID/status`, in KiB.
fn resident_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_past_a_command_name_with_spaces() {
        let stat = "4242 (ring train) (x)) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 50 0 0 20 0 9 0 100 1 2 3";
        assert_eq!(cpu_ticks(stat), Some(300));
        assert_eq!(cpu_ticks("garbage"), None);
        assert_eq!(resident_kib("Name:\tringtrain\nVmRSS:\t  20480 kB\n"), Some(20480));
    }

    #[test]
    fn a_busy_process_shows_busy_cores_and_its_memory() {
        let mut sampler = SystemSampler::new(std::process::id(), 3);
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let report = sampler.sample().expect("this process's own counters");
        assert_eq!(report["kind"], KIND);
        assert_eq!(report["rank"], 3);
        let cores = report["cpu_cores"].as_f64().unwrap();
        assert!(cores > 0.3, "a spinning thread: {cores}");
        assert!(report["resident_bytes"].as_u64().unwrap() > 1 << 20);
        let second = report["iteration"].as_u64().unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        assert!(now.abs_diff(second) <= 1);
        assert!(SystemSampler::new(u32::MAX, 0).sample().is_none(), "no such process");
    }
}
