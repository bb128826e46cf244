//! Training and test data: loaders (IDX, safetensors, synthetic; sharded data sets streamed, in
//! [`sharded`]), normalisation, and the per-epoch shuffle.
//!
//! Over 450 lines with its tests (476 of code): the in-memory sources share the normalisation and the
//! shuffle they feed, and the tests check them together.

pub mod idx;
pub mod sharded;
pub mod shuffle;

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use ringtrain_core::dataset::{DatasetRef, FASHION_MNIST_TEST_SIZE};
use tch::{Device, Kind, Tensor};

use shuffle::SplitMix64;

/// The most bytes of samples and labels a GPU rank keeps on its device by default (see
/// [`Dataset::place_on`]): Fashion-MNIST as stored is 55 MB, so 4 GiB leaves nearly all of even a small
/// GPU to the model while covering the data sets a job uploads whole.
pub const ON_DEVICE_MAX_BYTES: u64 = 4 << 30;

/// Where Debian's `dataset-fashion-mnist` installs Fashion-MNIST.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// One split of a dataset: its inputs (one `x`, N×C×H×W or N×D, u8 or f32, for the built-in models; or the
/// named inputs of an uploaded model, each [N, ...], in the model's order) and labels `y`: class indices
/// (N, i64) or values to regress (N or N×M, f32).
#[derive(Debug)]
pub struct Split {
    pub inputs: Vec<Tensor>,
    pub y: Tensor,
}

impl Split {
    /// A split of one input `x` and class labels (the built-in models' data).
    pub fn new(x: Tensor, y: Tensor) -> Result<Split> {
        ensure!(y.dim() == 1, "labels must be one-dimensional, got shape {:?}", y.size());
        ensure!(x.dim() == 2 || x.dim() == 4, "inputs must be N×D or N×C×H×W, got shape {:?}", x.size());
        ensure!(x.size()[0] == y.size()[0], "{} inputs but {} labels", x.size()[0], y.size()[0]);
        ensure!(matches!(x.kind(), Kind::Uint8 | Kind::Float), "inputs must be u8 or f32, got {:?}", x.kind());
        Ok(Split { inputs: vec![x], y: y.to_kind(Kind::Int64) })
    }

    /// A split of named inputs (as stored: floats, integers, masks) and labels that are class indices
    /// (integers) or values (floats).
    pub fn named(inputs: Vec<(String, Tensor)>, y: Tensor) -> Result<Split> {
        let n = y.size().first().copied().unwrap_or(0);
        ensure!(
            y.dim() == 1 || (y.dim() == 2 && !is_integer(y.kind())),
            "y must be [N] (or [N, M] values), got {:?}",
            y.size()
        );
        for (name, t) in &inputs {
            ensure!(t.dim() >= 1 && t.size()[0] == n, "{name} has {:?} samples for {n} labels", t.size().first());
        }
        let y = if is_integer(y.kind()) { y.to_kind(Kind::Int64) } else { y.to_kind(Kind::Float) };
        Ok(Split { inputs: inputs.into_iter().map(|(_, t)| t).collect(), y })
    }

    pub fn len(&self) -> usize {
        self.y.size()[0] as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Samples `start..start + len` of every tensor.
    fn narrow(&self, start: i64, len: i64) -> Split {
        Split { inputs: self.inputs.iter().map(|t| t.narrow(0, start, len)).collect(), y: self.y.narrow(0, start, len) }
    }

    /// The first `n` samples (all when `n` is None or larger).
    pub fn truncated(self, n: Option<u64>) -> Split {
        match n {
            Some(n) if (n as usize) < self.len() => self.narrow(0, n as i64),
            _ => self,
        }
    }

    /// The bytes its tensors hold, as stored.
    fn bytes(&self) -> u64 {
        let of = |t: &Tensor| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64;
        self.inputs.iter().map(of).sum::<u64>() + of(&self.y)
    }

    /// The same split on `device`, as stored (u8 images stay u8: a quarter of the bytes of f32).
    fn copied_to(&self, device: Device) -> Split {
        Split { inputs: self.inputs.iter().map(|t| t.to_device(device)).collect(), y: self.y.to_device(device) }
    }

    /// Whether the labels are values to regress rather than class indices.
    fn has_values(&self) -> bool {
        !is_integer(self.y.kind())
    }
}

fn is_integer(kind: Kind) -> bool {
    matches!(kind, Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8)
}

/// What the labels ask of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Labels {
    /// Class indices 0..classes: cross-entropy, reported as the error rate.
    Classes(i64),
    /// Values, `outputs` per sample: mse or huber, reported as the root mean squared error.
    Values { outputs: i64 },
}

