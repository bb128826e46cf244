//! Residual networks (He et al. 2016): CIFAR-style ResNet-20/56 (3 stages of basic blocks) and
//! ImageNet-style ResNet-50 (bottleneck blocks, stride on the 3×3 convolution as in Goyal et al.).
//! Shortcuts that change shape are 1×1 projections with BN; the last BN of every block may start at gamma = 0.

use anyhow::{ensure, Result};
use ringtrain_core::pipeline;
use tch::nn::{self, ModuleT, VarStore};
use tch::Tensor;

use super::layers::{batch_norm, classifier, conv};

/// The projection shortcut of a block whose output shape differs from its input's.
#[derive(Debug)]
struct Projection {
    conv: nn::Conv2D,
    bn: nn::BatchNorm,
}

impl Projection {
    fn maybe(p: &nn::Path, c_in: i64, c_out: i64, stride: i64) -> Option<Projection> {
        (stride != 1 || c_in != c_out).then(|| Projection {
            conv: conv(p / "conv_down", c_in, c_out, 1, stride),
            bn: batch_norm(p / "bn_down", c_out, false),
        })
    }

    fn shortcut(projection: &Option<Projection>, xs: &Tensor, train: bool) -> Tensor {
        match projection {
            Some(pr) => xs.apply(&pr.conv).apply_t(&pr.bn, train),
            None => xs.shallow_clone(),
        }
    }
}

/// conv3×3 → BN → ReLU → conv3×3 → BN (gamma 0 if zero-init), plus the shortcut, then ReLU.
#[derive(Debug)]
struct BasicBlock {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    conv2: nn::Conv2D,
    bn2: nn::BatchNorm,
    projection: Option<Projection>,
}

impl BasicBlock {
    fn new(p: &nn::Path, c_in: i64, c_out: i64, stride: i64, zero_last: bool) -> BasicBlock {
        BasicBlock {
            conv1: conv(p / "conv1", c_in, c_out, 3, stride),
            bn1: batch_norm(p / "bn1", c_out, false),
            conv2: conv(p / "conv2", c_out, c_out, 3, 1),
            bn2: batch_norm(p / "bn2", c_out, zero_last),
            projection: Projection::maybe(p, c_in, c_out, stride),
        }
    }
}

impl ModuleT for BasicBlock {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let residual =
            xs.apply(&self.conv1).apply_t(&self.bn1, train).relu().apply(&self.conv2).apply_t(&self.bn2, train);
        (residual + Projection::shortcut(&self.projection, xs, train)).relu()
    }
}

/// conv1×1 → BN → ReLU → conv3×3 (stride) → BN → ReLU → conv1×1 (×4) → BN (gamma 0 if zero-init), plus the
/// shortcut, then ReLU.
#[derive(Debug)]
struct Bottleneck {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    conv2: nn::Conv2D,
    bn2: nn::BatchNorm,
    conv3: nn::Conv2D,
    bn3: nn::BatchNorm,
    projection: Option<Projection>,
}

const BOTTLENECK_EXPANSION: i64 = 4;

impl Bottleneck {
    fn new(p: &nn::Path, c_in: i64, width: i64, stride: i64, zero_last: bool) -> Bottleneck {
        let c_out = width * BOTTLENECK_EXPANSION;
        Bottleneck {
            conv1: conv(p / "conv1", c_in, width, 1, 1),
            bn1: batch_norm(p / "bn1", width, false),
            conv2: conv(p / "conv2", width, width, 3, stride),
            bn2: batch_norm(p / "bn2", width, false),
            conv3: conv(p / "conv3", width, c_out, 1, 1),
            bn3: batch_norm(p / "bn3", c_out, zero_last),
            projection: Projection::maybe(p, c_in, c_out, stride),
        }
    }
}

impl ModuleT for Bottleneck {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let residual = xs
            .apply(&self.conv1)
            .apply_t(&self.bn1, train)
            .relu()
            .apply(&self.conv2)
            .apply_t(&self.bn2, train)
            .relu()
            .apply(&self.conv3)
            .apply_t(&self.bn3, train);
        (residual + Projection::shortcut(&self.projection, xs, train)).relu()
    }
}

#[derive(Debug, Clone, Copy)]
enum StemKind {
    /// conv3×3 16 → BN → ReLU (CIFAR).
    Cifar,
    /// conv7×7/2 64 → BN → ReLU → max-pool 3×3/2 (ImageNet).
    ImageNet,
}

/// The layers before the first residual block.
#[derive(Debug)]
struct Stem {
    kind: StemKind,
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
}

/// A residual block and its place in the network: `layer2.1` is the second block of the second stage (the
/// VarStore path of its variables, and the name a pipeline cut uses).
#[derive(Debug)]
struct NamedBlock {
    name: String,
    /// Whether it is the last block of its layer (a cut after it may be named by the layer alone).
    ends_layer: bool,
    block: Box<dyn ModuleT>,
}

/// A ResNet: stem, stages of residual blocks, global average pooling, classifier. A pipeline stage of one
/// (see [`ResNet::keep_stage`]) holds a run of its blocks, with the stem only in the first stage and the
/// classifier only in the last.
#[derive(Debug)]
pub struct ResNet {
    stem: Option<Stem>,
    blocks: Vec<NamedBlock>,
    fc: Option<nn::Linear>,
}

/// The variable-name prefixes of the stem and the classifier (the blocks' are their names).
const STEM_PREFIXES: [&str; 2] = ["conv1.", "bn1."];
const HEAD_PREFIX: &str = "fc.";

