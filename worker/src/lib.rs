//! The training engine: the only crate that links libtorch.
