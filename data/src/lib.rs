//! Sharded data sets, for training on data larger than memory.
//!
//! - [`index`]: the shard format's index (`index.json`: the splits, their shards with sizes, sample counts
//!   and checksums, the class names, the per-channel statistics) and its checks;
//! - [`shard`]: one shard, a POSIX tar of WebDataset-style samples (`KEY.jpg` or `KEY.png` beside
//!   `KEY.cls`, or `KEY.x.NAME.npy` for named inputs), read by member offsets so a reader takes only the samples it needs;
//! - [`pack`]: an image folder (one sub-folder per class, the torchvision and ImageNet layout) into shards;
//! - [`pack_tensors`]: a safetensors data set of named tensors (an upload's layout) into shards;
//! - [`safetensors`]: writing a safetensors file (without libtorch);
//! - [`order`]: which sample comes when in an epoch, a function of the seed and the epoch alone;
//! - [`npy`]: one sample's tensor as a NumPy `.npy` member (shards of named tensors);
//! - [`image`]: decoding (JPEG, PNG) and Goyal's augmentation, into CHW bytes;
//! - [`loader`]: a rank's batches, decoded ahead on a pool of threads, in the order the epoch asks for;
//! - [`stream`]: what a rank says to its agent about the shards it will open, while a bucket's shards
//!   are fetched into the node's cache ahead of it, and the rank's wait for them;
//! - [`synthetic`]: seeded synthetic photographs as JPEGs, for the benchmark and the tests.

#[cfg(feature = "bucket")]
pub mod bucket;
pub mod image;
pub mod index;
pub mod loader;
pub mod npy;
pub mod order;
pub mod pack;
pub mod pack_tensors;
pub mod safetensors;
pub mod shard;
pub mod stream;
pub mod synthetic;

pub use index::{DatasetIndex, ShardInfo, SplitIndex};
pub use order::EpochOrder;
