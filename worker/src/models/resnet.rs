//! Residual networks (He et al. 2016): CIFAR-style ResNet-20/56 (3 stages of basic blocks) and
//! ImageNet-style ResNet-50 (bottleneck blocks, stride on the 3×3 convolution as in Goyal et al.).
//! Shortcuts that change shape are 1×1 projections with BN; the last BN of every block may start at gamma = 0.

use tch::nn::{self, ModuleT};
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

#[derive(Debug)]
enum Stem {
    /// conv3×3 16 → BN → ReLU (CIFAR).
    Cifar,
    /// conv7×7/2 64 → BN → ReLU → max-pool 3×3/2 (ImageNet).
    ImageNet,
}

/// A ResNet: stem, stages of residual blocks, global average pooling, classifier.
#[derive(Debug)]
pub struct ResNet {
    stem: Stem,
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    blocks: Vec<Box<dyn ModuleT>>,
    fc: nn::Linear,
}

impl ResNet {
    /// ResNet-(6n+2) for CIFAR-sized inputs: n = 3 gives ResNet-20, n = 9 ResNet-56.
    pub fn cifar(p: &nn::Path, channels: i64, blocks_per_stage: usize, classes: i64, zero_last: bool) -> ResNet {
        let mut blocks: Vec<Box<dyn ModuleT>> = Vec::new();
        let mut c_in = 16;
        for (stage, (width, stride)) in [(16, 1), (32, 2), (64, 2)].into_iter().enumerate() {
            for b in 0..blocks_per_stage {
                let path = p / format!("layer{}", stage + 1) / b;
                let s = if b == 0 { stride } else { 1 };
                blocks.push(Box::new(BasicBlock::new(&path, c_in, width, s, zero_last)));
                c_in = width;
            }
        }
        ResNet {
            stem: Stem::Cifar,
            conv1: conv(p / "conv1", channels, 16, 3, 1),
            bn1: batch_norm(p / "bn1", 16, false),
            blocks,
            fc: classifier(p / "fc", 64, classes),
        }
    }

    /// ResNet-50: bottleneck stages of 3, 4, 6 and 3 blocks.
    pub fn resnet50(p: &nn::Path, channels: i64, classes: i64, zero_last: bool) -> ResNet {
        let mut blocks: Vec<Box<dyn ModuleT>> = Vec::new();
        let mut c_in = 64;
        for (stage, (count, width, stride)) in
            [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)].into_iter().enumerate()
        {
            for b in 0..count {
                let path = p / format!("layer{}", stage + 1) / b;
                let s = if b == 0 { stride } else { 1 };
                blocks.push(Box::new(Bottleneck::new(&path, c_in, width, s, zero_last)));
                c_in = width * BOTTLENECK_EXPANSION;
            }
        }
        ResNet {
            stem: Stem::ImageNet,
            conv1: conv(p / "conv1", channels, 64, 7, 2),
            bn1: batch_norm(p / "bn1", 64, false),
            blocks,
            fc: classifier(p / "fc", c_in, classes),
        }
    }
}

impl ModuleT for ResNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut x = xs.apply(&self.conv1).apply_t(&self.bn1, train).relu();
        if let Stem::ImageNet = self.stem {
            x = x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        }
        for block in &self.blocks {
            x = block.forward_t(&x, train);
        }
        x.adaptive_avg_pool2d([1, 1]).flatten(1, -1).apply(&self.fc)
    }
}
