//! A sharded data set (`shards:PATH`, issue 55) as a rank trains on it: never held whole. Each epoch the
//! rank hands its loader the batches it will ask for (every step of each of its virtual ranks, in the
//! trainer's order), and the loader decodes and augments them ahead on threads (`ringtrain_data::loader`).
//! The epoch's order of samples is `ringtrain_data::order`'s, a function of the seed and the epoch alone, cut
//! between the workers exactly as an in-memory data set's permutation is: the same samples in the same order
//! however many devices play the k workers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use ringtrain_data::index::{DatasetIndex, SplitIndex};
use ringtrain_data::loader::{Batch, Batches, CropMode, SplitReader, Transform};
use ringtrain_data::order::{EpochOrder, WINDOW_SHARDS};
use ringtrain_data::stream::Arrivals;
use tch::{Kind, Tensor};

use super::Normalizer;

/// Batches decoded ahead of the one the step waits for.
const AHEAD: usize = 4;

/// Shards a reader keeps scanned (their offsets): a window's and the next one's.
const OPEN_SHARDS: usize = 2 * WINDOW_SHARDS;

#[derive(Debug)]
pub struct Sharded {
    pub folder: PathBuf,
    pub index: DatasetIndex,
    train: Arc<SplitReader>,
    test: Arc<SplitReader>,
    train_len: usize,
    test_len: usize,
    /// The side of the images a batch holds.
    pub size: u32,
    /// Decoding threads.
    threads: usize,
    seed: u64,
    /// Goyal's random-resized crop and flip for training and the centre crop for tests; else the whole
    /// image for both.
    augment: bool,
    /// This epoch's batches, in the order the trainer asks for them, and the loader making them.
    epoch: Option<(u64, Vec<Vec<i64>>, usize, Batches)>,
    /// The GPU batches go to: they are made in page-locked (pinned) host memory, whose copy to the device
    /// runs at the link's full speed and without holding the host (see `to_device` in the parent module).
    pinned_for: Option<tch::Device>,
}

