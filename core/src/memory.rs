//! What one rank of a job needs in memory, estimated from the spec before anything runs: the model's
//! parameters, their gradients and momentum buffers (float32 each), the activations a training step keeps
//! for the backward pass at the per-worker batch, and the data set each rank holds. The API refuses (422) a
//! job whose estimate exceeds every device of its kind, instead of letting each rank run out of memory.
//!
//! The parameter count mirrors the worker's layer definitions exactly (the worker's tests compare it with
//! the built model); activations count each layer's output tensors that autograd keeps (a convolution,
//! its BatchNorm and its ReLU: three per convolution), which is what an eager-mode step holds at its peak
//! to within the allocator's slack. The estimate is meant to refuse only what can never fit, not to pack
//! devices tightly.

use serde::{Deserialize, Serialize};

use crate::dataset::{DatasetRef, FASHION_MNIST_TEST_SIZE, FASHION_MNIST_TRAIN_SIZE};
use crate::spec::{ModelName, ModelSpec};

/// The shape of one sample and the number of classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleShape {
    /// `[C, H, W]` for images, `[D]` (or any other shape) for flat samples.
    pub dims: Vec<u64>,
    pub classes: u64,
}

/// One rank's memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    pub parameters: u64,
    pub gradients: u64,
    pub momentum: u64,
    /// What the forward pass keeps for the backward pass, at the per-worker batch.
    pub activations: u64,
    /// The data set as each rank holds it.
    pub data: u64,
    pub total: u64,
}

impl MemoryEstimate {
    /// The spec field most to blame when the total is too large: `model` (parameters and their state),
    /// `per_worker_batch` (activations) or `dataset` (data).
    pub fn largest_part(&self) -> &'static str {
        let state = self.parameters + self.gradients + self.momentum;
        if state >= self.activations && state >= self.data {
            "model"
        } else if self.activations >= self.data {
            "per_worker_batch"
        } else {
            "dataset"
        }
    }
}

const FLOAT: u64 = 4;

/// The sample shape and the bytes each rank holds of a built-in data set (None for `idx:` and uploads,
/// whose shape the caller knows from elsewhere or not at all).
pub fn builtin_data(dataset: &DatasetRef) -> Option<(SampleShape, u64)> {
    match dataset {
        // kept as bytes: 70,000 images of 28×28
        DatasetRef::FashionMnist => Some((
            SampleShape { dims: vec![1, 28, 28], classes: 10 },
            (FASHION_MNIST_TRAIN_SIZE + FASHION_MNIST_TEST_SIZE) * 28 * 28,
        )),
        // 1×16×16 float32, made in a vector and copied into a tensor (both alive at once)
        DatasetRef::Synthetic { train_size } => {
            let test = (train_size / 4).clamp(64, FASHION_MNIST_TEST_SIZE);
            let bytes = train_size.saturating_add(test).saturating_mul(16 * 16 * FLOAT * 2);
            Some((SampleShape { dims: vec![1, 16, 16], classes: 10 }, bytes))
        }
        DatasetRef::Idx { .. } | DatasetRef::Shards { .. } | DatasetRef::Uploaded(_) => None,
    }
}

/// Bytes for people: `1.5 GiB`, `320 MiB`, `12 KiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The estimate for `model` on samples of `shape` at `batch` samples per step, with `data_bytes` of data
/// held per rank. None when the model cannot take these samples (the worker refuses it with the reason).
pub fn estimate(model: &ModelSpec, shape: &SampleShape, batch: u64, data_bytes: u64) -> Option<MemoryEstimate> {
    let counts = count(model, shape)?;
    Some(from_counts(counts, shape.dims.iter().product(), batch, data_bytes))
}

/// The memory of `counts` (float32 parameters with a gradient and a momentum each), keeping the activations
/// and the `input` scalars of `samples` samples at once, beside `data_bytes` of data.
fn from_counts(counts: Counts, input: u64, samples: u64, data_bytes: u64) -> MemoryEstimate {
    let parameters = counts.parameters.saturating_mul(FLOAT);
    let activations = counts.activations.saturating_add(input).saturating_mul(samples).saturating_mul(FLOAT);
    let total = parameters.saturating_mul(3).saturating_add(activations).saturating_add(data_bytes);
    MemoryEstimate { parameters, gradients: parameters, momentum: parameters, activations, data: data_bytes, total }
}

