//! A bucket's sharded data set streamed into this node's cache while its ranks train: each rank says which
//! shards it will open, in what order, and which it opened (`ringtrain_data::stream`, lines on its
//! stdout); the [`Stream`] of the data set fetches the shards the node's ranks will open next, at most
//! [`AHEAD`] per rank and split beyond what each has opened, [`FETCHES`] at a time, and removes the least
//! recently used shards no rank waits for when the next one would not fit the data set's share of the
//! cache. A shard a rank waits for now is fetched even past that bound (said once in the agent's log): a
//! cache too small for the ranks' windows slows a job, it does not stop it.
//!
//! Every shard is checked against its index's size and sha256 as it arrives, into `NAME.part-UUID`
//! renamed when whole, so a rank only ever sees whole shards. One that cannot be had (missing from the
//! bucket, other bytes than its index says) gets `NAME.failed` beside its place, holding why: the rank
//! fails naming it. A store that does not answer is tried again for about a minute first; if it still does
//! not, the file says the store is unavailable for now (`ringtrain_data::stream::UNAVAILABLE`): the rank's
//! error is then not a job error, the job is tried again, and the shard is tried afresh for the next
//! rank that reads it on this node.
//!
//! Over 450 lines with the unit tests of its planning, which need the stream's private state.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3;
use ringtrain_data::index::DatasetIndex;
use ringtrain_data::stream::{failure_file, StreamRequest, UNAVAILABLE};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::buckets::{fetch_shard, FetchError};
use crate::cache::{lock, CachedFile};

/// Shards fetched ahead of the last one a rank opened, per rank and split: two windows of the epoch's
/// order (`ringtrain_data::order::WINDOW_SHARDS`), so the next window is whole before the rank reaches it.
pub(crate) const AHEAD: usize = 2 * ringtrain_data::order::WINDOW_SHARDS;

/// Shards fetched at once: one S3 stream gets tens of MB/s, a node's link wants several.
const FETCHES: usize = 8;

/// Pauses between tries of a shard the store did not give (1, 2, 4, … s: about a minute in all).
const RETRIES: u32 = 6;

/// A reader's shards fetched past the bound when nothing else may go: what its loader threads wait for
/// at once. More `need`s than that (an uploaded model can print lines too) wait for room like the rest.
const URGENT_PER_READER: usize = 4;

/// One shard of one split: (split's place in [`Stream::splits`], shard number in it).
type ShardId = (usize, u32);

/// One data set streamed into one folder of this node's cache, shared by the node's ranks that read it.
pub(crate) struct Stream {
    url: String,
    prefix: String,
    store: AmazonS3,
    folder: PathBuf,
    /// The splits' names and shards (name, bytes, sha256), as the index gives them.
    splits: Vec<(String, Vec<ringtrain_data::ShardInfo>)>,
    /// The bytes this data set may keep in the cache.
    share: Share,
    state: Mutex<State>,
    wake: Arc<Notify>,
    /// The folder, pinned in the cache while the stream lives (fetches may outlive the last rank).
    _held: Option<CachedFile>,
}

impl Drop for Stream {
    /// Wakes the stream's task, which then finds no stream to serve and ends.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

#[derive(Default)]
struct State {
    /// The shards in the folder, with when they were last fetched or opened.
    present: HashMap<ShardId, Instant>,
    fetching: HashSet<ShardId>,
    /// Shards that cannot be had: missing, or not their index's (for good).
    failed: HashSet<ShardId>,
    /// Shards the store did not give after every try: tried afresh for the next rank that starts.
    unavailable: HashSet<ShardId>,
    /// Bytes of the shards present or being fetched.
    bytes: u64,
    readers: HashMap<u64, Reader>,
    next_reader: u64,
    fetched: (u64, u64),
    removed: u64,
    said_over_budget: bool,
}

/// What one rank said it will read.
#[derive(Default)]
struct Reader {
    /// Per split: the order it will open shards in, and which of them it opened.
    plans: HashMap<usize, Plan>,
    /// Shards it waits for now.
    needs: Vec<ShardId>,
}

#[derive(Default)]
struct Plan {
    order: Vec<u32>,
    opened: HashSet<u32>,
    /// How many of `order`'s first shards it opened.
    passed: usize,
}

impl Plan {
    /// The next `n` shards of the order it has not opened.
    fn upcoming(&self, n: usize) -> impl Iterator<Item = u32> + '_ {
        self.order[self.passed.min(self.order.len())..].iter().copied().filter(|s| !self.opened.contains(s)).take(n)
    }
}