impl Sharded {
    /// Opens the data set in `folder` (its `index.json`, checked), keeping the first `train_samples` /
    /// `test_samples` samples when given.
    pub fn open(folder: &Path, options: &super::ShardOptions) -> Result<Sharded> {
        let super::ShardOptions { image_size: size, threads, seed, augment, train_samples, test_samples, streamed } =
            *options;
        let path = folder.join("index.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let index = DatasetIndex::from_json(&text).map_err(|problems| {
            let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
            anyhow::anyhow!("{}: {}", path.display(), all.join("; "))
        })?;
        let Some(test) = index.test.clone() else {
            bail!("{}: the data set has no test split (pack it with --test)", folder.display())
        };
        let classes = index.classes.len() as u32;
        let cut = |n: u64, limit: Option<u64>| limit.map_or(n, |l| l.min(n)) as usize;
        let (train_len, test_len) = (cut(index.train.samples, train_samples), cut(test.samples, test_samples));
        // `kept` samples are read, from the split's first shards: a shard past them is never asked for
        let reader = |name: &str, split: &SplitIndex, kept: usize| {
            let reader = SplitReader::new(folder.to_path_buf(), split.clone(), classes, OPEN_SHARDS);
            let shards = split.first_samples().iter().filter(|&&first| first < kept as u64).count();
            // a bucket's shards arrive while the rank trains, fetched by its node's agent
            Arc::new(if streamed { reader.streamed(Arrivals::new(name, shards)) } else { reader })
        };
        ensure!(train_len > 0 && test_len > 0, "{}: an empty split", folder.display());
        Ok(Sharded {
            folder: folder.to_path_buf(),
            train: reader("train", &index.train, train_len),
            test: reader("test", &test, test_len),
            index,
            train_len,
            test_len,
            size,
            threads: threads.max(1),
            seed,
            augment,
            epoch: None,
            pinned_for: None,
        })
    }

    pub fn train_len(&self) -> usize {
        self.train_len
    }

    /// Batches in pinned host memory from now on, when they go to a GPU.
    pub fn pin_for(&mut self, device: tch::Device) {
        self.pinned_for = device.is_cuda().then_some(device);
    }

    pub fn test_len(&self) -> usize {
        self.test_len
    }

    pub fn classes(&self) -> i64 {
        self.index.classes.len() as i64
    }

    /// The normalisation the data set's index gives (pixels in [0, 1]).
    pub fn normalizer(&self) -> Normalizer {
        let stats = &self.index.normalize;
        let view = |v: [f32; 3]| Tensor::from_slice(&v).view([1, 3, 1, 1]);
        Normalizer { scale: 1.0 / 255.0, mean: view(stats.mean), std: view(stats.std) }
    }

    /// The epoch's order of the (kept) training samples.
    pub fn epoch_order(&self, epoch: u64) -> Vec<i64> {
        let mut shard_samples = self.index.train.shard_samples();
        // train_samples keeps the first samples of the split: the shards that hold them, the last one cut
        let mut left = self.train_len as u64;
        for n in shard_samples.iter_mut() {
            *n = (*n).min(left);
            left -= *n;
        }
        shard_samples.retain(|&n| n > 0);
        EpochOrder::new(&shard_samples, WINDOW_SHARDS, self.seed, epoch).samples().to_vec()
    }

    /// Starts decoding `plan`, the epoch's batches in the order the trainer will ask for them.
    pub fn begin_epoch(&mut self, epoch: u64, plan: Vec<Vec<i64>>) {
        let ids: Vec<Vec<u64>> = plan.iter().map(|b| b.iter().map(|&s| s as u64).collect()).collect();
        self.train.will_read(ids.iter().flatten().copied());
        let crop = if self.augment { CropMode::RandomResized } else { CropMode::Whole };
        let transform = Transform { size: self.size, crop, seed: self.seed, epoch };
        let batches = Batches::start(self.train.clone(), ids, transform, self.threads, AHEAD);
        self.epoch = Some((epoch, plan, 0, batches));
    }

    /// The next training batch, which must be `indices` (the plan's next); as bytes and labels.
    pub fn next_train(&mut self, indices: &[i64]) -> Result<(Tensor, Tensor)> {
        let Some((epoch, plan, at, batches)) = self.epoch.as_mut() else {
            bail!("a training batch was asked for before the epoch began")
        };
        ensure!(
            plan.get(*at).is_some_and(|b| b.as_slice() == indices),
            "epoch {epoch}: batch {at} asked for other samples than the epoch's plan"
        );
        *at += 1;
        let batch = batches.next_batch().context("the epoch's batches ended early")?.map_err(anyhow::Error::msg)?;
        Ok(tensors(batch, self.pinned_for))
    }

    /// Test samples `start..start + len`, centre-cropped, decoded on the loader's threads.
    pub fn test_batch(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let ids = vec![(start as u64..(start + len) as u64).collect()];
        let crop = if self.augment { CropMode::Centre } else { CropMode::Whole };
        let transform = Transform { size: self.size, crop, seed: self.seed, epoch: 0 };
        let mut batches = Batches::start(self.test.clone(), ids, transform, self.threads, 1);
        let batch = batches.next_batch().context("no test batch")?.map_err(anyhow::Error::msg)?;
        Ok(tensors(batch, self.pinned_for))
    }
}

/// The batch's images (B×3×S×S, u8) and labels (B, i64), on the host: the images pinned for `pinned_for`
/// (as they are where pinning fails, e.g. no page-locked memory left).
fn tensors(batch: Batch, pinned_for: Option<tch::Device>) -> (Tensor, Tensor) {
    let (n, side) = (batch.labels.len() as i64, i64::from(batch.size));
    let images = Tensor::from_slice(&batch.images).view([n, 3, side, side]);
    let images = match pinned_for {
        Some(device) => images.f_pin_memory(device).unwrap_or(images),
        None => images,
    };
    let labels = Tensor::from_slice(&batch.labels).to_kind(Kind::Int64);
    (images, labels)
}