impl ResNet {
    /// ResNet-(6n+2) for CIFAR-sized inputs: n = 3 gives ResNet-20, n = 9 ResNet-56.
    pub fn cifar(p: &nn::Path, channels: i64, blocks_per_stage: usize, classes: i64, zero_last: bool) -> ResNet {
        let mut blocks = Vec::new();
        let mut c_in = 16;
        for (stage, (width, stride)) in [(16, 1), (32, 2), (64, 2)].into_iter().enumerate() {
            for b in 0..blocks_per_stage {
                let path = p / format!("layer{}", stage + 1) / b;
                let s = if b == 0 { stride } else { 1 };
                let block = Box::new(BasicBlock::new(&path, c_in, width, s, zero_last));
                blocks.push(NamedBlock {
                    name: format!("layer{}.{b}", stage + 1),
                    ends_layer: b + 1 == blocks_per_stage,
                    block,
                });
                c_in = width;
            }
        }
        ResNet {
            stem: Some(Stem {
                kind: StemKind::Cifar,
                conv1: conv(p / "conv1", channels, 16, 3, 1),
                bn1: batch_norm(p / "bn1", 16, false),
            }),
            blocks,
            fc: Some(classifier(p / "fc", 64, classes)),
        }
    }

    /// ResNet-50: bottleneck stages of 3, 4, 6 and 3 blocks.
    pub fn resnet50(p: &nn::Path, channels: i64, classes: i64, zero_last: bool) -> ResNet {
        let mut blocks = Vec::new();
        let mut c_in = 64;
        for (stage, (count, width, stride)) in
            [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)].into_iter().enumerate()
        {
            for b in 0..count {
                let path = p / format!("layer{}", stage + 1) / b;
                let s = if b == 0 { stride } else { 1 };
                let block = Box::new(Bottleneck::new(&path, c_in, width, s, zero_last));
                blocks.push(NamedBlock { name: format!("layer{}.{b}", stage + 1), ends_layer: b + 1 == count, block });
                c_in = width * BOTTLENECK_EXPANSION;
            }
        }
        ResNet {
            stem: Some(Stem {
                kind: StemKind::ImageNet,
                conv1: conv(p / "conv1", channels, 64, 7, 2),
                bn1: batch_norm(p / "bn1", 64, false),
            }),
            blocks,
            fc: Some(classifier(p / "fc", c_in, classes)),
        }
    }

    /// The blocks' names, as the core knows the network's outline.
    fn outline(&self) -> Vec<pipeline::Block> {
        self.blocks.iter().map(|b| pipeline::Block { name: b.name.clone(), ends_layer: b.ends_layer }).collect()
    }

    /// Keeps stage `stage` of the pipeline that `cuts` make (each cut a [`ringtrain_core::pipeline::cut_points`] name, in the
    /// network's order) and drops every other stage's layers, from this network and from `vs`, so a stage
    /// holds only its own weights and buffers. Built from the seed first and cut after, every stage's
    /// weights are bit for bit those of the whole network built from that seed.
    pub fn keep_stage(mut self, vs: &VarStore, cuts: &[String], stage: usize) -> Result<ResNet> {
        let bounds = pipeline::stage_bounds(&self.outline(), cuts).map_err(anyhow::Error::msg)?;
        ensure!(stage < bounds.len() - 1, "stage {stage} of {} stages", bounds.len() - 1);
        let (first, last) = (bounds[stage], bounds[stage + 1]);
        self.blocks = self.blocks.drain(first..last).collect();
        if stage > 0 {
            self.stem = None;
        }
        if stage + 2 < bounds.len() {
            self.fc = None;
        }
        let mut kept: Vec<String> = self.blocks.iter().map(|b| format!("{}.", b.name)).collect();
        if self.stem.is_some() {
            kept.extend(STEM_PREFIXES.map(String::from));
        }
        if self.fc.is_some() {
            kept.push(HEAD_PREFIX.to_string());
        }
        retain_variables(vs, |name| kept.iter().any(|prefix| name.starts_with(prefix.as_str())));
        Ok(self)
    }
}

/// Drops from `vs` every variable whose name `keep` refuses; the tensors are freed with the last module
/// holding them.
fn retain_variables(vs: &VarStore, keep: impl Fn(&str) -> bool) {
    let mut variables = vs.variables_.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    variables.named_variables.retain(|name, _| keep(name));
    let kept: std::collections::HashSet<usize> =
        variables.named_variables.values().map(|t| t.data_ptr() as usize).collect();
    variables.trainable_variables.retain(|var| kept.contains(&(var.tensor.data_ptr() as usize)));
}

impl ModuleT for ResNet {
    /// The whole network maps images to class scores; a pipeline stage maps its input (images, or the
    /// stage before's activations) to its output (activations, or the class scores in the last stage).
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut x = match &self.stem {
            Some(stem) => {
                let x = xs.apply(&stem.conv1).apply_t(&stem.bn1, train).relu();
                match stem.kind {
                    StemKind::ImageNet => x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false),
                    StemKind::Cifar => x,
                }
            }
            None => xs.shallow_clone(),
        };
        for block in &self.blocks {
            x = block.block.forward_t(&x, train);
        }
        match &self.fc {
            Some(fc) => x.adaptive_avg_pool2d([1, 1]).flatten(1, -1).apply(fc),
            None => x,
        }
    }
}
