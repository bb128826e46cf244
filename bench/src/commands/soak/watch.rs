//! What the soak watches while it runs: the rank processes alive on each node (a node never runs more ranks
//! than it has slots, and one rank of a job never runs twice at once), and the API's latency as a user
//! sees it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use ringtrain_client::ApiClient;

use super::cluster::{rank_processes, RankProcess};

/// Samples the rank processes every 100 ms until stopped.
#[derive(Debug)]
pub struct BookingWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Bookings>,
}

/// What the booking watch saw.
#[derive(Debug, Default)]
pub struct Bookings {
    pub samples: usize,
    /// The most rank processes alive at once.
    pub most_ranks: usize,
    /// Each distinct double booking seen (a node over its slots, or one rank of one placement alive twice).
    pub violations: BTreeSet<String>,
    /// Jobs seen with ranks of two attempts alive at once: a failed attempt's surviving ranks exit once
    /// they notice the failure, while the next attempt may already start on other slots. Not a double
    /// booking (each holds its own slot), and the failed attempt's reports are refused; counted, not failed.
    pub attempt_overlaps: BTreeSet<String>,
}

impl BookingWatch {
    pub fn start(root: PathBuf, slots: u32) -> BookingWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Bookings::default();
            while !flag.load(Ordering::Relaxed) {
                let ranks = rank_processes(&root);
                seen.samples += 1;
                seen.most_ranks = seen.most_ranks.max(ranks.len());
                let (violations, overlaps) = double_bookings(&ranks, slots);
                seen.violations.extend(violations);
                seen.attempt_overlaps.extend(overlaps);
                std::thread::sleep(Duration::from_millis(100));
            }
            seen
        });
        BookingWatch { stop, thread }
    }

    pub fn finish(self) -> Bookings {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// The double bookings among ranks alive at the same moment: a node running more ranks than its slots, or
/// two processes of one rank of one attempt (two placements of it training at once: a preempted placement
/// still running when the next one resumes); and, apart, the jobs with ranks of two attempts alive.
pub fn double_bookings(ranks: &[RankProcess], slots: u32) -> (Vec<String>, Vec<String>) {
    let mut found = Vec::new();
    let mut per_node: BTreeMap<&str, Vec<&RankProcess>> = BTreeMap::new();
    let mut per_rank: BTreeMap<(&str, u32, u32), Vec<&RankProcess>> = BTreeMap::new();
    let mut attempts: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for rank in ranks {
        per_node.entry(&rank.node).or_default().push(rank);
        per_rank.entry((&rank.job, rank.attempt, rank.rank)).or_default().push(rank);
        attempts.entry(&rank.job).or_default().insert(rank.attempt);
    }
    for (node, running) in per_node {
        if running.len() > slots as usize {
            let jobs: Vec<String> = running.iter().map(|r| format!("{}/a{}/r{}", r.job, r.attempt, r.rank)).collect();
            found.push(format!("{node} ran {} ranks on {slots} slots at once: {}", running.len(), jobs.join(", ")));
        }
    }
    for ((job, attempt, rank), running) in per_rank {
        if running.len() > 1 {
            let nodes: Vec<&str> = running.iter().map(|r| r.node.as_str()).collect();
            found.push(format!("rank {rank} of job {job} (attempt {attempt}) ran twice at once: {}", nodes.join(", ")));
        }
    }
    let overlaps = attempts
        .into_iter()
        .filter(|(_, seen)| seen.len() > 1)
        .map(|(job, seen)| format!("{job}: attempts {seen:?}"))
        .collect();
    (found, overlaps)
}

/// Lists jobs as a user would, every 200 ms, timing each call.
#[derive(Debug)]
pub struct LatencyProbe {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Latency>>,
}

/// The API calls the probe made.
#[derive(Debug, Default, Clone)]
pub struct Latency {
    /// Seconds each answered call took.
    pub answered: Vec<f64>,
    /// Calls that got no answer (the server was down or did not answer in 30 s).
    pub unanswered: usize,
    /// Answers with a 5xx status.
    pub server_errors: usize,
}

impl Latency {
    /// The `q` quantile of the answered calls, in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.answered.is_empty() {
            return f64::NAN;
        }
        let mut sorted = self.answered.clone();
        sorted.sort_by(f64::total_cmp);
        let index = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
        sorted[index] * 1000.0
    }
}

impl LatencyProbe {
    pub fn start(clients: Vec<ApiClient>) -> LatencyProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Latency::default()));
        let (flag, record) = (stop.clone(), seen.clone());
        let task = tokio::spawn(async move {
            let mut turn = 0usize;
            while !flag.load(Ordering::Relaxed) {
                let client = &clients[turn % clients.len()];
                turn += 1;
                let started = Instant::now();
                let request = client.request(Method::GET, "/v1/jobs?limit=20").timeout(Duration::from_secs(30));
                // `send` turns an error status into Err with the status: an answer all the same.
                let answer = client.send(request).await;
                let took = started.elapsed().as_secs_f64();
                if let Ok(mut latency) = record.lock() {
                    match answer {
                        Ok(_) => latency.answered.push(took),
                        Err(e) if e.status.is_some() => {
                            latency.answered.push(took);
                            if e.status.is_some_and(|s| s.is_server_error()) {
                                latency.server_errors += 1;
                            }
                        }
                        Err(_) => latency.unanswered += 1,
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        LatencyProbe { stop, task, seen }
    }

    pub async fn finish(self) -> Latency {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.seen.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(node: &str, job: &str, attempt: u32, rank: u32) -> RankProcess {
        RankProcess { pid: 1, node: node.into(), job: job.into(), attempt, rank }
    }

    #[test]
    fn a_node_over_its_slots_and_a_rank_alive_twice_are_double_bookings() {
        let fine = [rank("node0", "a", 1, 0), rank("node0", "b", 1, 0), rank("node1", "a", 1, 1)];
        assert_eq!(double_bookings(&fine, 2), (vec![], vec![]));
        let crowded = [rank("node0", "a", 1, 0), rank("node0", "b", 1, 0), rank("node0", "c", 1, 0)];
        let (found, _) = double_bookings(&crowded, 2);
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("node0 ran 3 ranks on 2 slots"), "{found:?}");
        let twice = [rank("node0", "a", 2, 1), rank("node1", "a", 2, 1)];
        let (found, _) = double_bookings(&twice, 2);
        assert!(found[0].contains("rank 1 of job a (attempt 2) ran twice"), "{found:?}");
        // a failed attempt's last rank next to the new attempt: counted apart, not a double booking
        let (found, overlaps) = double_bookings(&[rank("node0", "a", 1, 0), rank("node1", "a", 2, 0)], 2);
        assert!(found.is_empty());
        assert_eq!(overlaps, ["a: attempts {1, 2}"]);
    }

    #[test]
    fn quantiles_are_taken_over_the_answered_calls() {
        let latency = Latency { answered: (1..=100).map(|i| f64::from(i) / 1000.0).collect(), ..Default::default() };
        assert_eq!(latency.quantile_ms(0.99), 99.0);
        assert_eq!(latency.quantile_ms(0.5), 50.0);
        assert!(Latency::default().quantile_ms(0.99).is_nan());
    }
}