/// Per-channel normalisation computed from the training inputs: x' = (x * scale - mean) / std, with
/// scale = 1/255 for u8 data. The same numbers on every rank, since every rank loads the same files.
#[derive(Debug)]
pub struct Normalizer {
    pub(crate) scale: f64,
    pub(crate) mean: Tensor,
    pub(crate) std: Tensor,
}

impl Normalizer {
    /// Per-channel mean and standard deviation, accumulated in f64 over chunks of samples so that fitting
    /// on 60k images costs a few MB, not a double-precision copy of the whole split per rank.
    fn fit(x: &Tensor) -> Normalizer {
        const CHUNK: i64 = 4096;
        let scale = if x.kind() == Kind::Uint8 { 1.0 / 255.0 } else { 1.0 };
        let image = x.dim() == 4;
        // reduce over every dimension but the channel (images) or over everything (flat data)
        let dims: Vec<i64> = if image { vec![0, 2, 3] } else { vec![0, 1] };
        let n = x.size()[0];
        let (mut sum, mut squares, mut count) = (None::<Tensor>, None::<Tensor>, 0.0);
        let mut start = 0;
        while start < n {
            let len = CHUNK.min(n - start);
            let chunk = x.narrow(0, start, len).to_kind(Kind::Double) * scale;
            let s = chunk.sum_dim_intlist(dims.as_slice(), false, Kind::Double);
            let q = chunk.square().sum_dim_intlist(dims.as_slice(), false, Kind::Double);
            sum = Some(sum.map_or(s.shallow_clone(), |acc| acc + &s));
            squares = Some(squares.map_or(q.shallow_clone(), |acc| acc + &q));
            count += (chunk.numel() as i64 / s.numel() as i64) as f64;
            start += len;
        }
        let count = count.max(1.0);
        let zeros = || Tensor::zeros([1], (Kind::Double, Device::Cpu));
        let mean = sum.unwrap_or_else(zeros) / count;
        let variance = (squares.unwrap_or_else(zeros) / count - mean.square()).clamp_min(0.0);
        let std = variance.sqrt().clamp_min(1e-6);
        let shape: Vec<i64> = if image { vec![1, -1, 1, 1] } else { vec![1, -1] };
        Normalizer {
            scale,
            mean: mean.to_kind(Kind::Float).view(shape.as_slice()),
            std: std.to_kind(Kind::Float).view(shape.as_slice()),
        }
    }

    /// Normalised f32 inputs on `device`: `x` goes there as stored (u8 images: a quarter of the bytes of
    /// f32) and is converted and normalised there, so a GPU rank does no per-sample work on the host.
    pub fn apply(&self, x: &Tensor, device: Device) -> Tensor {
        let xf = to_device(x, device).to_kind(Kind::Float) * self.scale;
        (xf - self.mean.to_device(device)) / self.std.to_device(device)
    }

    /// Keeps the per-channel statistics on `device` (no copy per batch when they are already there).
    fn move_to(&mut self, device: Device) {
        self.mean = self.mean.to_device(device);
        self.std = self.std.to_device(device);
    }
}

/// `x` on `device`: from pinned host memory without waiting for the copy (it is queued on the device's
/// stream before the kernels that read it, so the host goes on to the next batch meanwhile).
fn to_device(x: &Tensor, device: Device) -> Tensor {
    let asynchronous = device.is_cuda() && x.device() == Device::Cpu && x.is_pinned(device);
    x.to_device_(device, x.kind(), asynchronous, false)
}

