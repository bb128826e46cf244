//! The built-in models, shaped like tch-rs's examples: a struct with `new(&nn::Path, ...)` and `ModuleT`.

pub mod composite;
pub mod init;
pub mod layers;
pub mod operators;
mod resnet;
pub mod scripted;

use anyhow::{bail, ensure, Result};
use ringtrain_core::spec::{InitScheme, ModelName, ModelSpec};
use tch::nn::{self, ModuleT};
use tch::Tensor;

use crate::optim::{kind_by_name, ParamKind};
pub use composite::Composite;
pub use resnet::ResNet;
pub use scripted::{OperatorCheck, Scripted};

/// The network a rank trains: a built-in model (one input), an uploaded TorchScript module (its named
/// inputs, in its order), or the modules of a composite uploaded model (all, or one pipeline stage's).
#[derive(Debug)]
pub enum Network {
    BuiltIn(Box<dyn ModuleT>),
    Scripted(Scripted),
    Composite(Composite),
}

impl Network {
    /// The forward pass in training (`train`) or evaluation mode.
    pub fn forward(&mut self, inputs: &[Tensor], train: bool) -> Result<Tensor> {
        match self {
            Network::BuiltIn(model) => Ok(model.forward_t(&inputs[0], train)),
            Network::Scripted(scripted) => {
                scripted.module.set_training(train)?;
                scripted.module.forward(inputs)
            }
            Network::Composite(composite) => {
                let mut out = composite.forward_stage(inputs, &[], train)?;
                ensure!(out.len() == 1, "a composite model split into stages runs stage by stage");
                Ok(out.remove(0))
            }
        }
    }

    /// One pipeline stage's forward pass: from the data set's inputs (`data`, which a ResNet's first stage
    /// reads) and what the previous stage sent (`received`: a ResNet's activation, a composite model's
    /// module outputs), what the next stage gets, or the model's output in the last stage.
    pub fn forward_stage(&mut self, data: &[Tensor], received: &[Tensor], train: bool) -> Result<Vec<Tensor>> {
        match self {
            Network::BuiltIn(model) => {
                let input = match received {
                    [activation] => activation,
                    [] => &data[0],
                    more => bail!("a ResNet stage takes one activation, not {}", more.len()),
                };
                Ok(vec![model.forward_t(input, train)])
            }
            Network::Scripted(_) => bail!("a model of one TorchScript file is not split into stages"),
            Network::Composite(composite) => composite.forward_stage(data, received, train),
        }
    }

    /// Which weight-decay rule a parameter follows: by name for the built-in models (their BatchNorms are
    /// named `bn*`); for a scripted one, BatchNorm by the holding module's type, and every other 1-D
    /// parameter (biases, LayerNorm's) as a bias.
    pub fn param_kind(&self, name: &str, tensor: &Tensor) -> ParamKind {
        match self {
            Network::BuiltIn(_) => kind_by_name(name, tensor),
            Network::Scripted(scripted) if scripted.batch_norm_params.contains(name) => ParamKind::BatchNorm,
            Network::Composite(composite) if composite.is_batch_norm_param(name) => ParamKind::BatchNorm,
            Network::Scripted(_) | Network::Composite(_) if tensor.dim() <= 1 => ParamKind::Bias,
            Network::Scripted(_) | Network::Composite(_) => ParamKind::Weight,
        }
    }
}

/// A fully connected network: flatten, hidden layers with ReLU, a linear classifier.
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<nn::Linear>,
}

impl Mlp {
    pub fn new(p: &nn::Path, inputs: i64, hidden: &[i64], classes: i64, scheme: InitScheme) -> Mlp {
        let mut widths = vec![inputs];
        widths.extend_from_slice(hidden);
        widths.push(classes);
        let last = widths.len() - 2;
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| init::linear(p / format!("fc{i}"), w[0], w[1], scheme, i == last))
            .collect();
        Mlp { layers }
    }
}

impl ModuleT for Mlp {
    fn forward_t(&self, xs: &Tensor, _train: bool) -> Tensor {
        let mut x = xs.flatten(1, -1);
        for (i, layer) in self.layers.iter().enumerate() {
            x = x.apply(layer);
            if i + 1 < self.layers.len() {
                x = x.relu();
            }
        }
        x
    }
}

/// LeNet-5 (LeCun et al. 1998) with ReLU and max pooling: conv 5×5 (padded) 6 → pool → conv 5×5 16 → pool →
/// 120 → 84 → classes. Works for any input at least 12×12.
#[derive(Debug)]
pub struct LeNet5 {
    conv1: nn::Conv2D,
    conv2: nn::Conv2D,
    fc1: nn::Linear,
    fc2: nn::Linear,
    fc3: nn::Linear,
}

