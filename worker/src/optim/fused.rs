//! The SGD update of one parameter in one pass over its memory, for the usual case of
//! contiguous float32 tensors on the CPU. The tensor-op path ([`super::Sgd`]'s fallback) makes five to seven
//! libtorch calls per parameter, each a dispatch and most a new temporary; this reads the weight, the
//! gradient and the momentum once and writes the weight and the momentum once.
//!
//! It does the same float32 operations in the same order as the tensor ops, each rounded once (libtorch
//! casts a double scalar to float32 before multiplying a float tensor by it; its `add`/`sub` with alpha ±1
//! round once even where they use an FMA; Rust never contracts `a + b * c` into one), so the result is the
//! same bits: `optim::tests::the_fused_step_is_the_tensor_op_step_bit_for_bit`.
//!
//! Writing through the data pointer skips autograd's version counter; nothing holds a graph across the
//! optimizer step (backward has run, the next forward builds a new one), so nothing can notice.

#![allow(unsafe_code)] // the tensors' memory, as slices

use ringtrain_core::spec::MomentumForm;
use tch::{Device, Kind, Tensor};

/// One step's scalars, as float32 (as libtorch uses them on float32 tensors).
#[derive(Debug, Clone, Copy)]
pub(super) struct Scalars {
    pub form: MomentumForm,
    pub nesterov: bool,
    pub lr: f32,
    pub momentum: f32,
    /// What the momentum buffer is multiplied by first: the momentum, times the correction in the Goyal form.
    pub momentum_scale: f32,
    pub weight_decay: f32,
}

/// A tensor's elements as a slice, when it is a contiguous float32 CPU tensor.
fn floats(t: &Tensor) -> Option<(*mut f32, usize)> {
    let plain = t.device() == Device::Cpu && t.kind() == Kind::Float && t.is_contiguous() && t.defined();
    plain.then(|| (t.data_ptr().cast::<f32>(), t.numel()))
}

/// Updates weight `w` and momentum `u` in place from gradient `g` (weight decay when `decay`); false, having
/// touched nothing, when the tensors are not three distinct contiguous float32 CPU tensors of one size (the
/// caller then takes the tensor-op path).
pub(super) fn update_in_place(w: &Tensor, u: &Tensor, g: &Tensor, decay: bool, s: &Scalars) -> bool {
    let (Some((w, n)), Some((u, nu)), Some((g, ng))) = (floats(w), floats(u), floats(g)) else {
        return false;
    };
    if n != nu || n != ng || w == u || w == g || u == g {
        return false;
    }
    // SAFETY: each pointer is the start of a contiguous float32 CPU buffer of n elements that its tensor
    // keeps alive for this call; the three are distinct tensors' buffers (checked above; parameters, their
    // momentum buffers and gradients never overlap), and no other thread touches them during the step.
    let (w, u, g) = unsafe {
        (std::slice::from_raw_parts_mut(w, n), std::slice::from_raw_parts_mut(u, n), std::slice::from_raw_parts(g, n))
    };
    let wd = if decay && s.weight_decay != 0.0 { Some(s.weight_decay) } else { None };
    for ((w, u), &g) in w.iter_mut().zip(u.iter_mut()).zip(g) {
        let g = match wd {
            Some(wd) => g + *w * wd,
            None => g,
        };
        let step = match s.form {
            MomentumForm::Pytorch => {
                *u = *u * s.momentum_scale + g;
                let direction = if s.nesterov { g + *u * s.momentum } else { *u };
                direction * s.lr
            }
            MomentumForm::Goyal => {
                let scaled_g = g * s.lr;
                *u = *u * s.momentum_scale + scaled_g;
                if s.nesterov {
                    scaled_g + *u * s.momentum
                } else {
                    *u
                }
            }
        };
        *w -= step;
    }
    true
}
