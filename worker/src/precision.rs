//! `precision: bf16`: forward passes run under libtorch's autocast with bfloat16 as the low-precision type
//! (convolutions and matrix products in bf16, the ops ATen's autocast lists keep in f32 in f32; the loss is
//! computed in f32 from the bf16 logits, as tch's cross entropy asks log_softmax for f32). Weights, gradients, the all-reduce and the optimizer stay f32: autocast casts weights on the
//! fly (cached within one forward) and backward returns f32 gradients for f32 leaves. BatchNorm keeps its
//! f32 running statistics (ATen's batch norm accepts bf16 inputs with f32 parameters).
//!
//! tch's own `autocast` reaches only the deprecated CUDA switch, whose type is fp16, and nothing for CPUs,
//! so the switch is a few lines of C++ (csrc/autocast.cpp) compiled by build.rs.
#![allow(unsafe_code)]

use std::ffi::c_int;

use ringtrain_core::spec::Precision;
use tch::Device;

extern "C" {
    fn ringtrain_autocast_enter(cuda: c_int) -> c_int;
    fn ringtrain_autocast_exit(cuda: c_int, was_enabled: c_int) -> c_int;
}

/// Runs `f` (a forward pass) in `precision` on `device`.
pub fn forward_in<T>(precision: Precision, device: Device, f: impl FnOnce() -> T) -> T {
    match precision {
        Precision::Fp32 => f(),
        Precision::Bf16 => {
            let _guard = AutocastGuard::enter(device);
            f()
        }
    }
}

/// Autocast on for one device type while alive (restored on drop, panics included).
struct AutocastGuard {
    cuda: c_int,
    was_enabled: c_int,
}

impl AutocastGuard {
    fn enter(device: Device) -> AutocastGuard {
        let cuda = c_int::from(device.is_cuda());
        // SAFETY: the shim takes and returns plain ints, touches only ATen's thread-local autocast state, and
        // catches every C++ exception (returning -1), so none unwinds into Rust.
        let was_enabled = unsafe { ringtrain_autocast_enter(cuda) };
        assert!(was_enabled >= 0, "libtorch refused to enable bf16 autocast on {device:?}");
        AutocastGuard { cuda, was_enabled }
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        // SAFETY: as in `enter`. It leaves the nesting level `enter` entered on this thread (the guard is a
        // local of `forward_in`, dropped on the thread that made it).
        unsafe { ringtrain_autocast_exit(self.cuda, self.was_enabled) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    #[test]
    fn bf16_matmuls_run_in_bf16_and_fp32_is_untouched() {
        let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        let low = forward_in(Precision::Bf16, Device::Cpu, || a.matmul(&a));
        assert_eq!(low.kind(), Kind::BFloat16);
        // the loss is computed in f32 (tch's cross entropy asks log_softmax for f32) from bf16 logits
        let targets = Tensor::from_slice(&[0i64, 1, 2, 3]);
        let loss = forward_in(Precision::Bf16, Device::Cpu, || a.matmul(&a).cross_entropy_for_logits(&targets));
        assert_eq!(loss.kind(), Kind::Float);
        // and autocast is off again afterwards
        assert_eq!(a.matmul(&a).kind(), Kind::Float);
        assert_eq!(forward_in(Precision::Fp32, Device::Cpu, || a.matmul(&a)).kind(), Kind::Float);
    }
}