/// The estimate for an uploaded model from what its check measured: its weights (`weights_bytes`), a
/// gradient and a momentum buffer for each trainable parameter (`trainable_bytes`), a training step's peak
/// at the job's batch (`step_bytes`: activations, the batch, temporaries) and the data each rank holds.
pub fn measured(weights_bytes: u64, trainable_bytes: u64, step_bytes: u64, data_bytes: u64) -> MemoryEstimate {
    let total = weights_bytes
        .saturating_add(trainable_bytes.saturating_mul(2))
        .saturating_add(step_bytes)
        .saturating_add(data_bytes);
    MemoryEstimate {
        parameters: weights_bytes,
        gradients: trainable_bytes,
        momentum: trainable_bytes,
        activations: step_bytes,
        data: data_bytes,
        total,
    }
}

/// Parameters (scalars) and kept activations (scalars per sample) of a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub parameters: u64,
    pub activations: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.parameters = self.parameters.saturating_add(other.parameters);
        self.activations = self.activations.saturating_add(other.activations);
    }
}

/// Parameters and kept activations of `model` on samples of `shape`; None when it cannot take them.
pub fn count(model: &ModelSpec, shape: &SampleShape) -> Option<Counts> {
    let classes = shape.classes;
    let image = || match shape.dims.as_slice() {
        [c, h, w] => Some((*c, *h, *w)),
        _ => None,
    };
    Some(match model.name? {
        ModelName::Mlp => {
            let mut widths: Vec<u64> = vec![shape.dims.iter().product()];
            widths.extend(model.hidden_widths().into_iter().map(u64::from));
            widths.push(classes);
            let mut counts = Counts::default();
            for pair in widths.windows(2) {
                counts.parameters = counts.parameters.saturating_add(linear(pair[0], pair[1]));
                // the layer's output and its ReLU
                counts.activations = counts.activations.saturating_add(2 * pair[1]);
            }
            counts
        }
        ModelName::Lenet5 => {
            let (c, h, w) = image()?;
            if h < 12 || w < 12 {
                return None;
            }
            // conv 5×5 padded → ReLU → pool 2 → conv 5×5 → ReLU → pool 2 → 120 → 84 → classes
            let (h2, w2) = ((h / 2 - 4) / 2, (w / 2 - 4) / 2);
            let parameters = conv_weights(c, 6, 5)
                + 6
                + conv_weights(6, 16, 5)
                + 16
                + linear(16 * h2 * w2, 120)
                + linear(120, 84)
                + linear(84, classes);
            let activations = 6 * h * w * 2
                + 6 * (h / 2) * (w / 2)
                + 16 * (h / 2 - 4) * (w / 2 - 4) * 2
                + 16 * h2 * w2
                + 2 * (120 + 84)
                + classes;
            Counts { parameters, activations }
        }
        ModelName::Resnet8 | ModelName::Resnet20 | ModelName::Resnet56 | ModelName::Resnet50 => {
            resnet_parts(model, shape)?.total()
        }
    })
}

fn linear(inputs: u64, outputs: u64) -> u64 {
    inputs.saturating_mul(outputs).saturating_add(outputs)
}

/// A convolution without bias (ResNets put BatchNorm after every one).
fn conv_weights(c_in: u64, c_out: u64, kernel: u64) -> u64 {
    c_in.saturating_mul(c_out).saturating_mul(kernel * kernel)
}

/// A bias-free convolution followed by BatchNorm (weight and bias) and, when `relu`, a ReLU: its
/// parameters, and its kept outputs on a `side_h`×`side_w` output.
fn conv_bn(c_in: u64, c_out: u64, kernel: u64, (h, w): (u64, u64), relu: bool) -> Counts {
    let outputs = c_out.saturating_mul(h).saturating_mul(w);
    Counts {
        parameters: conv_weights(c_in, c_out, kernel) + 2 * c_out,
        activations: outputs.saturating_mul(if relu { 3 } else { 2 }),
    }
}