/// A loaded dataset with its normalisation.
#[derive(Debug)]
pub struct Dataset {
    samples: Samples,
    pub labels: Labels,
    /// Fitted on the one input `x` of the built-in models' data (a sharded data set's comes with its
    /// index); named inputs go to the model as stored.
    pub normalizer: Option<Normalizer>,
}

/// Where the samples are.
#[derive(Debug)]
enum Samples {
    /// Both splits whole, in memory (or on the GPU: [`Dataset::place_on`]).
    Memory { train: Split, test: Split },
    /// Streamed from shards, a few batches ahead.
    Sharded(Box<sharded::Sharded>),
}

impl Dataset {
    /// Loads `dataset`, keeping the first `train_samples` / `test_samples` when given. Normalisation is fitted
    /// on the whole training split (before truncation), so it does not depend on the slice used.
    pub fn load(dataset: &DatasetRef, train_samples: Option<u64>, test_samples: Option<u64>) -> Result<Dataset> {
        let (train, test) = match dataset {
            DatasetRef::Shards { path } => {
                let options = ShardOptions { train_samples, test_samples, ..Default::default() };
                return Self::load_shards(Path::new(path), &options);
            }
            DatasetRef::FashionMnist => idx::load_dir(Path::new(FASHION_MNIST_DIR)).with_context(|| {
                format!("Fashion-MNIST is read from {FASHION_MNIST_DIR}: install Debian's dataset-fashion-mnist")
            })?,
            DatasetRef::Idx { path } => idx::load_dir(Path::new(path))?,
            DatasetRef::Synthetic { train_size } => synthetic(*train_size as usize),
            DatasetRef::Uploaded(id) => {
                bail!("dataset {id} is an upload: pass its file with --dataset-file (the agent does this for you)")
            }
        };
        Self::from_splits(train, test, train_samples, test_samples)
    }