/// The bytes of one data set's stream against the node's cache limit: the limit less what the cache's
/// other entries held when the stream started, less what the node's other streams hold now (each says
/// its bytes here as they change), so data sets streaming at once share the bound rather than each take it.
pub(crate) struct Share {
    max: Option<u64>,
    fixed: u64,
    streams: Arc<Mutex<HashMap<PathBuf, u64>>>,
    folder: PathBuf,
}

impl Share {
    pub fn new(max: Option<u64>, fixed: u64, streams: Arc<Mutex<HashMap<PathBuf, u64>>>, folder: PathBuf) -> Share {
        Share { max, fixed, streams, folder }
    }

    /// What this stream may hold now (None: no bound).
    fn budget(&self) -> Option<u64> {
        let streams = lock(&self.streams);
        let others: u64 = streams.iter().filter(|(folder, _)| **folder != self.folder).map(|(_, b)| *b).sum();
        self.max.map(|max| max.saturating_sub(self.fixed + others))
    }

    /// This stream holds `bytes` now.
    fn holds(&self, bytes: u64) {
        lock(&self.streams).insert(self.folder.clone(), bytes);
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        lock(&self.streams).remove(&self.folder);
    }
}

/// One rank's hold on a stream: what it says goes to [`RankStream::request`]; dropped when the rank ends.
pub(crate) struct RankStream {
    stream: Arc<Stream>,
    reader: u64,
    /// The folder, pinned in the cache for the rank.
    held: CachedFile,
}

impl RankStream {
    pub fn path(&self) -> &Path {
        self.held.path()
    }

    /// What the rank said about the shards it reads.
    pub fn request(&self, request: StreamRequest) {
        {
            let mut state = self.stream.lock();
            self.stream.apply(&mut state, self.reader, request);
        }
        self.stream.wake.notify_one();
    }
}

impl Drop for RankStream {
    fn drop(&mut self) {
        self.stream.lock().readers.remove(&self.reader);
        self.stream.wake.notify_one();
    }
}

/// What one look at the readers decided: shards to fetch, and files to remove first.
#[derive(Debug, Default, PartialEq)]
struct Work {
    fetch: Vec<ShardId>,
    remove: Vec<ShardId>,
    over_budget: bool,
}

impl Stream {
    /// The stream of `index` (`url`, objects under `prefix`) into `held`'s folder, which already holds the
    /// shards `present`, within its `share` of the cache.
    pub fn start(
        url: &str,
        prefix: &str,
        store: AmazonS3,
        held: CachedFile,
        index: &DatasetIndex,
        present: Vec<(String, u32)>,
        share: Share,
    ) -> Arc<Stream> {
        let splits: Vec<(String, Vec<ringtrain_data::ShardInfo>)> =
            index.splits().map(|(name, split)| (name.to_string(), split.shards.clone())).collect();
        let mut state = State::default();
        for (split, shard) in present {
            if let Some(at) = splits.iter().position(|(name, _)| *name == split) {
                state.bytes += splits[at].1[shard as usize].bytes;
                state.present.insert((at, shard), Instant::now());
            }
        }
        let stream = Arc::new(Stream {
            url: url.to_string(),
            prefix: prefix.to_string(),
            store,
            folder: held.path().to_path_buf(),
            splits,
            share,
            state: Mutex::new(state),
            wake: Arc::default(),
            _held: Some(held),
        });
        tokio::spawn(run(Arc::downgrade(&stream), stream.wake.clone()));
        stream
    }

    /// A new reader of this stream, for one rank, holding `held` (the folder) until it ends.
    pub fn reader(self: &Arc<Self>, held: CachedFile) -> RankStream {
        let mut state = self.lock();
        self.retry_unavailable(&mut state);
        let reader = state.next_reader;
        state.next_reader += 1;
        state.readers.insert(reader, Reader::default());
        RankStream { stream: self.clone(), reader, held }
    }

