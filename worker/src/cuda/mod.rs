//! The CUDA and NCCL libraries, loaded at run time: the one place (with the autocast binding in
//! [`crate::precision`]) where ringtrain calls C. Nothing here is needed to build: a CPU machine compiles
//! and tests all of it without a CUDA toolkit, and a GPU binary finds the libraries its libtorch brought:
//!
//! - [`nccl`]: `libnccl.so.2`, the file name of PyPI's `nvidia-nccl-cu13` wheel and the SONAME that
//!   `libtorch_cuda.so` already loaded, so the process holds exactly one NCCL, the one torch was built with;
//! - [`runtime`]: `libcudart` (events on the default stream, which is tch's stream: tch has no stream API,
//!   so every kernel libtorch launches for us goes to the legacy default stream, and so do NCCL's);
//! - [`driver`]: `libcuda.so.1` (device names and memory for `ringtrain doctor`, and why CUDA is missing).
#![allow(unsafe_code)]

pub mod driver;
mod library;
pub mod nccl;
pub mod runtime;

pub use library::is_loaded;
