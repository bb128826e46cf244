//! A rank's batches from a sharded split: the samples it will ask for, decoded and augmented ahead on a pool
//! of threads, handed out in the order asked. Memory is bounded by `ahead` batches and the shards' maps
//! (offsets only: a sample's bytes are read by offset when it is decoded), whatever the split's size.
//!
//! A shard that is missing, truncated, or holds what its index does not say, and a sample that does not
//! decode, fail the loader with the shard, the byte offset and the sample named: the trainer stops with
//! that error rather than skip the sample or wait.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use ringtrain_core::random::SplitMix64;

use crate::image::{centre_crop, crop_into, decode_for, random_resized_crop, size, whole, Scratch};
use crate::index::SplitIndex;
use crate::order::{augmentation_seed, locate};
use crate::shard::{Layout, ShardError, ShardMap};
use crate::stream::{first_use_order, Arrivals};

/// One split of a data set whose shards are files in one folder (a shared filesystem, or the node's cache).
#[derive(Debug)]
pub struct SplitReader {
    folder: PathBuf,
    split: SplitIndex,
    firsts: Vec<u64>,
    layout: Layout,
    /// The shards scanned so far, most recently used last; at most `max_open`.
    open: Mutex<VecDeque<(usize, Arc<ShardMap>)>>,
    max_open: usize,
    /// Set when the shards arrive while the rank reads (a bucket's, streamed by the node's agent): a shard
    /// not there yet is waited for rather than an error.
    arrivals: Option<Arrivals>,
}

/// An image as stored: its bytes, how they are encoded, its class.
pub type StoredSample = (Vec<u8>, crate::shard::ImageFormat, u32);

impl SplitReader {
    pub fn new(folder: PathBuf, split: SplitIndex, layout: Layout, max_open: usize) -> SplitReader {
        let firsts = split.first_samples();
        let open = Mutex::new(VecDeque::new());
        SplitReader { folder, split, firsts, layout, open, max_open: max_open.max(1), arrivals: None }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The bytes one sample takes in each part of a batch: its image's (3×size×size), or each of its
    /// tensors' (the inputs in the index's order, then the values).
    pub fn part_bytes(&self, size: u32) -> Vec<usize> {
        match &self.layout {
            Layout::Images { .. } => vec![3 * size as usize * size as usize],
            Layout::Tensors { .. } => self.layout.tensors().iter().map(|(_, t)| t.sample_bytes() as usize).collect(),
        }
    }

    /// A reader whose shards arrive while it reads (see [`crate::stream`]).
    pub fn streamed(mut self, arrivals: Arrivals) -> SplitReader {
        self.arrivals = Some(arrivals);
        self
    }

    /// Tells the agent streaming this reader's shards the order of the samples it will read next (a
    /// no-op for shards that are all there).
    pub fn will_read(&self, samples: impl IntoIterator<Item = u64>) {
        if let Some(arrivals) = &self.arrivals {
            arrivals.want(first_use_order(samples, &self.firsts));
        }
    }

    pub fn samples(&self) -> u64 {
        self.split.samples
    }

    /// Image `id` (numbered through the split) as stored.
    pub fn sample(&self, id: u64) -> Result<StoredSample, ShardError> {
        let (map, member) = self.sample_map(id)?;
        let bytes = map.read(member)?;
        let entry = &map.samples[member];
        let format = entry.format.ok_or_else(|| ShardError {
            shard: map.name.clone(),
            at: None,
            reason: format!("sample {} is not an image", entry.key),
        })?;
        Ok((bytes, format, entry.class))
    }

    /// The read members of sample `id` as stored (each input's `.npy`, then the values'), and its class.
    pub fn tensor_sample(&self, id: u64) -> Result<(Vec<Vec<u8>>, u32), ShardError> {
        let (map, member) = self.sample_map(id)?;
        let parts =
            (0..map.samples[member].members.len()).map(|m| map.read_member(member, m)).collect::<Result<_, _>>()?;
        Ok((parts, map.samples[member].class))
    }

    /// The map of the shard holding sample `id`, and the sample's place in it.
    fn sample_map(&self, id: u64) -> Result<(Arc<ShardMap>, usize), ShardError> {
        if id >= self.split.samples {
            return Err(ShardError {
                shard: "-".into(),
                at: None,
                reason: format!("no sample {id}: the split holds {}", self.split.samples),
            });
        }
        let (shard, member) = locate(&self.firsts, id);
        Ok((self.shard(shard)?, member as usize))
    }

    /// The scanned map of shard `i`, checked against the index.
    fn shard(&self, i: usize) -> Result<Arc<ShardMap>, ShardError> {
        if let Ok(mut open) = self.open.lock() {
            if let Some(at) = open.iter().position(|(shard, _)| *shard == i) {
                let entry = open.remove(at).expect("found above");
                let map = entry.1.clone();
                open.push_back(entry);
                // held open: its agent may let its file go (said once per order)
                if let Some(arrivals) = &self.arrivals {
                    arrivals.opened(i as u32);
                }
                return Ok(map);
            }
        }
        let info = &self.split.shards[i];
        let path = self.folder.join(&info.name);
        let fail = |at: Option<u64>, reason: String| ShardError { shard: info.name.clone(), at, reason };
        let file = loop {
            if let Some(arrivals) = &self.arrivals {
                arrivals.wait_for(&self.folder, &info.name, i as u32).map_err(|why| fail(None, why))?;
            }
            match std::fs::File::open(&path) {
                Ok(file) => break file,
                // streamed: the agent removed it between its arrival and this open (it may, for a shard no
                // rank was about to open): asked for again
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.arrivals.is_some() => continue,
                Err(e) => return Err(fail(None, format!("missing: {}: {e}", path.display()))),
            }
        };
        let bytes = file.metadata().map_err(|e| fail(None, format!("{}: {e}", path.display())))?.len();
        if bytes != info.bytes {
            return Err(fail(Some(bytes.min(info.bytes)), format!("is {bytes} bytes, the index says {}", info.bytes)));
        }
        let map = ShardMap::scan_file(file, &info.name, &self.layout)?;
        if map.samples.len() as u64 != info.samples {
            return Err(fail(None, format!("holds {} samples, the index says {}", map.samples.len(), info.samples)));
        }
        let map = Arc::new(map);
        if let Some(arrivals) = &self.arrivals {
            arrivals.opened(i as u32);
        }
        if let Ok(mut open) = self.open.lock() {
            if open.len() >= self.max_open {
                open.pop_front();
            }
            open.push_back((i, map.clone()));
        }
        Ok(map)
    }
}

/// How samples become a batch's bytes.
#[derive(Debug, Clone, Copy)]
pub struct Transform {
    /// Output side, in pixels (224 for ImageNet's ResNets).
    pub size: u32,
    /// What of each image is kept.
    pub crop: CropMode,
    /// The run's seed and the epoch: with the sample, they key its augmentation.
    pub seed: u64,
    pub epoch: u64,
}

/// What of an image a batch keeps, resized to its square.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CropMode {
    /// Goyal's training augmentation: a random-resized crop and a flip, keyed by seed, epoch and sample.
    RandomResized,
    /// The evaluation crop (ImageNet's): the shorter side resized to size·256/224, the centre kept.
    Centre,
    /// The whole image, for training and evaluation alike (`augment: none`): an image of the output's
    /// size is used as it is.
    Whole,
}