impl LeNet5 {
    pub fn new(p: &nn::Path, channels: i64, height: i64, width: i64, classes: i64, scheme: InitScheme) -> LeNet5 {
        let conv1 = init::conv2d(p / "conv1", channels, 6, 5, 2, scheme);
        let conv2 = init::conv2d(p / "conv2", 6, 16, 5, 0, scheme);
        // spatial size: same (padding 2) → /2 → -4 → /2
        let side = |s: i64| (s / 2 - 4) / 2;
        let features = 16 * side(height) * side(width);
        LeNet5 {
            conv1,
            conv2,
            fc1: init::linear(p / "fc1", features, 120, scheme, false),
            fc2: init::linear(p / "fc2", 120, 84, scheme, false),
            fc3: init::linear(p / "fc3", 84, classes, scheme, true),
        }
    }
}

impl ModuleT for LeNet5 {
    fn forward_t(&self, xs: &Tensor, _train: bool) -> Tensor {
        xs.apply(&self.conv1)
            .relu()
            .max_pool2d_default(2)
            .apply(&self.conv2)
            .relu()
            .max_pool2d_default(2)
            .flatten(1, -1)
            .apply(&self.fc1)
            .relu()
            .apply(&self.fc2)
            .relu()
            .apply(&self.fc3)
    }
}

/// Builds the model a spec names for inputs of `sample_shape` (C×H×W, or D for flat data) and `classes`.
pub fn build(
    spec: &ModelSpec,
    p: &nn::Path,
    sample_shape: &[i64],
    classes: i64,
    bn_zero_init_last: bool,
) -> Result<Box<dyn ModuleT>> {
    let image = |name: &str| -> Result<(i64, i64, i64)> {
        match sample_shape {
            [c, h, w] => Ok((*c, *h, *w)),
            other => bail!("{name} needs image inputs (C×H×W); this dataset's samples have shape {other:?}"),
        }
    };
    let Some(name) = spec.name else { bail!("no built-in model named: an uploaded model is loaded, not built") };
    let scheme = spec.init.unwrap_or_default();
    Ok(match name {
        ModelName::Mlp => {
            let hidden: Vec<i64> = spec.hidden_widths().into_iter().map(i64::from).collect();
            Box::new(Mlp::new(p, sample_shape.iter().product(), &hidden, classes, scheme))
        }
        ModelName::Lenet5 => {
            let (c, h, w) = image("lenet5")?;
            if h < 12 || w < 12 {
                bail!("lenet5 needs inputs of at least 12×12, got {h}×{w}");
            }
            Box::new(LeNet5::new(p, c, h, w, classes, scheme))
        }
        ModelName::Resnet8 => Box::new(ResNet::cifar(p, image("resnet8")?.0, 1, classes, bn_zero_init_last)),
        ModelName::Resnet20 => Box::new(ResNet::cifar(p, image("resnet20")?.0, 3, classes, bn_zero_init_last)),
        ModelName::Resnet56 => Box::new(ResNet::cifar(p, image("resnet56")?.0, 9, classes, bn_zero_init_last)),
        ModelName::Resnet50 => Box::new(ResNet::resnet50(p, image("resnet50")?.0, classes, bn_zero_init_last)),
    })
}

