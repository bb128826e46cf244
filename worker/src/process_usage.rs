//! What this rank process has used of its machine, as the kernel counts it (`getrusage`): CPU time and the
//! peak of its resident memory. Every metrics line carries both (as the CPU cores busy over the line's
//! window, and the peak so far), so a job's page shows what its ranks used without the agent having to
//! watch them. A system call, not a file: it works inside the sandbox, which grants no reads of `/proc`.

use std::time::Instant;

/// CPU time and peak memory of the process at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessUsage {
    /// User and system CPU seconds since the process started (all its threads).
    pub cpu_seconds: f64,
    /// The most memory the process has held resident, in bytes.
    pub peak_rss_bytes: u64,
    pub at: Instant,
}

impl ProcessUsage {
    /// Now; zeros where the kernel refuses (it does not).
    #[allow(unsafe_code)] // the one libc call here
    pub fn now() -> ProcessUsage {
        let at = Instant::now();
        // SAFETY: getrusage writes one `rusage` into the zeroed struct it is given and reads nothing else.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            (libc::getrusage(libc::RUSAGE_SELF, &mut usage) == 0).then_some(usage)
        };
        let Some(usage) = usage else { return ProcessUsage { cpu_seconds: 0.0, peak_rss_bytes: 0, at } };
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        ProcessUsage {
            cpu_seconds: seconds(usage.ru_utime) + seconds(usage.ru_stime),
            // Linux counts ru_maxrss in KiB
            peak_rss_bytes: (usage.ru_maxrss.max(0) as u64) * 1024,
            at,
        }
    }

    /// The CPU cores kept busy on average since `earlier` (1.0: one core all the time).
    pub fn cores_since(&self, earlier: &ProcessUsage) -> f64 {
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        if wall <= 0.0 {
            return 0.0;
        }
        ((self.cpu_seconds - earlier.cpu_seconds) / wall).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::ProcessUsage;

    #[test]
    fn busy_work_shows_as_a_busy_core_and_memory_touched_raises_the_peak() {
        let before = ProcessUsage::now();
        let deadline = before.at + std::time::Duration::from_millis(200);
        let mut x = 0u64;
        while std::time::Instant::now() < deadline {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let after = ProcessUsage::now();
        let cores = after.cores_since(&before);
        assert!((0.5..=1.5).contains(&cores), "one thread spinning keeps about one core busy: {cores}");
        assert!(after.peak_rss_bytes >= 64 << 20, "the 64 MiB touched count: {}", after.peak_rss_bytes);
    }
}
