//! How the built-in models without BatchNorm (LeNet-5, the MLP) start: the spec's `model.init`
//! ([`InitScheme`]). Chosen by measurement over five seeds (docs/user-guide.md, "Accuracy over several
//! seeds"): tch's defaults, ringtrain's until 2026-12-06, start the weights about 2.45 times wider than
//! PyTorch's and ended 0.30 points of test error worse than plain PyTorch on LeNet-5; Goyal's rule (the
//! default) and PyTorch's ended within 0.11.

use ringtrain_core::spec::InitScheme;
use tch::nn::{self, init::FanInOut, init::NonLinearity, init::NormalOrUniform, Init};

use super::layers;

/// PyTorch's layers draw their weights with `kaiming_uniform_(a=√5)`: the leaky-ReLU gain √(2/(1+a²)),
/// which makes the bound 1/√fan_in.
fn pytorch_weights() -> Init {
    let gain = (2.0f64 / 6.0).sqrt();
    Init::Kaiming {
        dist: NormalOrUniform::Uniform,
        fan: FanInOut::FanIn,
        non_linearity: NonLinearity::ExplicitGain(gain),
    }
}

/// Uniform in ±1/√fan_in: PyTorch's biases.
fn pytorch_bias(fan_in: i64) -> Init {
    let bound = 1.0 / (fan_in as f64).sqrt();
    Init::Uniform { lo: -bound, up: bound }
}

/// He-normal by fan-in: a hidden fully connected layer followed by ReLU.
const HE_FAN_IN: Init =
    Init::Kaiming { dist: NormalOrUniform::Normal, fan: FanInOut::FanIn, non_linearity: NonLinearity::ReLU };

/// A convolution with bias, square `kernel`, `padding` on each side.
pub fn conv2d(p: nn::Path, c_in: i64, c_out: i64, kernel: i64, padding: i64, scheme: InitScheme) -> nn::Conv2D {
    let (ws_init, bs_init) = match scheme {
        InitScheme::Goyal => (layers::HE_FAN_OUT, Init::Const(0.0)),
        InitScheme::Pytorch => (pytorch_weights(), pytorch_bias(c_in * kernel * kernel)),
        InitScheme::Tch => (nn::init::DEFAULT_KAIMING_UNIFORM, Init::Const(0.0)),
    };
    nn::conv2d(p, c_in, c_out, kernel, nn::ConvConfig { padding, ws_init, bs_init, ..Default::default() })
}

/// A fully connected layer; `last`: the classifier (Goyal's rule starts it at N(0, 0.01)).
pub fn linear(p: nn::Path, inputs: i64, outputs: i64, scheme: InitScheme, last: bool) -> nn::Linear {
    match scheme {
        InitScheme::Goyal if last => layers::classifier(p, inputs, outputs),
        InitScheme::Goyal => {
            let config = nn::LinearConfig { ws_init: HE_FAN_IN, bs_init: Some(Init::Const(0.0)), bias: true };
            nn::linear(p, inputs, outputs, config)
        }
        InitScheme::Pytorch => {
            let config =
                nn::LinearConfig { ws_init: pytorch_weights(), bs_init: Some(pytorch_bias(inputs)), bias: true };
            nn::linear(p, inputs, outputs, config)
        }
        // tch's own defaults, drawn in the same order as before: a spec from then trains the same run
        InitScheme::Tch => nn::linear(p, inputs, outputs, Default::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};

    fn std(t: &Tensor) -> f64 {
        t.std(false).double_value(&[])
    }

    fn max_abs(t: &Tensor) -> f64 {
        t.abs().max().double_value(&[])
    }

    #[test]
    fn each_scheme_draws_the_distributions_it_names() {
        tch::manual_seed(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let (c_in, c_out, k) = (64, 128, 5);
        let (fan_in, fan_out) = ((c_in * k * k) as f64, (c_out * k * k) as f64);
        let goyal = conv2d(vs.root() / "g", c_in, c_out, k, 2, InitScheme::Goyal);
        assert!((std(&goyal.ws) / (2.0 / fan_out).sqrt() - 1.0).abs() < 0.02, "He-normal by fan-out");
        assert_eq!(max_abs(goyal.bs.as_ref().unwrap()), 0.0);
        let torch = conv2d(vs.root() / "p", c_in, c_out, k, 2, InitScheme::Pytorch);
        let bound = 1.0 / fan_in.sqrt();
        assert!(max_abs(&torch.ws) <= bound && max_abs(&torch.ws) > 0.99 * bound, "PyTorch's ±1/√fan_in");
        assert!(max_abs(torch.bs.as_ref().unwrap()) <= bound);
        let old = conv2d(vs.root() / "t", c_in, c_out, k, 2, InitScheme::Tch);
        let bound = (6.0 / fan_in).sqrt();
        assert!(max_abs(&old.ws) <= bound && max_abs(&old.ws) > 0.99 * bound, "tch's ±√(6/fan_in)");

        let hidden = linear(vs.root() / "h", 1024, 512, InitScheme::Goyal, false);
        assert!((std(&hidden.ws) / (2.0f64 / 1024.0).sqrt() - 1.0).abs() < 0.02, "He-normal by fan-in");
        let last = linear(vs.root() / "l", 1024, 512, InitScheme::Goyal, true);
        assert!((std(&last.ws) / 0.01 - 1.0).abs() < 0.02, "N(0, 0.01)");
        assert_eq!(max_abs(last.bs.as_ref().unwrap()), 0.0);
        let torch = linear(vs.root() / "pl", 1024, 512, InitScheme::Pytorch, true);
        assert!(max_abs(&torch.ws) <= 1.0 / 32.0 && max_abs(torch.bs.as_ref().unwrap()) <= 1.0 / 32.0);
    }

    /// The ResNets' convolutions (`layers::conv`) are what a PyTorch user writing the same rule gets:
    /// `kaiming_normal_(w, mode="fan_out", nonlinearity="relu")`, std √2/√(c_out·k·k).
    #[test]
    fn the_resnets_convolutions_follow_pytorchs_kaiming_normal_by_fan_out() {
        tch::manual_seed(2);
        let vs = nn::VarStore::new(Device::Cpu);
        for (c_in, c_out, k) in [(64, 64, 3), (256, 64, 1), (64, 256, 1), (3, 64, 7)] {
            let conv = layers::conv(vs.root() / format!("c{c_in}_{c_out}_{k}"), c_in, c_out, k, 1);
            let expected = (2.0 / (c_out * k * k) as f64).sqrt();
            assert!((std(&conv.ws) / expected - 1.0).abs() < 0.05, "{c_in}→{c_out} k{k}: {}", std(&conv.ws));
            assert_eq!(conv.ws.kind(), Kind::Float);
        }
    }
}
