//! Hang detection: a rank whose training stops advancing is named, with what its process was doing, and
//! ended, so its placement fails and the job resumes (from its newest checkpoint) instead of holding its
//! devices for hours in a collective that will never complete.
//!
//! Progress is a new iteration report from the rank, or CPU time its agent measures (at least
//! [`BUSY_CORES`] of a core since the previous sample: loading, evaluating, writing a checkpoint). A rank
//! counts as hung once it has shown neither for its bound: the larger of the floor (`--hang-floor-s`,
//! default [`DEFAULT_FLOOR`]) and [`STEPS_IN_BOUND`] times the median time between its reports (so a slow
//! model is not cut short); a rank that prints reports it does not train can keep only its own job alive.
//! A stopped process (SIGSTOP, a debugger) is hung after its bound or [`STOPPED_FOR`], whichever is
//! shorter: before the ring's 120 s timeout fails its peers, which wait on it, with a vaguer reason. Any
//! other at twice its bound, which leaves the stopped rank of the placement (on this node or another) to be
//! named first: its peers' silence is its doing.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The shortest time without progress that counts as a hang unless the agent is told otherwise: longer
/// than any start-up, evaluation or checkpoint of the models here that shows no CPU time.
pub const DEFAULT_FLOOR: Duration = Duration::from_secs(300);
/// The longest a rank's process may be stopped: no training stops its own process.
pub const STOPPED_FOR: Duration = Duration::from_secs(30);
/// Median report intervals in a bound.
const STEPS_IN_BOUND: u32 = 20;
/// A sample this busy is progress (a rank blocked on a socket or a lock uses next to nothing).
const BUSY_CORES: f64 = 0.1;
/// Report intervals kept for the median.
const KEPT_INTERVALS: usize = 32;

/// What the kernel says a process is doing: its state letter and the kernel function it sleeps in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessState {
    pub state: char,
    pub wchan: String,
}

impl ProcessState {
    /// The process `pid`'s, from `/proc`; None once it is gone.
    pub fn of(pid: u32) -> Option<ProcessState> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?.chars().next()?;
        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        Some(ProcessState { state, wchan: wchan.trim().to_string() })
    }

    pub fn stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
    }

    /// In words, for the job's events.
    pub fn describe(&self) -> String {
        let waits_in = |what: &str| match self.wchan.as_str() {
            "" | "0" => what.to_string(),
            wchan => format!("{what} (in the kernel's {wchan})"),
        };
        match self.state {
            'T' => "its process is stopped by a signal (SIGSTOP, or a job-control stop)".into(),
            't' => "its process is stopped under a debugger".into(),
            'D' => waits_in("its process is in uninterruptible I/O"),
            'R' => "its process runs, but reports no iteration".into(),
            'Z' => "its process has exited but was not reaped".into(),
            _ => waits_in("its process sleeps, waiting on a peer, a lock or its data"),
        }
    }
}

/// Watches one rank's progress.
#[derive(Debug)]
pub struct Watchdog {
    floor: Duration,
    last_progress: Instant,
    last_report: Option<(i64, Instant)>,
    intervals: VecDeque<Duration>,
}

impl Watchdog {
    pub fn new(floor: Duration, now: Instant) -> Watchdog {
        Watchdog { floor, last_progress: now, last_report: None, intervals: VecDeque::new() }
    }

    /// The rank reported `iteration`.
    pub fn reported(&mut self, iteration: i64, now: Instant) {
        if let Some((previous, at)) = self.last_report {
            if iteration <= previous {
                return;
            }
            if self.intervals.len() == KEPT_INTERVALS {
                self.intervals.pop_front();
            }
            self.intervals.push_back(now.duration_since(at));
        }
        self.last_report = Some((iteration, now));
        self.last_progress = now;
    }

    /// A sample found the rank `cores` busy since the previous one.
    pub fn sampled(&mut self, cores: f64, now: Instant) {
        if cores >= BUSY_CORES {
            self.last_progress = now;
        }
    }

