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
        // spins until the kernel has counted 200 ms of CPU time (on a loaded machine that takes longer than
        // 200 ms of wall time, so the share of a core is only bounded above)
        let before = ProcessUsage::now();
        let give_up = before.at + std::time::Duration::from_secs(20);
        let mut x = 0u64;
        while ProcessUsage::now().cpu_seconds - before.cpu_seconds < 0.2 && std::time::Instant::now() < give_up {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let after = ProcessUsage::now();
        assert!(after.cpu_seconds - before.cpu_seconds >= 0.2, "the spinning was not counted: {after:?}");
        let cores = after.cores_since(&before);
        assert!(cores > 0.0 && cores <= 1.5, "one thread spinning keeps at most about one core busy: {cores}");
        assert!(after.peak_rss_bytes >= 64 << 20, "the 64 MiB touched count: {}", after.peak_rss_bytes);
    }
}
