//! The peak resident memory of a stretch of work in this process, as the kernel counts it: `VmHWM` of
//! `/proc/self/status`, which writing `5` to `/proc/self/clear_refs` resets to what is resident now. The
//! model check measures an uploaded model's training steps with it, so that admission can refuse a job
//! whose per-worker batch cannot fit (a built-in model's need is computed from its layers instead).
//!
//! Freed memory is handed back to the kernel before each measure (`malloc_trim`), so that a step's
//! allocations show as pages made resident, not as reuse of pages an earlier step freed but the allocator
//! kept.

use std::fs::File;
use std::io::{self, Write};

/// Measures peaks; holds `/proc/self/clear_refs` open.
#[derive(Debug)]
pub struct PeakMeter {
    clear_refs: File,
}

impl PeakMeter {
    /// Opens `/proc/self/clear_refs`, or None where the kernel has none. Call it before the process
    /// confines itself: a process that is not dumpable has its `/proc` entries owned by root, and Landlock
    /// grants no write there.
    pub fn open() -> Option<PeakMeter> {
        let clear_refs = std::fs::OpenOptions::new().write(true).open("/proc/self/clear_refs").ok()?;
        Some(PeakMeter { clear_refs })
    }

    /// The open file as a confined process names what it keeps (`/proc/self/fd/N`): the sandbox closes every
    /// other descriptor it inherited or opened before confining itself.
    pub fn descriptor_path(&self) -> std::path::PathBuf {
        use std::os::fd::AsRawFd;
        std::path::PathBuf::from(format!("/proc/self/fd/{}", self.clear_refs.as_raw_fd()))
    }

    /// Runs `work`; its result and its peak: the most memory resident while it ran above what was resident
    /// when it began, in bytes.
    pub fn measure<T>(&mut self, work: impl FnOnce() -> T) -> io::Result<(T, u64)> {
        return_free_memory();
        self.clear_refs.write_all(b"5")?;
        let before = status_bytes("VmRSS:")?;
        let outcome = work();
        let peak = status_bytes("VmHWM:")?;
        Ok((outcome, peak.saturating_sub(before)))
    }
}

#[cfg(target_env = "gnu")]
#[allow(unsafe_code)] // the one libc call here
fn return_free_memory() {
    // SAFETY: malloc_trim only walks glibc's own arenas; it takes no pointer and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(target_env = "gnu"))]
fn return_free_memory() {}

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    parse_kib(&status, field).ok_or_else(|| io::Error::other(format!("/proc/self/status has no {field}")))
}

fn parse_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kib: u64 = line[field.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::{parse_kib, PeakMeter};

    #[test]
    fn the_status_fields_are_read_in_bytes() {
        let status = "Name:\tringtrain\nVmHWM:\t  20480 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(parse_kib(status, "VmHWM:"), Some(20 << 20));
        assert_eq!(parse_kib(status, "VmRSS:"), Some(1 << 20));
        assert_eq!(parse_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn a_peak_is_what_the_work_made_resident_even_after_it_freed_it() {
        let mut meter = PeakMeter::open().expect("this kernel has /proc/self/clear_refs");
        let size = 64 << 20;
        let ((), peak) = meter
            .measure(|| {
                let block = vec![1u8; size];
                std::hint::black_box(&block);
            })
            .unwrap();
        assert!(peak >= size as u64 * 9 / 10 && peak < size as u64 * 2, "64 MiB touched and freed: {peak}");
        // the next measure starts from what is resident now: the freed block does not count again
        let (_, small) = meter.measure(|| std::hint::black_box(vec![1u8; 1 << 20]).len()).unwrap();
        assert!(small < 16 << 20, "1 MiB: {small}");
    }
}
