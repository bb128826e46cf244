//! Shards that arrive while the rank trains (`shards:s3://…`): the node's agent fetches a bucket's shards
//! into its cache in the order the rank says it will open them, a bounded number ahead of it, and removes
//! shards no rank of the node still waits for to keep the cache under its bound. A shard the rank opened
//! may go at once: the rank holds its file open (`ShardMap`), and Unix keeps an open file's bytes.
//!
//! Rank and agent talk through the rank's stdout, the lines the agent already reads for metrics: the rank
//! says which shards of a split it will open, in order ([`StreamRequest::Want`]: each training epoch's
//! first-use order; a test split from the shard it misses on), which one it waits for now
//! ([`StreamRequest::Need`]) and which it opened ([`StreamRequest::Opened`]). The agent answers only with
//! files: a shard appears whole (checked against its index, then renamed into place), or `NAME.failed`
//! appears holding why it cannot (missing from the bucket, other bytes than its index says), which the
//! rank fails with, naming the shard.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What a rank tells its agent about one split's shards (numbered as in the split's index).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamRequest {
    /// The rank will open these shards in this order (replacing what it said of this split before).
    Want { split: String, shards: Vec<u32> },
    /// The rank waits for this shard now: it goes before every other.
    Need { split: String, shard: u32 },
    /// The rank opened this shard: its file may be removed.
    Opened { split: String, shard: u32 },
}

/// One line of the rank's stdout to its agent: `{"stream": {...}}` (no metric report has the key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamLine {
    pub stream: StreamRequest,
}

impl StreamLine {
    /// The request a line of the rank's stdout holds, if it is one.
    pub fn parse(line: &str) -> Option<StreamRequest> {
        if !line.starts_with("{\"stream\"") {
            return None;
        }
        serde_json::from_str::<StreamLine>(line).ok().map(|line| line.stream)
    }
}

/// The file beside a shard's place that says why the agent cannot bring it.
pub fn failure_file(shard: &str) -> String {
    format!("{shard}.failed")
}

/// Said in a failure that another attempt may not meet (the store did not answer, a shard did not arrive
/// in time): the rank's error is then not a job error, and the job is tried again (its `max_restarts`),
/// where a shard that is missing or not its index's fails it for good.
pub const UNAVAILABLE: &str = "the store is unavailable for now";

/// Whether a loader's error is one another attempt may not meet (see [`UNAVAILABLE`]).
pub fn is_transient(error: &str) -> bool {
    error.contains(UNAVAILABLE)
}

/// How long a rank waits for one shard before it gives up (the agent retries a store that does not answer
/// for about a minute first).
pub const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// How often a waiting rank says so on stderr (the job's logs).
const SAY_WAITING_EVERY: Duration = Duration::from_secs(30);

/// The rank's side for one split: says what it will open, and waits for shards to arrive.
#[derive(Debug)]
pub struct Arrivals {
    split: String,
    shards: u32,
    /// Whether the rank said the order it will read in ([`Arrivals::want`]); else it reads the split in
    /// order (a test split), and says so from each shard it misses on.
    ordered: AtomicBool,
    /// The shards said opened since the last order: each is said once per order (a shard the reader
    /// still holds open is "opened" again in the next epoch, so its agent knows it may let the file go).
    said_opened: Mutex<HashSet<u32>>,
}

impl Arrivals {
    /// `split` ("train" or "test") of `shards` shards.
    pub fn new(split: &str, shards: usize) -> Arrivals {
        Arrivals {
            split: split.to_string(),
            shards: shards as u32,
            ordered: AtomicBool::new(false),
            said_opened: Mutex::default(),
        }
    }

    /// Tells the agent the order in which the rank will open shards (first use first).
    pub fn want(&self, order: Vec<u32>) {
        self.ordered.store(true, Ordering::Relaxed);
        if let Ok(mut said) = self.said_opened.lock() {
            said.clear();
        }
        say(StreamRequest::Want { split: self.split.clone(), shards: order });
    }

    /// Tells the agent shard `shard` is open (once per order).
    pub fn opened(&self, shard: u32) {
        if self.said_opened.lock().map(|mut said| said.insert(shard)).unwrap_or(true) {
            say(StreamRequest::Opened { split: self.split.clone(), shard });
        }
    }

