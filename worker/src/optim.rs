//! SGD with momentum as Goyal et al. use it, written as tensor ops under `no_grad` (tch's `nn::Sgd` cannot
//! express momentum correction or per-parameter weight-decay rules):
//!
//! - `pytorch` form: u = m·u + g;        w -= lr·u         (Nesterov: w -= lr·(g + m·u))
//! - `goyal` form:   u = m·u + lr·g;     w -= u            (Nesterov: w -= lr·g + m·u)
//!   with u scaled by lr_t / lr_{t-1} whenever the lr changes (momentum correction, Goyal §2.2), which makes
//!   the two forms take the same steps.
//! - weight decay is added to the gradient (g += wd·w), except for BatchNorm gamma/beta (and biases if so
//!   configured).

use ringtrain_core::schedule::Effective;
use ringtrain_core::spec::MomentumForm;
use tch::nn::VarStore;
use tch::Tensor;

use crate::models::layers::{is_batch_norm_param, is_bias};

mod fused;

/// A trainable parameter and whether weight decay applies to it.
#[derive(Debug)]
pub struct Param {
    pub name: String,
    pub tensor: Tensor,
    pub decay: bool,
}

/// The hyperparameters of the update (the lr comes per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    pub momentum: f64,
    pub nesterov: bool,
    pub form: MomentumForm,
    pub weight_decay: f64,
    pub bn_weight_decay: bool,
    pub bias_weight_decay: bool,
}

impl SgdConfig {
    /// The recipe's update without a spec (benchmarks, tests): Goyal's momentum form with correction, no
    /// Nesterov, weight decay on weights only.
    pub fn goyal(momentum: f64, weight_decay: f64) -> SgdConfig {
        SgdConfig {
            momentum,
            nesterov: false,
            form: MomentumForm::Goyal,
            weight_decay,
            bn_weight_decay: false,
            bias_weight_decay: false,
        }
    }

    pub fn from_effective(eff: &Effective) -> SgdConfig {
        SgdConfig {
            momentum: eff.momentum,
            nesterov: eff.nesterov,
            form: eff.momentum_form,
            weight_decay: eff.weight_decay,
            bn_weight_decay: eff.bn_weight_decay,
            bias_weight_decay: eff.bias_weight_decay,
        }
    }
}

/// What a parameter is, for the weight-decay rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A BatchNorm gamma or beta: decayed only with `bn_weight_decay`.
    BatchNorm,
    /// A bias (for uploaded models: any 1-D parameter not of a BatchNorm): decayed only with `bias_weight_decay`.
    Bias,
    Weight,
}

/// The built-in models' rule: by name (their BatchNorms are named `bn*`, biases `*.bias`).
pub fn kind_by_name(name: &str, _tensor: &Tensor) -> ParamKind {
    if is_batch_norm_param(name) {
        ParamKind::BatchNorm
    } else if is_bias(name) {
        ParamKind::Bias
    } else {
        ParamKind::Weight
    }
}

/// The trainable variables of a VarStore, sorted by name: the one order every rank agrees on (for gradient
/// buckets, checkpoints and optimizer state). `kind_of` says which weight-decay rule each follows.
pub fn trainable_params(vs: &VarStore, config: &SgdConfig, kind_of: &dyn Fn(&str, &Tensor) -> ParamKind) -> Vec<Param> {
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
        .into_iter()
        .map(|(name, tensor)| {
            let decay = match kind_of(&name, &tensor) {
                ParamKind::BatchNorm => config.bn_weight_decay,
                ParamKind::Bias => config.bias_weight_decay,
                ParamKind::Weight => true,
            };
            Param { name, tensor, decay }
        })
        .collect()
}

/// The gradient of `t`, or zeros when backward did not reach it this step (so every rank treats an unused
/// parameter the same way).
pub fn grad_or_zeros(t: &Tensor) -> Tensor {
    let g = t.grad();
    if g.defined() {
        g
    } else {
        t.zeros_like()
    }
}

#[derive(Debug)]
pub struct Sgd {
    config: SgdConfig,
    params: Vec<Param>,
    momentum: Vec<Tensor>,
    /// The lr of the previous step: the denominator of the momentum correction.
    last_lr: Option<f64>,
    corrections: u64,
    /// Update contiguous float32 CPU parameters in one pass each ([`fused`]); the tensor ops otherwise.
    fused: bool,
}