    /// How long the rank may show no progress: the floor, or longer for a rank whose reports come slowly.
    pub fn bound(&self) -> Duration {
        let mut sorted: Vec<Duration> = self.intervals.iter().copied().collect();
        sorted.sort();
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
        self.floor.max(median * STEPS_IN_BOUND)
    }

    /// Why the rank counts as hung at `now`, given what its process is doing; None while it does not.
    pub fn verdict(&self, now: Instant, process: &ProcessState) -> Option<String> {
        let silent = now.duration_since(self.last_progress);
        let bound = self.bound();
        let allowed = if process.stopped() { bound.min(STOPPED_FOR) } else { bound * 2 };
        if silent < allowed {
            return None;
        }
        let after =
            self.last_report.map_or("before its first iteration".to_string(), |(i, _)| format!("after iteration {i}"));
        Some(format!(
            "hung: no progress for {} s {after} (its bound is {} s: the larger of {} s and {STEPS_IN_BOUND} times its \
             median time between reports); {}",
            silent.as_secs(),
            bound.as_secs(),
            self.floor.as_secs(),
            process.describe()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(letter: char) -> ProcessState {
        ProcessState { state: letter, wchan: if letter == 'S' { "sk_wait_data".into() } else { String::new() } }
    }

    #[test]
    fn a_stopped_rank_is_hung_at_its_bound_and_a_waiting_one_at_twice_it() {
        let start = Instant::now();
        let mut dog = Watchdog::new(Duration::from_secs(10), start);
        for i in 0..10 {
            dog.reported(i, start + Duration::from_millis(100 * i as u64));
        }
        let last = start + Duration::from_millis(900);
        assert_eq!(dog.bound(), Duration::from_secs(10), "20 steps of 0.1 s are under the floor");
        assert_eq!(dog.verdict(last + Duration::from_secs(9), &state('T')), None);
        let stopped = dog.verdict(last + Duration::from_secs(11), &state('T')).expect("stopped past its bound");
        assert!(stopped.contains("after iteration 9") && stopped.contains("stopped by a signal"), "{stopped}");
        assert_eq!(dog.verdict(last + Duration::from_secs(11), &state('S')), None, "a waiting peer gets longer");
        let waiting = dog.verdict(last + Duration::from_secs(21), &state('S')).unwrap();
        assert!(waiting.contains("sk_wait_data"), "{waiting}");
    }

    #[test]
    fn busy_cores_and_reports_are_progress_and_slow_steps_lengthen_the_bound() {
        let start = Instant::now();
        let mut dog = Watchdog::new(Duration::from_secs(5), start);
        dog.sampled(0.9, start + Duration::from_secs(8));
        assert_eq!(dog.verdict(start + Duration::from_secs(12), &state('T')), None, "busy at 8 s");
        dog.sampled(0.01, start + Duration::from_secs(9));
        assert!(dog.verdict(start + Duration::from_secs(14), &state('T')).is_some(), "idle since 8 s");
        for i in 0..5 {
            dog.reported(i, start + Duration::from_secs(2 * i as u64));
        }
        assert_eq!(dog.bound(), Duration::from_secs(40), "20 steps of 2 s");
        // an iteration reported again (a resumed rank's repeat) is no progress
        dog.reported(3, start + Duration::from_secs(30));
        assert!(dog.verdict(start + Duration::from_secs(49), &state('S')).is_none(), "a waiting rank: 80 s");
        assert!(dog.verdict(start + Duration::from_secs(89), &state('S')).is_some());
        // a stopped process gets no more than STOPPED_FOR, whatever its bound
        assert!(dog.verdict(start + Duration::from_secs(8 + 29), &state('T')).is_none());
        assert!(dog.verdict(start + Duration::from_secs(8 + 31), &state('T')).is_some());
    }

    #[test]
    fn this_process_is_read_as_not_stopped() {
        // (its main thread waits for the test's thread: running or sleeping)
        let me = ProcessState::of(std::process::id()).unwrap();
        assert!(matches!(me.state, 'R' | 'S'), "{me:?}");
        assert!(!me.stopped());
        assert!(ProcessState::of(u32::MAX).is_none());
    }
}