    /// Loads a safetensors file: `x` and `y`, and optionally `x_test` and `y_test`; without them the last
    /// 10% of the samples are held out as the test split. With `inputs` (an uploaded model's), the inputs are
    /// the tensors `x.NAME` (and `x_test.NAME`) in that order instead of `x`.
    pub fn load_safetensors(
        path: &Path,
        inputs: Option<&[String]>,
        train_samples: Option<u64>,
        test_samples: Option<u64>,
    ) -> Result<Dataset> {
        let tensors = Tensor::read_safetensors(path).with_context(|| format!("cannot read {}", path.display()))?;
        let take = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t.shallow_clone());
        let split = |x: &str, y: &str| -> Result<Option<Split>> {
            let Some(labels) = take(y) else { return Ok(None) };
            match inputs {
                None => match take(x) {
                    Some(samples) => Ok(Some(Split::new(samples, labels)?)),
                    None => bail!("{} must hold tensors named {x} and {y}", path.display()),
                },
                Some(names) => {
                    let named = names
                        .iter()
                        .map(|name| {
                            let key = format!("{x}.{name}");
                            take(&key)
                                .map(|t| (key.clone(), t))
                                .with_context(|| format!("{} has no {key}", path.display()))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(Some(Split::named(named, labels)?))
                }
            }
        };
        let Some(all) = split("x", "y")? else { bail!("{} has no labels y", path.display()) };
        let (train, test) = match split("x_test", "y_test")? {
            Some(test) => (all, test),
            None => {
                let n = all.len() as i64;
                let held_out = ringtrain_core::dataset::held_out_test_samples(n as u64) as i64;
                ensure!(n > held_out, "{} has too few samples ({n}) to hold out a test split", path.display());
                (all.narrow(0, n - held_out), all.narrow(n - held_out, held_out))
            }
        };
        Self::from_splits(train, test, train_samples, test_samples)
    }

    /// Opens a sharded data set (streamed: see [`sharded`]).
    pub fn load_shards(folder: &Path, options: &ShardOptions) -> Result<Dataset> {
        let shards = sharded::Sharded::open(folder, options)?;
        let labels = match shards.value_outputs() {
            Some(outputs) => Labels::Values { outputs },
            None => Labels::Classes(shards.classes()),
        };
        let normalizer = shards.normalizer();
        Ok(Dataset { samples: Samples::Sharded(Box::new(shards)), labels, normalizer })
    }

    /// Whether the samples are named tensors in shards, which only an uploaded model takes.
    pub fn holds_named_tensors(&self) -> bool {
        matches!(&self.samples, Samples::Sharded(shards) if shards.holds_tensors())
    }

    fn from_splits(
        train: Split,
        test: Split,
        train_samples: Option<u64>,
        test_samples: Option<u64>,
    ) -> Result<Dataset> {
        ensure!(!train.is_empty(), "the training split is empty");
        ensure!(train.has_values() == test.has_values(), "y and y_test must both be classes or both be values");
        let labels = if train.has_values() {
            let outputs = |s: &Split| s.y.size().get(1).copied().unwrap_or(1);
            ensure!(outputs(&train) == outputs(&test), "y and y_test have different numbers of values per sample");
            Labels::Values { outputs: outputs(&train) }
        } else {
            let min_label = train.y.min().int64_value(&[]).min(test.y.min().int64_value(&[]));
            ensure!(min_label >= 0, "labels must be >= 0 (found {min_label})");
            Labels::Classes(train.y.max().int64_value(&[]).max(test.y.max().int64_value(&[])) + 1)
        };
        // the built-in models' one input is normalised; named inputs are the model's business
        let normalizer = match train.inputs.as_slice() {
            [x] if matches!(x.kind(), Kind::Uint8 | Kind::Float) && (x.dim() == 2 || x.dim() == 4) => {
                Some(Normalizer::fit(x))
            }
            _ => None,
        };
        let samples = Samples::Memory { train: train.truncated(train_samples), test: test.truncated(test_samples) };
        Ok(Dataset { samples, labels, normalizer })
    }

    /// The number of classes (0 when the labels are values).
    pub fn classes(&self) -> i64 {
        match self.labels {
            Labels::Classes(c) => c,
            Labels::Values { .. } => 0,
        }
    }

    /// Prepares batches for a rank training on `device`: the normalisation's statistics go there, and so do both
    /// splits, as stored, when `device` is a GPU and they fit in `on_device_max_bytes`. Then a step gathers its batch
    /// with an index select on the device, and nothing but the indices crosses from the host: no per-step copy of the
    /// samples for the step to wait on, which is what a prefetching loader would hide. Returns whether the splits are
    /// on the device (a sharded data set's never are: its batches are decoded on the host, ahead of the step).
    pub fn place_on(&mut self, device: Device, on_device_max_bytes: u64) -> bool {
        if let Some(n) = &mut self.normalizer {
            n.move_to(device);
        }
        if let Samples::Sharded(shards) = &mut self.samples {
            shards.pin_for(device);
        }
        let Samples::Memory { train, test } = &mut self.samples else { return false };
        if !device.is_cuda() || train.bytes() + test.bytes() > on_device_max_bytes {
            return false;
        }
        *train = train.copied_to(device);
        *test = test.copied_to(device);
        true
    }

    pub fn train_len(&self) -> usize {
        match &self.samples {
            Samples::Memory { train, .. } => train.len(),
            Samples::Sharded(shards) => shards.train_len(),
        }
    }

    pub fn test_len(&self) -> usize {
        match &self.samples {
            Samples::Memory { test, .. } => test.len(),
            Samples::Sharded(shards) => shards.test_len(),
        }
    }

    /// The splits held whole in memory; `None` for a sharded data set.
    pub fn in_memory(&self) -> Option<(&Split, &Split)> {
        match &self.samples {
            Samples::Memory { train, test } => Some((train, test)),
            Samples::Sharded(_) => None,
        }
    }

    /// The shape of one sample of the first input (C×H×W or D).
    pub fn sample_shape(&self) -> Vec<i64> {
        match &self.samples {
            Samples::Memory { train, .. } => train.inputs[0].size()[1..].to_vec(),
            Samples::Sharded(shards) => shards.sample_shape(),
        }
    }

    /// The order of the training samples in `epoch`: one permutation from (seed, epoch) for data in
    /// memory, the shard-window order for a sharded data set; cut between the workers the same way.
    pub fn epoch_order(&self, seed: u64, epoch: u64) -> Vec<i64> {
        match &self.samples {
            Samples::Memory { train, .. } => shuffle::epoch_permutation(seed, epoch, train.len()),
            Samples::Sharded(shards) => shards.epoch_order(epoch),
        }
    }

    /// Tells a sharded data set the batches this rank will ask for in `epoch`, in order, so that it decodes
    /// them ahead; nothing to do for data in memory.
    pub fn begin_epoch(&mut self, epoch: u64, plan: impl FnOnce() -> Vec<Vec<i64>>) {
        if let Samples::Sharded(shards) = &mut self.samples {
            shards.begin_epoch(epoch, plan());
        }
    }

    fn prepare(&self, inputs: Vec<Tensor>, device: Device) -> Vec<Tensor> {
        match &self.normalizer {
            Some(n) => inputs.iter().map(|x| n.apply(x, device)).collect(),
            None => inputs.iter().map(|x| to_device(x, device)).collect(),
        }
    }

    /// A (normalised) batch of training samples and their labels.
    pub fn train_batch(&mut self, indices: &[i64], device: Device) -> Result<(Vec<Tensor>, Tensor)> {
        let (inputs, y) = match &mut self.samples {
            Samples::Memory { train, .. } => {
                // gathered where the split is (the device when `place_on` put it there), then moved if it is not
                let idx = Tensor::from_slice(indices).to_device(train.y.device());
                (train.inputs.iter().map(|x| x.index_select(0, &idx)).collect(), train.y.index_select(0, &idx))
            }
            Samples::Sharded(shards) => shards.next_train(indices)?,
        };
        Ok((self.prepare(inputs, device), y.to_device(device)))
    }

    /// A (normalised) contiguous range of test samples and their labels.
    pub fn test_batch(&self, start: usize, len: usize, device: Device) -> Result<(Vec<Tensor>, Tensor)> {
        let (inputs, y) = match &self.samples {
            Samples::Memory { test, .. } => {
                let part = test.narrow(start as i64, len as i64);
                (part.inputs, part.y)
            }
            Samples::Sharded(shards) => shards.test_batch(start, len)?,
        };
        Ok((self.prepare(inputs, device), y.to_device(device)))
    }
}

/// How a sharded data set is read (see [`sharded`]).
#[derive(Debug, Clone)]
pub struct ShardOptions {
    /// The side images are cropped and resized to.
    pub image_size: u32,
    /// Decoding threads.
    pub threads: usize,
    /// The run's seed: with the epoch, it orders the samples and keys their augmentation.
    pub seed: u64,
    /// Training images get Goyal's random-resized crop and flip (else the test images' centre crop).
    pub augment: bool,
    pub train_samples: Option<u64>,
    pub test_samples: Option<u64>,
    /// The shards arrive while the rank trains (a bucket's, fetched by the node's agent into its cache):
    /// a shard not there yet is waited for, not an error.
    pub streamed: bool,
    /// The named inputs an uploaded model takes, in its order (a data set of named tensors).
    pub inputs: Option<Vec<String>>,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            image_size: 224,
            threads: 1,
            seed: 0,
            augment: true,
            train_samples: None,
            test_samples: None,
            streamed: false,
            inputs: None,
        }
    }
}