/// Builds stage `stage` of a built-in model cut into a pipeline after the layers `cuts` names (see
/// [`ringtrain_core::pipeline::cut_points`]): the whole model is built from the seed into `vs`, then every other stage's
/// layers and variables are dropped, so each stage starts from the weights the unsplit model would.
pub fn build_stage(
    spec: &ModelSpec,
    vs: &nn::VarStore,
    sample_shape: &[i64],
    classes: i64,
    bn_zero_init_last: bool,
    cuts: &[String],
    stage: usize,
) -> Result<Box<dyn ModuleT>> {
    let (Some(name), [c, ..]) = (spec.name, sample_shape) else {
        bail!("only the built-in ResNets are cut into pipeline stages, on image inputs");
    };
    let p = vs.root();
    let whole = match name {
        ModelName::Resnet8 => ResNet::cifar(&p, *c, 1, classes, bn_zero_init_last),
        ModelName::Resnet20 => ResNet::cifar(&p, *c, 3, classes, bn_zero_init_last),
        ModelName::Resnet56 => ResNet::cifar(&p, *c, 9, classes, bn_zero_init_last),
        ModelName::Resnet50 => ResNet::resnet50(&p, *c, classes, bn_zero_init_last),
        other => bail!("{other:?} is not cut into pipeline stages: only the ResNets are"),
    };
    Ok(Box::new(whole.keep_stage(vs, cuts, stage)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn every_model_maps_a_batch_to_class_scores() {
        for (name, shape) in [
            (ModelName::Mlp, vec![1, 8, 8]),
            (ModelName::Lenet5, vec![1, 28, 28]),
            (ModelName::Resnet8, vec![1, 28, 28]),
            (ModelName::Resnet20, vec![1, 28, 28]),
            (ModelName::Resnet56, vec![3, 16, 16]),
            (ModelName::Resnet50, vec![3, 32, 32]),
        ] {
            let vs = nn::VarStore::new(Device::Cpu);
            let model = build(&ModelSpec::new(name), &vs.root(), &shape, 10, true).unwrap();
            let mut input = vec![2];
            input.extend(&shape);
            let out = model.forward_t(&Tensor::randn(input.as_slice(), (Kind::Float, Device::Cpu)), true);
            assert_eq!(out.size(), vec![2, 10], "{name:?}");
        }
    }

    /// The API's memory estimate counts parameters from the spec alone: it must be the built model's count.
    #[test]
    fn the_memory_estimate_counts_exactly_the_built_parameters() {
        use ringtrain_core::memory::{count, SampleShape};
        let mlp = ModelSpec { hidden: Some(vec![64, 32, 16]), ..ModelSpec::new(ModelName::Mlp) };
        for (spec, shape, classes) in [
            (ModelSpec::new(ModelName::Mlp), vec![1, 16, 16], 10),
            (mlp, vec![100], 7),
            (ModelSpec::new(ModelName::Lenet5), vec![1, 28, 28], 10),
            (ModelSpec::new(ModelName::Lenet5), vec![3, 33, 20], 4),
            (ModelSpec::new(ModelName::Resnet8), vec![1, 28, 28], 10),
            (ModelSpec::new(ModelName::Resnet20), vec![1, 28, 28], 10),
            (ModelSpec::new(ModelName::Resnet56), vec![3, 32, 32], 100),
            (ModelSpec::new(ModelName::Resnet50), vec![3, 64, 64], 1000),
        ] {
            let vs = nn::VarStore::new(Device::Cpu);
            build(&spec, &vs.root(), &shape, classes, true).unwrap();
            let built: i64 = vs.trainable_variables().iter().map(Tensor::numel).map(|n| n as i64).sum();
            let dims = shape.iter().map(|&d| d as u64).collect();
            let estimated = count(&spec, &SampleShape { dims, classes: classes as u64 }).unwrap().parameters;
            assert_eq!(estimated, built as u64, "{:?} on {shape:?}", spec.name);
        }
    }

    /// Admission counts each pipeline stage's parameters from the spec alone: they must be the built stage's.
    #[test]
    fn each_stage_holds_the_parameters_its_memory_estimate_counts() {
        use ringtrain_core::memory::{stage_estimates, SampleShape};
        for (name, shape, cuts) in [
            (ModelName::Resnet20, [3, 32, 32], vec!["layer2"]),
            (ModelName::Resnet8, [1, 28, 28], vec!["layer1", "layer2"]),
            (ModelName::Resnet50, [3, 64, 64], vec!["layer1.1", "layer3"]),
        ] {
            let spec = ModelSpec::new(name);
            let cuts: Vec<String> = cuts.into_iter().map(String::from).collect();
            let sample = SampleShape { dims: shape.iter().map(|&d| d as u64).collect(), classes: 10 };
            let estimates = stage_estimates(&spec, &sample, 1, 1, 0, &cuts).unwrap();
            assert_eq!(estimates.len(), cuts.len() + 1);
            for (stage, estimate) in estimates.iter().enumerate() {
                let vs = nn::VarStore::new(Device::Cpu);
                build_stage(&spec, &vs, &shape, 10, true, &cuts, stage).unwrap();
                let built: i64 = vs.trainable_variables().iter().map(Tensor::numel).map(|n| n as i64).sum();
                assert_eq!(estimate.memory.parameters, built as u64 * 4, "{name:?} stage {stage} of {cuts:?}");
            }
        }
    }

    #[test]
    fn image_models_reject_flat_inputs() {
        let vs = nn::VarStore::new(Device::Cpu);
        let err = build(&ModelSpec::new(ModelName::Lenet5), &vs.root(), &[64], 10, true).err().unwrap();
        assert!(err.to_string().contains("image inputs"));
    }
}
