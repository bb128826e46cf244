//! A sharded data set (`shards:PATH`) as a rank trains on it: never held whole. Each epoch the
//! rank hands its loader the batches it will ask for (every step of each of its virtual ranks, in the
//! trainer's order), and the loader decodes and augments them ahead on threads (`ringtrain_data::loader`).
//! The epoch's order of samples is `ringtrain_data::order`'s, a function of the seed and the epoch alone, cut
//! between the workers exactly as an in-memory data set's permutation is: the same samples in the same order
//! however many devices play the k workers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use ringtrain_data::index::{DatasetIndex, SampleKind, SplitIndex};
use ringtrain_data::loader::{Batch, Batches, CropMode, SplitReader, Transform};
use ringtrain_data::npy::Dtype;
use ringtrain_data::order::{EpochOrder, WINDOW_SHARDS};
use ringtrain_data::shard::Layout;
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
    /// A data set of named tensors: which of the index's inputs the model takes, in its order.
    selected: Vec<usize>,
}

impl Sharded {
    /// Opens the data set in `folder` (its `index.json`, checked), keeping the first `train_samples` /
    /// `test_samples` samples when given.
    pub fn open(folder: &Path, options: &super::ShardOptions) -> Result<Sharded> {
        let super::ShardOptions {
            image_size: size, threads, seed, augment, train_samples, test_samples, streamed, ..
        } = *options;
        let path = folder.join("index.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let index = DatasetIndex::from_json(&text).map_err(|problems| {
            let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
            anyhow::anyhow!("{}: {}", path.display(), all.join("; "))
        })?;
        let Some(test) = index.test.clone() else {
            bail!("{}: the data set has no test split (pack it with --test)", folder.display())
        };
        let layout = Layout::of(&index);
        let selected = select_inputs(&index, options.inputs.as_deref())?;
        let cut = |n: u64, limit: Option<u64>| limit.map_or(n, |l| l.min(n)) as usize;
        let (train_len, test_len) = (cut(index.train.samples, train_samples), cut(test.samples, test_samples));
        // `kept` samples are read, from the split's first shards: a shard past them is never asked for
        let reader = |name: &str, split: &SplitIndex, kept: usize| {
            let reader = SplitReader::new(folder.to_path_buf(), split.clone(), layout.clone(), OPEN_SHARDS);
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
            selected,
        })
    }

    /// Whether the samples are named tensors (for uploaded models) rather than images.
    pub fn holds_tensors(&self) -> bool {
        self.index.kind == SampleKind::Tensors
    }

    /// The labels' values per sample, when they are values rather than classes.
    pub fn value_outputs(&self) -> Option<i64> {
        self.index.values.as_ref().map(|shape| shape.iter().product::<u64>() as i64)
    }

    /// The shape of one sample of the first input the model takes.
    pub fn sample_shape(&self) -> Vec<i64> {
        match self.selected.first() {
            Some(&i) if self.holds_tensors() => self.index.inputs[i].shape.iter().map(|&d| d as i64).collect(),
            _ => vec![3, i64::from(self.size), i64::from(self.size)],
        }
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

    /// The normalisation the data set's index gives (pixels in [0, 1]); none for named tensors, which go
    /// to the model as stored.
    pub fn normalizer(&self) -> Option<Normalizer> {
        let stats = self.index.normalize.as_ref()?;
        let view = |v: [f32; 3]| Tensor::from_slice(&v).view([1, 3, 1, 1]);
        Some(Normalizer { scale: 1.0 / 255.0, mean: view(stats.mean), std: view(stats.std) })
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

    /// The next training batch, which must be `indices` (the plan's next): its inputs (images as bytes,
    /// or the model's named tensors) and labels.
    pub fn next_train(&mut self, indices: &[i64]) -> Result<(Vec<Tensor>, Tensor)> {
        let Some((epoch, plan, at, batches)) = self.epoch.as_mut() else {
            bail!("a training batch was asked for before the epoch began")
        };
        ensure!(
            plan.get(*at).is_some_and(|b| b.as_slice() == indices),
            "epoch {epoch}: batch {at} asked for other samples than the epoch's plan"
        );
        *at += 1;
        let batch = batches.next_batch().context("the epoch's batches ended early")?.map_err(anyhow::Error::msg)?;
        self.tensors(batch)
    }

    /// Test samples `start..start + len`, centre-cropped, decoded on the loader's threads.
    pub fn test_batch(&self, start: usize, len: usize) -> Result<(Vec<Tensor>, Tensor)> {
        let ids = vec![(start as u64..(start + len) as u64).collect()];
        let crop = if self.augment { CropMode::Centre } else { CropMode::Whole };
        let transform = Transform { size: self.size, crop, seed: self.seed, epoch: 0 };
        let mut batches = Batches::start(self.test.clone(), ids, transform, self.threads, 1);
        let batch = batches.next_batch().context("no test batch")?.map_err(anyhow::Error::msg)?;
        self.tensors(batch)
    }

    /// The batch's inputs and labels, on the host, pinned for `pinned_for` (as they are where pinning
    /// fails, e.g. no page-locked memory left): the images (B×3×S×S, u8), or the model's named tensors
    /// (B×shape, as stored); the classes (B, i64) or values (B or B×M, f32).
    fn tensors(&self, batch: Batch) -> Result<(Vec<Tensor>, Tensor)> {
        let n = batch.labels.len() as i64;
        let pinned = |t: Tensor| match self.pinned_for {
            Some(device) => t.f_pin_memory(device).unwrap_or(t),
            None => t,
        };
        let shaped = |bytes: &[u8], dtype: Dtype, shape: &[u64]| -> Result<Tensor> {
            let dims: Vec<i64> = std::iter::once(n).chain(shape.iter().map(|&d| d as i64)).collect();
            Tensor::f_from_data_size(bytes, &dims, kind(dtype)).with_context(|| format!("a batch of {dims:?}"))
        };
        if !self.holds_tensors() {
            let side = i64::from(batch.size);
            let images = Tensor::from_slice(batch.images()).view([n, 3, side, side]);
            return Ok((vec![pinned(images)], Tensor::from_slice(&batch.labels).to_kind(Kind::Int64)));
        }
        let inputs = self.index.inputs.as_slice();
        let chosen = self
            .selected
            .iter()
            .map(|&i| shaped(&batch.parts[i], inputs[i].dtype, &inputs[i].shape).map(pinned))
            .collect::<Result<Vec<Tensor>>>()?;
        let labels = match (&self.index.values, batch.parts.get(inputs.len())) {
            (Some(shape), Some(values)) => shaped(values, Dtype::F32, shape)?,
            _ => Tensor::from_slice(&batch.labels).to_kind(Kind::Int64),
        };
        Ok((chosen, labels))
    }
}

/// The index's inputs the model takes, in the model's order: `model_inputs` (an uploaded model's names), or
/// the one input of a data set of one (a model of one plain input `x`). None for images.
fn select_inputs(index: &DatasetIndex, model_inputs: Option<&[String]>) -> Result<Vec<usize>> {
    if index.kind == SampleKind::Images {
        return Ok(Vec::new());
    }
    let held: Vec<&str> = index.inputs.iter().map(|i| i.name.as_str()).collect();
    match model_inputs {
        Some(names) => names
            .iter()
            .map(|name| {
                held.iter().position(|h| h == name).with_context(|| {
                    format!(
                        "the model takes input {name}, which the data set does not hold (it holds {})",
                        held.join(", ")
                    )
                })
            })
            .collect(),
        None if held.len() == 1 => Ok(vec![0]),
        None => bail!(
            "the data set holds named inputs ({}): train an uploaded model that names the ones it takes",
            held.join(", ")
        ),
    }
}

/// libtorch's kind for a stored dtype.
fn kind(dtype: Dtype) -> Kind {
    match dtype {
        Dtype::F64 => Kind::Double,
        Dtype::F32 => Kind::Float,
        Dtype::F16 => Kind::Half,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::I16 => Kind::Int16,
        Dtype::I8 => Kind::Int8,
        Dtype::U8 => Kind::Uint8,
        Dtype::Bool => Kind::Bool,
    }
}