/// The `synthetic` dataset: 1×16×16 Gaussian inputs whose label (of 10) is the argmax of a fixed random linear
/// map — learnable, seeded, and the same on every rank. Test split: a quarter of the training size (at least
/// 64), as long as Fashion-MNIST's ratio would make it otherwise tiny.
pub fn synthetic(train_size: usize) -> (Split, Split) {
    const CLASSES: usize = 10;
    const SIDE: i64 = 16;
    const FEATURES: usize = (SIDE * SIDE) as usize;
    let mut rng = SplitMix64::new(0x5EED);
    let projection: Vec<f64> = (0..CLASSES * FEATURES).map(|_| rng.normal()).collect();
    let test_size = (train_size / 4).max(64).min(FASHION_MNIST_TEST_SIZE as usize);
    let mut make = |n: usize| {
        let x: Vec<f32> = (0..n * FEATURES).map(|_| rng.normal() as f32).collect();
        let y: Vec<i64> = x
            .chunks_exact(FEATURES)
            .map(|sample| {
                let score = |c: usize| -> f64 {
                    sample.iter().zip(&projection[c * FEATURES..]).map(|(a, b)| f64::from(*a) * b).sum()
                };
                (0..CLASSES).max_by(|&a, &b| score(a).total_cmp(&score(b))).unwrap_or(0) as i64
            })
            .collect();
        Split { inputs: vec![Tensor::from_slice(&x).view([n as i64, 1, SIDE, SIDE])], y: Tensor::from_slice(&y) }
    };
    let train = make(train_size);
    let test = make(test_size);
    (train, test)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_is_seeded_and_uses_every_class() {
        let (a, _) = synthetic(500);
        let (b, _) = synthetic(500);
        assert!(a.inputs[0].equal(&b.inputs[0]) && a.y.equal(&b.y));
        assert_eq!(a.y.unique_dim(0, false, false, false).0.size()[0], 10);
    }

    #[test]
    fn normalised_training_inputs_have_zero_mean_and_unit_std() {
        let data = Dataset::load(&DatasetRef::Synthetic { train_size: 2000 }, None, None).unwrap();
        let all: Vec<i64> = (0..2000).collect();
        let mut data = data;
        let (x, _) = data.train_batch(&all, Device::Cpu).unwrap();
        let x = &x[0];
        assert!(x.mean(Kind::Double).double_value(&[]).abs() < 1e-4);
        assert!((x.std(false).double_value(&[]) - 1.0).abs() < 1e-3);
    }

    #[test]
    fn fashion_mnist_loads_with_its_known_statistics() {
        // Fashion-MNIST's pixel mean and standard deviation are 0.2860 and 0.3530 (over the training split)
        let data = Dataset::load(&DatasetRef::FashionMnist, None, None).unwrap();
        assert_eq!((data.train_len(), data.test_len(), data.classes()), (60_000, 10_000, 10));
        assert_eq!(data.sample_shape(), vec![1, 28, 28]);
        let normalizer = data.normalizer.as_ref().unwrap();
        let mean = normalizer.mean.double_value(&[0, 0, 0, 0]);
        let std = normalizer.std.double_value(&[0, 0, 0, 0]);
        assert!((mean - 0.2860).abs() < 1e-3 && (std - 0.3530).abs() < 1e-3, "mean {mean}, std {std}");
    }

    #[test]
    fn a_split_counts_its_bytes_as_stored_and_a_cpu_rank_keeps_it_where_it_is() {
        let mut data = Dataset::load(&DatasetRef::Synthetic { train_size: 300 }, None, None).unwrap();
        // synthetic inputs are f32 1×16×16, labels i64
        assert_eq!(data.in_memory().unwrap().0.bytes(), 300 * (256 * 4 + 8));
        let (before, _) = data.train_batch(&[5, 7, 11], Device::Cpu).unwrap();
        assert!(!data.place_on(Device::Cpu, u64::MAX), "a CPU rank's data is already where its step runs");
        let (after, _) = data.train_batch(&[5, 7, 11], Device::Cpu).unwrap();
        assert!(before[0].equal(&after[0]));
    }

    #[test]
    fn truncation_keeps_the_first_samples() {
        let data = Dataset::load(&DatasetRef::Synthetic { train_size: 300 }, Some(100), Some(10)).unwrap();
        assert_eq!(data.train_len(), 100);
        assert_eq!(data.test_len(), 10);
    }

    #[test]
    fn safetensors_without_a_test_split_holds_out_ten_percent() {
        let dir = std::env::temp_dir().join(format!("ringtrain-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.safetensors");
        let x = Tensor::arange(100 * 4, (Kind::Int64, Device::Cpu)).remainder(256).to_kind(Kind::Uint8).view([100, 4]);
        let y = Tensor::arange(100, (Kind::Int64, Device::Cpu)).remainder(3);
        Tensor::write_safetensors(&[("x", &x), ("y", &y)], &path).unwrap();
        let data = Dataset::load_safetensors(&path, None, None, None).unwrap();
        assert_eq!((data.train_len(), data.test_len(), data.classes()), (90, 10, 3));
        assert_eq!(data.sample_shape(), vec![4]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