/// Output side of a convolution or pooling with "same" padding and this stride.
fn down(side: u64, stride: u64) -> u64 {
    side.div_ceil(stride)
}

/// A built-in ResNet's counts part by part: the stem, each residual block (in
/// [`crate::pipeline::blocks`]'s order) with the scalars per sample of its output (what a cut after it
/// passes on), and the head (pooling and classifier).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ResNetParts {
    stem: Counts,
    blocks: Vec<(Counts, u64)>,
    head: Counts,
}

impl ResNetParts {
    fn total(&self) -> Counts {
        let mut counts = self.stem;
        for (block, _) in &self.blocks {
            counts.add(*block);
        }
        counts.add(self.head);
        counts
    }
}

fn resnet_parts(model: &ModelSpec, shape: &SampleShape) -> Option<ResNetParts> {
    let image = match shape.dims.as_slice() {
        [c, h, w] => (*c, *h, *w),
        _ => return None,
    };
    Some(match model.name? {
        ModelName::Resnet8 => cifar_resnet(image, 1, shape.classes),
        ModelName::Resnet20 => cifar_resnet(image, 3, shape.classes),
        ModelName::Resnet56 => cifar_resnet(image, 9, shape.classes),
        ModelName::Resnet50 => resnet50(image, shape.classes),
        ModelName::Mlp | ModelName::Lenet5 => return None,
    })
}

/// ResNet-(6n+2): conv3×3 16, then stages of n basic blocks at widths 16, 32 and 64 (strides 1, 2, 2),
/// a projection shortcut where the shape changes, global pooling and the classifier.
fn cifar_resnet((c, h, w): (u64, u64, u64), blocks: u64, classes: u64) -> ResNetParts {
    let stem = conv_bn(c, 16, 3, (h, w), true);
    let mut parts = Vec::new();
    let (mut c_in, mut side) = (16, (h, w));
    for (width, stride) in [(16, 1), (32, 2), (64, 2)] {
        for b in 0..blocks {
            let s = if b == 0 { stride } else { 1 };
            let out = (down(side.0, s), down(side.1, s));
            let mut block = conv_bn(c_in, width, 3, out, true);
            block.add(conv_bn(width, width, 3, out, false));
            if s != 1 || c_in != width {
                block.add(conv_bn(c_in, width, 1, out, false));
            }
            // the sum and its ReLU
            block.activations = block.activations.saturating_add(2 * width * out.0 * out.1);
            parts.push((block, width * out.0 * out.1));
            (c_in, side) = (width, out);
        }
    }
    ResNetParts { stem, blocks: parts, head: Counts { parameters: linear(64, classes), activations: 64 + classes } }
}

/// ResNet-50: conv7×7/2 64 and a 3×3/2 max-pool, then bottleneck stages of 3, 4, 6 and 3 blocks (the
/// stride on the 3×3 convolution), global pooling and the classifier.
fn resnet50((c, h, w): (u64, u64, u64), classes: u64) -> ResNetParts {
    let after_conv = (down(h, 2), down(w, 2));
    let mut stem = conv_bn(c, 64, 7, after_conv, true);
    let mut side = (down(after_conv.0, 2), down(after_conv.1, 2));
    stem.activations = stem.activations.saturating_add(64 * side.0 * side.1);
    let mut parts = Vec::new();
    let mut c_in = 64;
    for (blocks, width, stride) in [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)] {
        for b in 0..blocks {
            let s = if b == 0 { stride } else { 1 };
            let out = (down(side.0, s), down(side.1, s));
            let c_out = width * 4;
            let mut block = conv_bn(c_in, width, 1, side, true);
            block.add(conv_bn(width, width, 3, out, true));
            block.add(conv_bn(width, c_out, 1, out, false));
            if s != 1 || c_in != c_out {
                block.add(conv_bn(c_in, c_out, 1, out, false));
            }
            block.activations = block.activations.saturating_add(2 * c_out * out.0 * out.1);
            parts.push((block, c_out * out.0 * out.1));
            (c_in, side) = (c_out, out);
        }
    }
    ResNetParts { stem, blocks: parts, head: Counts { parameters: linear(c_in, classes), activations: c_in + classes } }
}