    /// Waits until shard `shard`, file `name`, is in `folder`; the agent's reason when it cannot bring it.
    pub fn wait_for(&self, folder: &Path, name: &str, shard: u32) -> Result<(), String> {
        let path = folder.join(name);
        if path.exists() {
            return Ok(());
        }
        // a split read in order (a test split): the rest of it follows this shard
        if !self.ordered.load(Ordering::Relaxed) {
            if let Ok(mut said) = self.said_opened.lock() {
                said.clear();
            }
            say(StreamRequest::Want { split: self.split.clone(), shards: (shard..self.shards).collect() });
        }
        let need = || say(StreamRequest::Need { split: self.split.clone(), shard });
        need();
        let (started, mut said) = (Instant::now(), Instant::now());
        let failure = folder.join(failure_file(name));
        loop {
            if path.exists() {
                return Ok(());
            }
            if let Ok(why) = std::fs::read_to_string(&failure) {
                return Err(why.trim().to_string());
            }
            let waited = started.elapsed();
            if waited >= ARRIVAL_TIMEOUT {
                return Err(format!(
                    "shard {name} did not arrive from the bucket in {} minutes ({UNAVAILABLE})",
                    ARRIVAL_TIMEOUT.as_secs() / 60
                ));
            }
            if said.elapsed() >= SAY_WAITING_EVERY {
                said = Instant::now();
                eprintln!(
                    "waiting for shard {name}, which this node's agent is fetching ({} s so far)",
                    waited.as_secs()
                );
                // said again: the request shares stdout with the model's own prints, which could garble it
                need();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One request on stdout, as one line (`println!` holds stdout's lock for the whole line, so the trainer's
/// metric lines and the loader threads' requests never interleave).
fn say(request: StreamRequest) {
    if let Ok(line) = serde_json::to_string(&StreamLine { stream: request }) {
        println!("{line}");
    }
}

/// The order in which a plan of sample ids (numbered through the split) first uses its shards.
pub fn first_use_order(plan: impl IntoIterator<Item = u64>, first_samples: &[u64]) -> Vec<u32> {
    let mut seen = HashSet::new();
    let mut order = Vec::new();
    for sample in plan {
        let (shard, _) = crate::order::locate(first_samples, sample);
        if seen.insert(shard) {
            order.push(shard as u32);
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_one_line_the_agent_tells_from_a_metric_report() {
        let request = StreamRequest::Want { split: "train".into(), shards: vec![3, 1, 2] };
        let line = serde_json::to_string(&StreamLine { stream: request.clone() }).unwrap();
        assert_eq!(line, r#"{"stream":{"want":{"split":"train","shards":[3,1,2]}}}"#);
        assert_eq!(StreamLine::parse(&line), Some(request));
        assert_eq!(StreamLine::parse(r#"{"iteration":3,"loss":0.5}"#), None);
        assert_eq!(StreamLine::parse(r#"{"stream":{"drop":{}}}"#), None);
    }

    #[test]
    fn a_plan_first_uses_its_shards_in_order() {
        let firsts = [0, 10, 20, 30];
        assert_eq!(first_use_order([25, 3, 27, 12, 4, 39], &firsts), [2, 0, 1, 3]);
    }

    #[test]
    fn a_waiting_rank_gets_the_shard_or_the_agents_reason() {
        let dir = tempfile::tempdir().unwrap();
        let arrivals = Arrivals::new("train", 4);
        std::fs::write(dir.path().join("a.tar"), b"x").unwrap();
        assert_eq!(arrivals.wait_for(dir.path(), "a.tar", 0), Ok(()));
        let folder = dir.path().to_path_buf();
        let agent = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::write(folder.join("b.tar"), b"x").unwrap();
            std::fs::write(
                folder.join(failure_file("c.tar")),
                "shard c.tar of s3://b/p has sha256 1, its index says 2\n",
            )
            .unwrap();
        });
        assert_eq!(arrivals.wait_for(dir.path(), "b.tar", 1), Ok(()));
        agent.join().unwrap();
        let why = arrivals.wait_for(dir.path(), "c.tar", 2).unwrap_err();
        assert_eq!(why, "shard c.tar of s3://b/p has sha256 1, its index says 2");
    }
}
