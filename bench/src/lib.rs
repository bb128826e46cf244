//! Benchmarks of ringtrain's services, out of the product's libraries (the api, store and scheduler crates
//! export none; `scripts/test.sh` checks it): [`api_load`], a load generator for a running server;
//! [`store_scale`], the metrics table and the run history at scale; [`plan_pass`], one pass of the
//! placement policy on a synthetic cluster. `ringtrain bench api|metrics|history|scheduler` and this
//! crate's examples (which need no libtorch) run them.

pub mod api_load;
pub mod plan_pass;
pub mod store_scale;
