//! Benchmarks of ringtrain, out of the product (the api, store and scheduler crates export none, and the
//! `ringtrain` binary keeps only what measures the user's machine; `scripts/test.sh` checks the first):
//! [`api_load`], a load generator for a running server; [`store_scale`], the metrics table and the run
//! history at scale; [`plan_pass`], one pass of the placement policy on a synthetic cluster; [`python`],
//! what a comparison with PyTorch needs. The `ringtrain-bench` binary (`src/main.rs`, its subcommands in
//! `src/commands/`) runs them and the benchmarks that start a platform of `ringtrain` processes; this
//! crate's examples (which need no libtorch) run the first three too.

pub mod api_load;
pub mod plan_pass;
pub mod python;
pub mod store_scale;