    /// A new rank (the job tried again, or another job) tries afresh what the store did not give: its
    /// failures are forgotten and their files removed.
    fn retry_unavailable(&self, state: &mut State) {
        for shard in std::mem::take(&mut state.unavailable) {
            let failure = self.folder.join(failure_file(self.name_of(shard)));
            if let Err(err) = std::fs::remove_file(&failure) {
                tracing::warn!(error = %err, file = %failure.display(), "cannot remove a shard's failure");
            }
        }
    }

    /// How many shards the folder holds now, of how many.
    pub fn held(&self) -> (usize, usize) {
        (self.lock().present.len(), self.splits.iter().map(|(_, s)| s.len()).sum())
    }

    /// What reader `reader` said. A request naming a split or shard the index does not have is dropped:
    /// the rank's own code never sends one, but an uploaded model can print lines too (TorchScript's
    /// `print`), and it must not make the agent index out of bounds.
    fn apply(&self, state: &mut State, reader: u64, request: StreamRequest) {
        let State { readers, present, .. } = state;
        let Some(reader) = readers.get_mut(&reader) else { return };
        let split_of = |name: &str| self.splits.iter().position(|(n, _)| n == name);
        let known = |split: usize, shard: u32| (shard as usize) < self.splits[split].1.len();
        match request {
            StreamRequest::Want { split, shards } => {
                let Some(split) = split_of(&split) else { return };
                if shards.iter().all(|&shard| known(split, shard)) {
                    reader.plans.insert(split, Plan { order: shards, ..Plan::default() });
                }
            }
            StreamRequest::Need { split, shard } => {
                let Some(split) = split_of(&split).filter(|&split| known(split, shard)) else { return };
                if !reader.needs.contains(&(split, shard)) {
                    reader.needs.push((split, shard));
                }
            }
            StreamRequest::Opened { split, shard } => {
                let Some(split) = split_of(&split).filter(|&split| known(split, shard)) else { return };
                reader.needs.retain(|need| *need != (split, shard));
                if let Some(used) = present.get_mut(&(split, shard)) {
                    *used = Instant::now();
                }
                let plan = reader.plans.entry(split).or_default();
                plan.opened.insert(shard);
                while plan.order.get(plan.passed).is_some_and(|s| plan.opened.contains(s)) {
                    plan.passed += 1;
                }
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn bytes_of(&self, (split, shard): ShardId) -> u64 {
        self.splits[split].1[shard as usize].bytes
    }

    fn name_of(&self, (split, shard): ShardId) -> &str {
        &self.splits[split].1[shard as usize].name
    }

    /// Decides what to fetch next and what to remove to make room (see the module's doc).
    fn plan(&self, state: &mut State) -> Work {
        let mut work = Work::default();
        // what the readers wait for now, then their next shards, a reader's first before any reader's second
        let urgent: Vec<ShardId> =
            state.readers.values().flat_map(|r| r.needs.iter().take(URGENT_PER_READER).copied()).collect();
        let mut lists: Vec<Vec<ShardId>> = Vec::new();
        for reader in state.readers.values() {
            for (&split, plan) in &reader.plans {
                lists.push(plan.upcoming(AHEAD).map(|s| (split, s)).collect());
            }
        }
        let mut ahead: Vec<ShardId> =
            state.readers.values().flat_map(|r| r.needs.iter().skip(URGENT_PER_READER).copied()).collect();
        for depth in 0..AHEAD {
            ahead.extend(lists.iter().filter_map(|list| list.get(depth).copied()));
        }
        let keep: HashSet<ShardId> = urgent.iter().chain(&ahead).copied().collect();
        let budget = self.share.budget();
        let mut seen = HashSet::new();
        let candidates = urgent.iter().map(|s| (*s, true)).chain(ahead.iter().map(|s| (*s, false)));
        for (shard, is_urgent) in candidates {
            if !seen.insert(shard) || state.present.contains_key(&shard) || state.fetching.contains(&shard) {
                continue;
            }
            if state.failed.contains(&shard) || state.unavailable.contains(&shard) {
                continue;
            }
            if state.fetching.len() >= FETCHES {
                break;
            }
            let bytes = self.bytes_of(shard);
            if let Some(budget) = budget {
                while state.bytes + bytes > budget {
                    // the least recently used shard no reader waits for or will open soon
                    let victim = state.present.iter().filter(|(s, _)| !keep.contains(s)).min_by_key(|(_, used)| **used);
                    let Some((&victim, _)) = victim else { break };
                    state.present.remove(&victim);
                    state.bytes -= self.bytes_of(victim);
                    state.removed += 1;
                    work.remove.push(victim);
                }
                if state.bytes + bytes > budget {
                    if !is_urgent {
                        break;
                    }
                    work.over_budget = true;
                }
            }
            state.fetching.insert(shard);
            state.bytes += bytes;
            work.fetch.push(shard);
        }
        self.share.holds(state.bytes);
        work
    }

    /// One shard into the folder, tried again while the store does not answer.
    async fn fetch(self: Arc<Self>, shard: ShardId) {
        let info = &self.splits[shard.0].1[shard.1 as usize];
        let (mut pause, mut attempt) = (Duration::from_secs(1), 1);
        let outcome = loop {
            match fetch_shard(&self.store, &self.url, &self.prefix, info, &self.folder).await {
                Err(FetchError::Unreadable(why)) if attempt <= RETRIES => {
                    tracing::warn!(url = %self.url, shard = %info.name, attempt, %why, "cannot read a shard; trying again");
                    tokio::time::sleep(pause).await;
                    (pause, attempt) = (pause * 2, attempt + 1);
                }
                outcome => break outcome,
            }
        };
        let mut state = self.lock();
        state.fetching.remove(&shard);
        match outcome {
            Ok(()) => {
                state.present.insert(shard, Instant::now());
                state.fetched.0 += 1;
                state.fetched.1 += info.bytes;
            }
            Err(err) => {
                state.bytes -= info.bytes;
                self.share.holds(state.bytes);
                let why = match err {
                    FetchError::Unreadable(why) => {
                        state.unavailable.insert(shard);
                        format!("{why} ({UNAVAILABLE}: the job is tried again)")
                    }
                    FetchError::NotTheIndexs(why) => {
                        state.failed.insert(shard);
                        why
                    }
                };
                drop(state);
                tracing::warn!(url = %self.url, shard = %info.name, %why, "a shard cannot be had: its readers fail");
                let failure = self.folder.join(failure_file(&info.name));
                if let Err(err) = crate::buckets::write_readable_sync(&failure, why.as_bytes()) {
                    tracing::warn!(error = %err, file = %failure.display(), "cannot tell the ranks a shard failed");
                }
            }
        }
    }

    /// Removes shards' files (no reader waits for them).
    fn remove(&self, shards: &[ShardId]) {
        for &shard in shards {
            let path = self.folder.join(self.name_of(shard));
            if let Err(err) = std::fs::remove_file(&path) {
                tracing::warn!(error = %err, file = %path.display(), "cannot remove a streamed shard");
            }
        }
    }
}

/// The stream's task: plans whenever a reader said something or a fetch ended, until no rank reads it.
async fn run(stream: Weak<Stream>, wake: Arc<Notify>) {
    let mut fetches = JoinSet::new();
    let mut said = Instant::now();
    loop {
        let notified = wake.notified();
        {
            let Some(stream) = stream.upgrade() else { return };
            let work = {
                let mut state = stream.lock();
                let work = stream.plan(&mut state);
                if work.over_budget && !state.said_over_budget {
                    state.said_over_budget = true;
                    tracing::warn!(url = %stream.url, budget = stream.share.budget(), "the ranks' next shards do not fit this data set's share of the cache: fetching the ones they wait for past it");
                }
                if said.elapsed() >= Duration::from_secs(30) && !work.fetch.is_empty() {
                    said = Instant::now();
                    tracing::info!(url = %stream.url, shards_fetched = state.fetched.0, bytes_fetched = state.fetched.1, shards_removed = state.removed, bytes_held = state.bytes, "streaming");
                }
                work
            };
            stream.remove(&work.remove);
            for shard in work.fetch {
                fetches.spawn(stream.clone().fetch(shard));
            }
        }
        tokio::select! {
            () = notified => {}
            Some(_) = fetches.join_next() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's planning alone, over one split of `shards` shards of `bytes` each.
    fn planner(shards: u32, bytes: u64, budget: Option<u64>) -> (Stream, State) {
        let infos = (0..shards)
            .map(|i| ringtrain_data::ShardInfo {
                name: format!("train-{i:06}.tar"),
                bytes,
                samples: 10,
                sha256: "0".repeat(64),
            })
            .collect();
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name("b")
            .with_region("us-east-1")
            .with_access_key_id("k")
            .with_secret_access_key("s")
            .build()
            .unwrap();
        let stream = Stream {
            url: "s3://b/p".into(),
            prefix: "p".into(),
            store,
            folder: PathBuf::from("/nonexistent"),
            splits: vec![("train".into(), infos)],
            share: Share::new(budget, 0, Arc::default(), PathBuf::from("/nonexistent")),
            state: Mutex::default(),
            wake: Arc::default(),
            _held: None,
        };
        (stream, State::default())
    }

    fn reader(state: &mut State, order: Vec<u32>, opened: &[u32]) -> u64 {
        let id = state.next_reader;
        state.next_reader += 1;
        let mut plan = Plan { order, ..Plan::default() };
        for &s in opened {
            plan.opened.insert(s);
        }
        while plan.order.get(plan.passed).is_some_and(|s| plan.opened.contains(s)) {
            plan.passed += 1;
        }
        state.readers.insert(id, Reader { plans: HashMap::from([(0, plan)]), needs: Vec::new() });
        id
    }

    fn arrived(state: &mut State, work: &Work) {
        for &shard in &work.fetch {
            state.fetching.remove(&shard);
            state.present.insert(shard, Instant::now());
        }
    }

    #[test]
    fn the_next_shards_of_each_reader_come_first_within_the_bound() {
        let (stream, mut state) = planner(40, 10, Some(55));
        reader(&mut state, (0..20).collect(), &[]);
        reader(&mut state, (20..40).collect(), &[]);
        let work = stream.plan(&mut state);
        // five shards fit: the readers' first, then their second, ...
        let mut fetched = work.fetch.iter().map(|s| s.1).collect::<Vec<_>>();
        fetched[..2].sort();
        assert_eq!(fetched[..2], [0, 20]);
        assert_eq!(work.fetch.len(), 5, "{work:?}");
        assert!(work.remove.is_empty() && !work.over_budget);
        arrived(&mut state, &work);
        // nothing fits more, and nothing present may go: every one is a reader's next
        assert_eq!(stream.plan(&mut state), Work::default());
    }

    #[test]
    fn opened_shards_make_room_and_a_needed_one_comes_past_the_bound() {
        let (stream, mut state) = planner(40, 10, Some(30));
        let a = reader(&mut state, (0..40).collect(), &[]);
        let work = stream.plan(&mut state);
        assert_eq!(work.fetch, [(0, 0), (0, 1), (0, 2)]);
        arrived(&mut state, &work);
        // the reader opened the first two: they may go, the oldest first, for the next two
        let plan = state.readers.get_mut(&a).unwrap().plans.get_mut(&0).unwrap();
        plan.opened.extend([0, 1]);
        plan.passed = 2;
        let mut work = stream.plan(&mut state);
        work.remove.sort();
        assert_eq!((work.fetch.clone(), work.remove.clone()), (vec![(0, 3), (0, 4)], vec![(0, 0), (0, 1)]));
        arrived(&mut state, &work);
        // a reader that waits for a shard gets it past the bound when nothing else may go
        state.readers.get_mut(&a).unwrap().needs.push((0, 30));
        let work = stream.plan(&mut state);
        assert_eq!(work.fetch, [(0, 30)]);
        assert!(work.over_budget && work.remove.is_empty(), "{work:?}");
    }

    #[test]
    fn requests_move_a_readers_plan_and_ones_naming_no_shard_of_the_index_are_dropped() {
        let (stream, mut state) = planner(10, 10, None);
        let a = reader(&mut state, Vec::new(), &[]);
        let split = |name: &str| name.to_string();
        stream.apply(&mut state, a, StreamRequest::Want { split: split("train"), shards: vec![4, 2, 7] });
        stream.apply(&mut state, a, StreamRequest::Opened { split: split("train"), shard: 4 });
        stream.apply(&mut state, a, StreamRequest::Need { split: split("train"), shard: 2 });
        let reader = &state.readers[&a];
        assert_eq!((reader.plans[&0].passed, reader.needs.clone()), (1, vec![(0, 2)]));
        // out of the index, or a split it does not have: nothing changes, nothing panics
        for request in [
            StreamRequest::Want { split: split("train"), shards: vec![1, 10] },
            StreamRequest::Need { split: split("train"), shard: u32::MAX },
            StreamRequest::Opened { split: split("train"), shard: 10 },
            StreamRequest::Need { split: split("validation"), shard: 0 },
        ] {
            stream.apply(&mut state, a, request);
        }
        let reader = &state.readers[&a];
        assert_eq!((reader.plans[&0].order.clone(), reader.needs.clone()), (vec![4, 2, 7], vec![(0, 2)]));
        assert_eq!(stream.plan(&mut state).fetch, [(0, 2), (0, 7)]);
    }

    #[test]
    fn streams_share_the_bound_and_a_reader_gets_few_shards_past_it() {
        let streams: Arc<Mutex<HashMap<PathBuf, u64>>> = Arc::default();
        let a = Share::new(Some(100), 10, streams.clone(), PathBuf::from("/cache/a"));
        let b = Share::new(Some(100), 10, streams.clone(), PathBuf::from("/cache/b"));
        a.holds(60);
        assert_eq!((a.budget(), b.budget()), (Some(90), Some(30)));
        drop(a);
        assert_eq!(b.budget(), Some(90), "a stream that ended holds nothing");
        // nothing fits: of the ten shards a reader says it waits for, four come past the bound
        let (stream, mut state) = planner(40, 10, Some(0));
        let r = reader(&mut state, Vec::new(), &[]);
        state.readers.get_mut(&r).unwrap().needs = (0..10).map(|s| (0, s)).collect();
        let work = stream.plan(&mut state);
        assert_eq!(work.fetch, [(0, 0), (0, 1), (0, 2), (0, 3)]);
        assert!(work.over_budget);
    }

    #[test]
    fn without_a_bound_a_reader_gets_its_window_ahead_and_no_more() {
        let (stream, mut state) = planner(100, 10, None);
        reader(&mut state, (0..100).collect(), &[]);
        let work = stream.plan(&mut state);
        assert_eq!(work.fetch.len(), FETCHES);
        arrived(&mut state, &work);
        let work = stream.plan(&mut state);
        arrived(&mut state, &work);
        let mut all = 0;
        while !stream.plan(&mut state).fetch.is_empty() {
            all += 1;
            assert!(all < 10);
        }
        assert_eq!(state.present.len() + state.fetching.len(), AHEAD);
    }

    #[test]
    fn a_shard_the_store_did_not_give_is_tried_afresh_for_the_next_rank_and_a_damaged_one_never() {
        let dir = tempfile::tempdir().unwrap();
        let (mut stream, mut state) = planner(4, 100, None);
        stream.folder = dir.path().to_path_buf();
        let id = reader(&mut state, vec![0, 1, 2, 3], &[]);
        state.readers.get_mut(&id).unwrap().needs = vec![(0, 1), (0, 2)];
        state.unavailable.insert((0, 1));
        state.failed.insert((0, 2));
        std::fs::write(dir.path().join(failure_file("train-000001.tar")), "unavailable").unwrap();
        let work = stream.plan(&mut state);
        assert!(!work.fetch.contains(&(0, 1)) && !work.fetch.contains(&(0, 2)), "{:?}", work.fetch);
        for shard in &work.fetch {
            state.fetching.remove(shard);
        }
        state.bytes = 0;
        stream.retry_unavailable(&mut state);
        assert!(!dir.path().join(failure_file("train-000001.tar")).exists(), "the rank would fail on it again");
        let work = stream.plan(&mut state);
        assert!(work.fetch.contains(&(0, 1)) && !work.fetch.contains(&(0, 2)), "{:?}", work.fetch);
    }
}