impl Sgd {
    /// SGD over the built-in models' parameters (weight-decay rules by name).
    pub fn new(vs: &VarStore, config: SgdConfig) -> Sgd {
        Sgd::with_rules(vs, config, &kind_by_name)
    }

    /// SGD whose weight-decay rules come from `kind_of`.
    pub fn with_rules(vs: &VarStore, config: SgdConfig, kind_of: &dyn Fn(&str, &Tensor) -> ParamKind) -> Sgd {
        let params = trainable_params(vs, &config, kind_of);
        let momentum = params.iter().map(|p| p.tensor.zeros_like().detach()).collect();
        Sgd { config, params, momentum, last_lr: None, corrections: 0, fused: true }
    }

    /// The same optimizer taking every step with libtorch's tensor ops (the reference the fused step is
    /// tested against).
    pub fn with_tensor_ops(self) -> Sgd {
        Sgd { fused: false, ..self }
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Zeroes gradients in place (never sets them to undefined).
    pub fn zero_grad(&self) {
        for p in &self.params {
            let mut g = p.tensor.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// How many times momentum correction has scaled the buffers.
    pub fn corrections_applied(&self) -> u64 {
        self.corrections
    }

    /// This rank's gradients, zeros where backward did not reach a parameter.
    pub fn local_gradients(&self) -> Vec<Tensor> {
        self.params.iter().map(|p| grad_or_zeros(&p.tensor)).collect()
    }

    /// One update with learning rate `lr` and `grads` (one per parameter, in [`Sgd::params`] order: the
    /// all-reduced, k-normalised gradients). Returns the momentum-correction factor applied (1 when none).
    pub fn step(&mut self, lr: f64, grads: &[Tensor]) -> f64 {
        assert_eq!(grads.len(), self.params.len(), "one gradient per parameter");
        let c = self.config;
        let correction = match (c.form, self.last_lr) {
            (MomentumForm::Goyal, Some(previous)) if previous != lr && previous != 0.0 => lr / previous,
            _ => 1.0,
        };
        if correction != 1.0 {
            self.corrections += 1;
        }
        let scalars = fused::Scalars {
            form: c.form,
            nesterov: c.nesterov,
            lr: lr as f32,
            momentum: c.momentum as f32,
            momentum_scale: (c.momentum * correction) as f32,
            weight_decay: c.weight_decay as f32,
        };
        tch::no_grad(|| {
            for ((p, u), g) in self.params.iter_mut().zip(self.momentum.iter_mut()).zip(grads) {
                if !(self.fused && fused::update_in_place(&p.tensor, u, g, p.decay, &scalars)) {
                    update_with_tensor_ops(&c, lr, correction, p, u, g);
                }
            }
        });
        self.last_lr = Some(lr);
        correction
    }

    /// The momentum buffers, named like their parameters (for checkpoints).
    pub fn state(&self) -> Vec<(String, Tensor)> {
        self.params
            .iter()
            .zip(&self.momentum)
            .map(|(p, u)| (format!("momentum.{}", p.name), u.shallow_clone()))
            .collect()
    }

    /// Sets the lr of the last step taken (on resume: the denominator of the next momentum correction).
    pub fn set_last_lr(&mut self, lr: Option<f64>) {
        self.last_lr = lr;
    }

    /// Restores momentum buffers saved by [`Sgd::state`].
    pub fn load_state(&mut self, state: &[(String, Tensor)]) -> anyhow::Result<()> {
        for (p, u) in self.params.iter().zip(self.momentum.iter_mut()) {
            let key = format!("momentum.{}", p.name);
            let saved = state
                .iter()
                .find(|(name, _)| *name == key)
                .ok_or_else(|| anyhow::anyhow!("checkpoint has no {key}"))?;
            tch::no_grad(|| u.copy_(&saved.1));
        }
        Ok(())
    }
}

/// One parameter's update as libtorch tensor ops: any device, kind or layout (see [`fused`] for the fast
/// path, which takes the same steps).
fn update_with_tensor_ops(c: &SgdConfig, lr: f64, correction: f64, p: &mut Param, u: &mut Tensor, g: &Tensor) {
    // out of place: `g` may be the parameter's own .grad tensor
    let g = if p.decay && c.weight_decay != 0.0 { g + &p.tensor * c.weight_decay } else { g.shallow_clone() };
    let update = match c.form {
        MomentumForm::Pytorch => {
            *u *= c.momentum;
            *u += &g;
            let direction = if c.nesterov { &g + &*u * c.momentum } else { u.shallow_clone() };
            direction * lr
        }
        MomentumForm::Goyal => {
            let scaled_g = &g * lr;
            *u *= c.momentum * correction;
            *u += &scaled_g;
            if c.nesterov {
                scaled_g + &*u * c.momentum
            } else {
                u.shallow_clone()
            }
        }
    };
    p.tensor -= &update;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::layers::batch_norm;
    use tch::nn;
    use tch::{Device, Kind};

    fn config(form: MomentumForm, nesterov: bool) -> SgdConfig {
        SgdConfig { momentum: 0.9, nesterov, form, weight_decay: 0.01, bn_weight_decay: false, bias_weight_decay: true }
    }

    /// A linear layer followed by a BN, trained on fixed data with a changing lr; returns the final weights.
    fn train(form: MomentumForm, nesterov: bool, lrs: &[f64]) -> (Vec<f32>, u64) {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let fc = nn::linear(vs.root() / "fc", 4, 3, Default::default());
        let bn = nn::batch_norm1d(vs.root() / "bn", 3, Default::default());
        let mut opt = Sgd::new(&vs, config(form, nesterov));
        let x = Tensor::randn([8, 4], (Kind::Float, Device::Cpu));
        for &lr in lrs {
            opt.zero_grad();
            let loss = x.apply(&fc).apply_t(&bn, true).square().mean(Kind::Float);
            loss.backward();
            let grads = opt.local_gradients();
            opt.step(lr, &grads);
        }
        let w = Vec::<f32>::try_from(vs.variables()["fc.weight"].flatten(0, -1)).unwrap();
        (w, opt.corrections_applied())
    }

    #[test]
    fn goyal_form_with_correction_takes_the_pytorch_steps() {
        let lrs = [0.1, 0.2, 0.3, 0.3, 0.3, 0.03, 0.03, 0.003];
        for nesterov in [false, true] {
            let (pytorch, _) = train(MomentumForm::Pytorch, nesterov, &lrs);
            let (goyal, corrections) = train(MomentumForm::Goyal, nesterov, &lrs);
            for (a, b) in pytorch.iter().zip(&goyal) {
                assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "nesterov {nesterov}: {a} vs {b}");
            }
            // the lr changes at steps 1, 2, 5 and 7
            assert_eq!(corrections, 4);
        }
    }

    #[test]
    fn correction_factor_is_the_lr_ratio_and_only_when_lr_changes() {
        let vs = nn::VarStore::new(Device::Cpu);
        let _fc = nn::linear(vs.root() / "fc", 2, 2, Default::default());
        let mut opt = Sgd::new(&vs, config(MomentumForm::Goyal, false));
        let grads = opt.local_gradients();
        assert_eq!(opt.step(0.1, &grads), 1.0, "no previous lr");
        assert_eq!(opt.step(0.1, &grads), 1.0);
        assert!((opt.step(0.4, &grads) - 4.0).abs() < 1e-12);
        assert!((opt.step(0.04, &grads) - 0.1).abs() < 1e-12);
        assert_eq!(opt.corrections_applied(), 2);
        let mut pytorch = Sgd::new(&vs, config(MomentumForm::Pytorch, false));
        pytorch.step(0.1, &grads);
        assert_eq!(pytorch.step(0.5, &grads), 1.0, "the pytorch form never rescales momentum");
    }

    #[test]
    fn weight_decay_skips_batch_norm_gamma_and_beta() {
        let vs = nn::VarStore::new(Device::Cpu);
        let bn = batch_norm(vs.root() / "bn1", 3, false);
        let fc = nn::linear(vs.root() / "fc", 3, 3, Default::default());
        let mut opt = Sgd::new(&vs, config(MomentumForm::Pytorch, false));
        let decays: Vec<(&str, bool)> = opt.params().iter().map(|p| (p.name.as_str(), p.decay)).collect();
        assert_eq!(decays, vec![("bn1.bias", false), ("bn1.weight", false), ("fc.bias", true), ("fc.weight", true)]);

        // with every gradient zero, only weight decay moves parameters
        let gamma_before = bn.ws.as_ref().unwrap().copy();
        let fc_before = fc.ws.copy();
        let x = Tensor::randn([4, 3, 2, 2], (Kind::Float, Device::Cpu));
        (x.apply_t(&bn, true).sum(Kind::Float) * 0.0).backward();
        (fc.ws.sum(Kind::Float) * 0.0).backward();
        let grads = opt.local_gradients();
        opt.step(1.0, &grads);
        assert!(bn.ws.as_ref().unwrap().equal(&gamma_before), "gamma must not decay");
        assert!(!fc.ws.equal(&fc_before), "weights decay");
        let expected = &fc_before * (1.0 - 0.01);
        assert!(fc.ws.allclose(&expected, 1e-6, 1e-7, false));
    }

    #[test]
    fn parameters_without_gradients_still_get_momentum_and_decay() {
        let vs = nn::VarStore::new(Device::Cpu);
        let unused = nn::linear(vs.root() / "unused", 2, 2, Default::default());
        let before = unused.ws.copy();
        let mut opt = Sgd::new(&vs, config(MomentumForm::Pytorch, false));
        opt.zero_grad();
        let grads = opt.local_gradients();
        opt.step(0.5, &grads);
        assert!(unused.ws.allclose(&(&before * (1.0 - 0.5 * 0.01)), 1e-6, 1e-7, false));
    }

    /// Weights and momentum after a few steps with changing lrs (momentum corrections in the Goyal form),
    /// fused or with tensor ops, as bits.
    fn steps_taken(form: MomentumForm, nesterov: bool, weight_decay: f64, fused: bool) -> Vec<u32> {
        tch::manual_seed(3);
        let vs = nn::VarStore::new(Device::Cpu);
        let _fc = nn::linear(vs.root() / "fc", 37, 23, Default::default());
        let _bn = batch_norm(vs.root() / "bn1", 23, false);
        let mut opt = Sgd::new(&vs, SgdConfig { weight_decay, ..config(form, nesterov) });
        if !fused {
            opt = opt.with_tensor_ops();
        }
        for (i, lr) in [0.1, 0.2, 0.2, 0.05, 0.3, 0.3, 0.003].into_iter().enumerate() {
            tch::manual_seed(100 + i as i64);
            let grads: Vec<Tensor> = opt.params().iter().map(|p| p.tensor.randn_like()).collect();
            opt.step(lr, &grads);
        }
        let tensors =
            opt.params().iter().map(|p| p.tensor.shallow_clone()).chain(opt.momentum.iter().map(Tensor::shallow_clone));
        tensors.flat_map(|t| Vec::<f32>::try_from(t.detach().flatten(0, -1)).unwrap()).map(f32::to_bits).collect()
    }

    #[test]
    fn the_fused_step_is_the_tensor_op_step_bit_for_bit() {
        for form in [MomentumForm::Pytorch, MomentumForm::Goyal] {
            for nesterov in [false, true] {
                for weight_decay in [0.0, 1e-4, 0.01] {
                    let fused = steps_taken(form, nesterov, weight_decay, true);
                    let reference = steps_taken(form, nesterov, weight_decay, false);
                    assert_eq!(fused.len(), 37 * 23 + 23 + 2 * 23 + (37 * 23 + 23 + 2 * 23));
                    let differ = fused.iter().zip(&reference).filter(|(a, b)| a != b).count();
                    assert_eq!(differ, 0, "{form:?} nesterov {nesterov} wd {weight_decay}: {differ} values differ");
                }
            }
        }
        // and those steps were the fused ones: parameters like these take that path
        let (w, u, g) = (
            Tensor::ones([4], (Kind::Float, Device::Cpu)),
            Tensor::zeros([4], (Kind::Float, Device::Cpu)),
            Tensor::ones([4], (Kind::Float, Device::Cpu)),
        );
        let scalars = fused::Scalars {
            form: MomentumForm::Pytorch,
            nesterov: false,
            lr: 0.5,
            momentum: 0.9,
            momentum_scale: 0.9,
            weight_decay: 0.0,
        };
        assert!(fused::update_in_place(&w, &u, &g, true, &scalars));
        assert_eq!(Vec::<f32>::try_from(&w).unwrap(), [0.5; 4]);
        // a view that is not contiguous is left to the tensor ops
        let wide = Tensor::ones([4, 2], (Kind::Float, Device::Cpu));
        assert!(!fused::update_in_place(&wide.select(1, 0), &u, &g, true, &scalars));
    }
}