/// One batch of `labels.len()` samples in the order asked: its parts (see [`SplitReader::part_bytes`]),
/// sample after sample: the images (3×size×size bytes each, channel-major), or each tensor's elements.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub parts: Vec<Vec<u8>>,
    /// The classes (0 when the labels are values, which are the last part).
    pub labels: Vec<i64>,
    pub size: u32,
}

impl Batch {
    /// The images of a batch of images.
    pub fn images(&self) -> &[u8] {
        self.parts.first().map_or(&[], Vec::as_slice)
    }
}

/// Reads one sample as `transform` says into `out` (one buffer per part: the image, decoded, cropped and
/// resized; or each tensor's elements, checked against the index); returns its class.
pub fn load_sample(
    reader: &SplitReader,
    id: u64,
    transform: Transform,
    scratch: &mut Scratch,
    out: &mut [Vec<u8>],
) -> Result<u32, String> {
    let name = |reason: String| {
        let (shard, member) = locate(&reader.firsts, id);
        let info = &reader.split.shards[shard];
        format!("shard {} sample {member} (sample {id} of the split): {reason}", info.name)
    };
    if let Layout::Tensors { .. } = reader.layout {
        let (stored, class) = reader.tensor_sample(id).map_err(|e| e.to_string())?;
        for ((bytes, (member, spec)), out) in stored.iter().zip(reader.layout.tensors()).zip(out.iter_mut()) {
            let elements = crate::npy::decode(bytes, spec.dtype, &spec.shape);
            out.copy_from_slice(elements.map_err(|why| name(format!("{member} {why}")))?);
        }
        return Ok(class);
    }
    let out = &mut out[0];
    let (bytes, format, class) = reader.sample(id).map_err(|e| e.to_string())?;
    let (width, height) = size(&bytes, format).map_err(name)?;
    let crop = match transform.crop {
        CropMode::RandomResized => {
            let mut rng = SplitMix64::new(augmentation_seed(transform.seed, transform.epoch, id));
            random_resized_crop(width, height, &mut rng)
        }
        CropMode::Centre => centre_crop(width, height, transform.size),
        CropMode::Whole => whole(width, height),
    };
    let (image, within) = decode_for(&bytes, format, crop, transform.size).map_err(name)?;
    crop_into(&image, within, transform.size, scratch, out).map_err(name)?;
    Ok(class)
}