/// One pipeline stage's memory (see [`stage_estimates`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageEstimate {
    /// The blocks it holds, first and last (`layer1.0`…`layer2.2`); the first stage also holds the stem,
    /// the last the classifier. For a composite uploaded model: its first and last module, or every
    /// module's name (the list twice) when they are not next to each other in its manifest.
    pub blocks: (String, String),
    /// Micro-batches whose activations it keeps at once.
    pub in_flight: u64,
    pub memory: MemoryEstimate,
}

/// The memory of each stage of a built-in ResNet cut after `cuts` (see [`crate::pipeline::stage_bounds`]),
/// at micro-batches of `micro_batch` samples, `micro_batches` of them per step. Under the 1F1B schedule
/// stage s of S keeps the activations of min(S − s, v) micro-batches at once, and its input (the images,
/// or the activations it receives); each stage holds only its own parameters, their gradients and
/// momentum. `data_bytes` is counted in every stage (each loads the data set as a rank does). The error
/// names a cut the model has not.
pub fn stage_estimates(
    model: &ModelSpec,
    shape: &SampleShape,
    micro_batch: u64,
    micro_batches: u64,
    data_bytes: u64,
    cuts: &[String],
) -> Result<Vec<StageEstimate>, String> {
    let name = model.name.ok_or("an uploaded model's stages are its sub-modules, not cuts")?;
    let blocks = crate::pipeline::blocks(name)
        .ok_or_else(|| format!("{name:?} is not cut into stages: only the ResNets are"))?;
    let parts = resnet_parts(model, shape).ok_or("the ResNets take image samples (C×H×W)")?;
    let bounds = crate::pipeline::stage_bounds(&blocks, cuts)?;
    let stages = bounds.len() - 1;
    let image: u64 = shape.dims.iter().product();
    Ok((0..stages)
        .map(|s| {
            let (first, last) = (bounds[s], bounds[s + 1]);
            let mut counts = if s == 0 { parts.stem } else { Counts::default() };
            for (block, _) in &parts.blocks[first..last] {
                counts.add(*block);
            }
            if s + 1 == stages {
                counts.add(parts.head);
            }
            let input = if s == 0 { image } else { parts.blocks[first - 1].1 };
            let in_flight = ((stages - s) as u64).min(micro_batches.max(1));
            let memory = from_counts(counts, input, micro_batch.saturating_mul(in_flight), data_bytes);
            StageEstimate { blocks: (blocks[first].name.clone(), blocks[last - 1].name.clone()), in_flight, memory }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(c: u64, h: u64, w: u64) -> SampleShape {
        SampleShape { dims: vec![c, h, w], classes: 10 }
    }

    #[test]
    fn bytes_read_like_a_person_would_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(320 << 20), "320 MiB");
        assert_eq!(human_bytes(3 << 40), "3.0 TiB");
    }

    #[test]
    fn known_parameter_counts() {
        // He et al.: ResNet-20 0.27M, ResNet-56 0.85M (with projection shortcuts a little more);
        // ResNet-50 25.6M with 1000 classes.
        let resnet20 = count(&ModelSpec::new(ModelName::Resnet20), &image(3, 32, 32)).unwrap().parameters;
        assert!((270_000..300_000).contains(&resnet20), "{resnet20}");
        let resnet56 = count(&ModelSpec::new(ModelName::Resnet56), &image(3, 32, 32)).unwrap().parameters;
        assert!((850_000..900_000).contains(&resnet56), "{resnet56}");
        let imagenet = SampleShape { dims: vec![3, 224, 224], classes: 1000 };
        let resnet50 = count(&ModelSpec::new(ModelName::Resnet50), &imagenet).unwrap().parameters;
        assert_eq!(resnet50, 25_557_032);
        // LeNet-5 on 28×28 Fashion-MNIST: 61,706 parameters
        assert_eq!(count(&ModelSpec::new(ModelName::Lenet5), &image(1, 28, 28)).unwrap().parameters, 61_706);
    }

    #[test]
    fn a_huge_mlp_needs_terabytes_and_blames_the_model() {
        let model = ModelSpec { hidden: Some(vec![65_536; 32]), ..ModelSpec::new(ModelName::Mlp) };
        let estimate = estimate(&model, &image(1, 16, 16), 32, 10 << 20).unwrap();
        assert!(estimate.total > 1 << 40, "{estimate:?}");
        assert_eq!(estimate.largest_part(), "model");
    }

    #[test]
    fn activations_grow_with_the_batch_and_images_need_image_models() {
        let model = ModelSpec::new(ModelName::Resnet50);
        let small = estimate(&model, &image(3, 224, 224), 1, 0).unwrap();
        let large = estimate(&model, &image(3, 224, 224), 256, 0).unwrap();
        assert_eq!(large.activations, small.activations * 256);
        assert_eq!(large.largest_part(), "per_worker_batch");
        // about 100 MB of kept activations per 224×224 image in float32, as usually measured
        assert!((60 << 20..200 << 20).contains(&small.activations), "{}", small.activations);
        let flat = SampleShape { dims: vec![784], classes: 10 };
        assert!(count(&model, &flat).is_none());
    }

    fn cuts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn stages_share_the_parameters_and_keep_activations_of_the_micro_batches_in_flight() {
        let imagenet = SampleShape { dims: vec![3, 224, 224], classes: 1000 };
        let model = ModelSpec::new(ModelName::Resnet50);
        let whole = estimate(&model, &imagenet, 32, 0).unwrap();
        let alone = stage_estimates(&model, &imagenet, 32, 1, 0, &[]).unwrap();
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].memory, whole, "one stage is the whole model");
        for cut in [&["layer2"][..], &["layer1.1", "layer3"], &["layer1", "layer2", "layer3.4"]] {
            let stages = stage_estimates(&model, &imagenet, 32, 8, 0, &cuts(cut)).unwrap();
            assert_eq!(stages.len(), cut.len() + 1);
            let parameters: u64 = stages.iter().map(|s| s.memory.parameters).sum();
            assert_eq!(parameters, whole.parameters, "{cut:?}: every parameter in one stage");
            let in_flight: Vec<u64> = stages.iter().map(|s| s.in_flight).collect();
            let expected: Vec<u64> = (1..=stages.len() as u64).rev().collect();
            assert_eq!(in_flight, expected, "{cut:?}: 1F1B keeps S − s micro-batches in stage s");
        }
        // one micro-batch per step: each stage keeps its own share of the activations, the boundary's once more
        let halves = stage_estimates(&model, &imagenet, 32, 1, 0, &cuts(&["layer2"])).unwrap();
        let split: u64 = halves.iter().map(|s| s.memory.activations).sum();
        assert!(
            split > whole.activations && split < whole.activations * 11 / 10,
            "{split} against {}",
            whole.activations
        );
        assert!(halves.iter().all(|s| s.memory.total < whole.total));
        assert_eq!(halves[1].blocks, ("layer3.0".to_string(), "layer4.2".to_string()));
    }

    #[test]
    fn a_stage_estimate_names_what_cannot_be_cut() {
        let shape = image(3, 32, 32);
        let err =
            stage_estimates(&ModelSpec::new(ModelName::Resnet20), &shape, 8, 2, 0, &cuts(&["layer4"])).unwrap_err();
        assert!(err.contains("\"layer4\""), "{err}");
        let err = stage_estimates(&ModelSpec::new(ModelName::Lenet5), &shape, 8, 2, 0, &cuts(&["conv1"])).unwrap_err();
        assert!(err.contains("only the ResNets"), "{err}");
    }
}
