//! Layer constructors with the initialisations of Goyal et al. §5.1 / He et al., spelled out because tch's
//! defaults differ from PyTorch's (notably `batch_norm2d`, whose gamma defaults to Uniform(0, 1)).

use tch::nn::{self, init::FanInOut, init::NonLinearity, init::NormalOrUniform, Init};

/// He initialisation for convolutions followed by ReLU (normal, fan-out, as in torchvision's ResNets).
pub const HE_FAN_OUT: Init =
    Init::Kaiming { dist: NormalOrUniform::Normal, fan: FanInOut::FanOut, non_linearity: NonLinearity::ReLU };

/// Convolution without bias (BN follows), He-initialised.
pub fn conv(p: nn::Path, c_in: i64, c_out: i64, kernel: i64, stride: i64) -> nn::Conv2D {
    let config = nn::ConvConfig { stride, padding: kernel / 2, bias: false, ws_init: HE_FAN_OUT, ..Default::default() };
    nn::conv2d(p, c_in, c_out, kernel, config)
}

/// BatchNorm with gamma = 1 (or 0 for the last BN of a residual block when `zero_gamma`) and beta = 0.
/// Module names starting with `bn` mark BN parameters for the optimizer (no weight decay on gamma/beta).
pub fn batch_norm(p: nn::Path, channels: i64, zero_gamma: bool) -> nn::BatchNorm {
    let config = nn::BatchNormConfig {
        ws_init: Init::Const(if zero_gamma { 0.0 } else { 1.0 }),
        bs_init: Init::Const(0.0),
        ..Default::default()
    };
    nn::batch_norm2d(p, channels, config)
}

/// The final classifier of the ResNets: weights N(0, 0.01), bias 0 (Goyal §5.1).
pub fn classifier(p: nn::Path, features: i64, classes: i64) -> nn::Linear {
    let config = nn::LinearConfig {
        ws_init: Init::Randn { mean: 0.0, stdev: 0.01 },
        bs_init: Some(Init::Const(0.0)),
        bias: true,
    };
    nn::linear(p, features, classes, config)
}

/// Whether a variable named by its VarStore path is a BatchNorm gamma/beta (see [`batch_norm`]).
pub fn is_batch_norm_param(name: &str) -> bool {
    let mut segments = name.rsplit('.');
    let leaf = segments.next();
    let module = segments.next().unwrap_or("");
    matches!(leaf, Some("weight" | "bias")) && module.starts_with("bn")
}

/// Whether a variable is a bias (of a linear or convolution layer, not of a BN).
pub fn is_bias(name: &str) -> bool {
    name.ends_with(".bias") && !is_batch_norm_param(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{nn::ModuleT, Device, Kind, Tensor};

    #[test]
    fn batch_norm_starts_at_gamma_one_or_zero_and_beta_zero() {
        let vs = nn::VarStore::new(Device::Cpu);
        let one = batch_norm(vs.root() / "bn1", 4, false);
        let zero = batch_norm(vs.root() / "bn2", 4, true);
        assert!(one.ws.as_ref().unwrap().equal(&Tensor::ones([4], (Kind::Float, Device::Cpu))));
        assert!(zero.ws.as_ref().unwrap().equal(&Tensor::zeros([4], (Kind::Float, Device::Cpu))));
        assert!(one.bs.as_ref().unwrap().equal(&Tensor::zeros([4], (Kind::Float, Device::Cpu))));
        // gamma = 0: the block's residual branch outputs exactly 0 at first
        let x = Tensor::randn([2, 4, 3, 3], (Kind::Float, Device::Cpu));
        assert_eq!(zero.forward_t(&x, true).abs().sum(Kind::Float).double_value(&[]), 0.0);
    }

    #[test]
    fn classifies_parameter_names() {
        assert!(is_batch_norm_param("layer1.0.bn2.weight"));
        assert!(is_batch_norm_param("bn1.bias"));
        assert!(!is_batch_norm_param("layer1.0.conv1.weight"));
        assert!(!is_batch_norm_param("bn1.running_mean"));
        assert!(is_bias("fc.bias"));
        assert!(!is_bias("bn1.bias"));
    }
}