/// A batch being filled: its parts, its labels, and how many of its samples are still to come.
type Filling = (Vec<Vec<u8>>, Vec<i64>, usize);

/// What the threads and the consumer share.
#[derive(Debug, Default)]
struct State {
    /// The next sample to decode: (batch, position in it).
    next: (usize, usize),
    /// Batches handed out so far.
    consumed: usize,
    /// Batches being filled: their parts, labels and samples still to come.
    filling: HashMap<usize, Filling>,
    ready: BTreeMap<usize, Batch>,
    failed: Option<String>,
    stop: bool,
}

/// Batches decoded ahead on threads (see the module's doc).
#[derive(Debug)]
pub struct Batches {
    shared: Arc<(Mutex<State>, Condvar)>,
    threads: Vec<JoinHandle<()>>,
    total: usize,
}

impl Batches {
    /// Starts `threads` threads decoding `plan` (each batch's sample ids, in order), at most `ahead` batches
    /// beyond the one the consumer waits for.
    pub fn start(
        reader: Arc<SplitReader>,
        plan: Vec<Vec<u64>>,
        transform: Transform,
        threads: usize,
        ahead: usize,
    ) -> Batches {
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let plan = Arc::new(plan);
        let total = plan.len();
        let threads = (0..threads.max(1))
            .map(|_| {
                let (shared, plan, reader) = (shared.clone(), plan.clone(), reader.clone());
                std::thread::spawn(move || work(&shared, &plan, &reader, transform, ahead.max(1)))
            })
            .collect();
        Batches { shared, threads, total }
    }

    /// The next batch in the plan's order; `None` after the last.
    pub fn next_batch(&mut self) -> Option<Result<Batch, String>> {
        let (lock, ready) = &*self.shared;
        let mut state = lock.lock().ok()?;
        if state.consumed >= self.total {
            return None;
        }
        loop {
            if let Some(failed) = &state.failed {
                return Some(Err(failed.clone()));
            }
            let wanted = state.consumed;
            if let Some(batch) = state.ready.remove(&wanted) {
                state.consumed += 1;
                ready.notify_all();
                return Some(Ok(batch));
            }
            state = ready.wait(state).ok()?;
        }
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        if let Ok(mut state) = self.shared.0.lock() {
            state.stop = true;
        }
        self.shared.1.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One thread: take the next sample (not more than `ahead` batches beyond the consumer), decode it, put it
/// in its batch.
fn work(shared: &(Mutex<State>, Condvar), plan: &[Vec<u64>], reader: &SplitReader, transform: Transform, ahead: usize) {
    let (lock, changed) = shared;
    let part_bytes = reader.part_bytes(transform.size);
    let mut out: Vec<Vec<u8>> = part_bytes.iter().map(|&n| vec![0u8; n]).collect();
    let mut scratch = Scratch::default();
    loop {
        let (batch, position) = {
            let Ok(mut state) = lock.lock() else { return };
            loop {
                // an empty batch in the plan is ready as it is
                while state.next.0 < plan.len() && plan[state.next.0].is_empty() {
                    let empty = state.next.0;
                    let parts = vec![Vec::new(); part_bytes.len()];
                    state.ready.insert(empty, Batch { parts, labels: Vec::new(), size: transform.size });
                    state.next = (empty + 1, 0);
                    changed.notify_all();
                }
                if state.stop || state.failed.is_some() || state.next.0 >= plan.len() {
                    return;
                }
                if state.next.0 <= state.consumed + ahead {
                    break;
                }
                let Ok(next) = changed.wait(state) else { return };
                state = next;
            }
            let taken = state.next;
            state.next = if taken.1 + 1 < plan[taken.0].len() { (taken.0, taken.1 + 1) } else { (taken.0 + 1, 0) };
            taken
        };
        let loaded = load_sample(reader, plan[batch][position], transform, &mut scratch, &mut out);
        let Ok(mut state) = lock.lock() else { return };
        match loaded {
            Err(why) => state.failed = Some(why),
            Ok(class) => {
                let size = plan[batch].len();
                let (parts, labels, left) = state.filling.entry(batch).or_insert_with(|| {
                    (part_bytes.iter().map(|&n| vec![0u8; size * n]).collect(), vec![0; size], size)
                });
                for ((part, sample), &n) in parts.iter_mut().zip(&out).zip(&part_bytes) {
                    part[position * n..(position + 1) * n].copy_from_slice(sample);
                }
                labels[position] = i64::from(class);
                *left -= 1;
                if *left == 0 {
                    if let Some((parts, labels, _)) = state.filling.remove(&batch) {
                        state.ready.insert(batch, Batch { parts, labels, size: transform.size });
                    }
                }
            }
        }
        changed.notify_all();
    }
}
