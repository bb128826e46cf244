//! Which data a job trains on, written as one string in the spec.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

use crate::ids::DatasetId;

/// The dataset of a job: `fashion-mnist`, `synthetic[:N]`, `idx:PATH`, or the UUID of an uploaded dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetRef {
    /// Fashion-MNIST from Debian's `dataset-fashion-mnist` (60k train / 10k test, 1x28x28, 10 classes).
    FashionMnist,
    /// Seeded random data for tests: N training samples (default [`SYNTHETIC_DEFAULT_SIZE`]).
    Synthetic { train_size: u64 },
    /// A directory of MNIST-format IDX files (gzipped or not).
    Idx { path: String },
    /// A sharded data set on a filesystem every node mounts: its folder, with `index.json` and the shards
    /// `ringtrain datasets pack` writes; streamed, never held whole (issue 55).
    Shards { path: String },
    /// A safetensors dataset uploaded through the API.
    Uploaded(DatasetId),
}

pub const SYNTHETIC_DEFAULT_SIZE: u64 = 2048;
pub const FASHION_MNIST_TRAIN_SIZE: u64 = 60_000;
pub const FASHION_MNIST_TEST_SIZE: u64 = 10_000;

/// Samples an uploaded dataset without `x_test`/`y_test` holds out of its `n` as the test split (the last
/// 10%, at least one): the worker trains on the rest, and the API's schedule counts only those.
pub fn held_out_test_samples(n: u64) -> u64 {
    (n / 10).max(1)
}

impl DatasetRef {
    /// The number of training samples when it is known without reading any file.
    pub fn known_train_size(&self) -> Option<u64> {
        match self {
            DatasetRef::FashionMnist => Some(FASHION_MNIST_TRAIN_SIZE),
            DatasetRef::Synthetic { train_size } => Some(*train_size),
            DatasetRef::Idx { .. } | DatasetRef::Shards { .. } | DatasetRef::Uploaded(_) => None,
        }
    }

    /// A folder on the nodes' filesystems (`idx:` or `shards:`), which only granted roots may hold.
    pub fn node_path(&self) -> Option<&str> {
        match self {
            DatasetRef::Idx { path } | DatasetRef::Shards { path } => Some(path),
            _ => None,
        }
    }
}

/// Whether an `idx:` or `shards:` path may be read: an absolute path, without `.` or `..` parts, inside one of `roots`
/// (the folders a platform admin allowed). Lexical only: the server cannot see the workers' file systems;
/// each agent checks the resolved path (links followed) against its own roots before a rank reads it.
/// The reason never describes the file system.
pub fn check_idx_path(path: &str, roots: &[std::path::PathBuf]) -> Result<(), String> {
    use std::path::{Component, Path};
    if roots.is_empty() {
        return Err(
            "idx: and shards: datasets are not enabled here (a platform admin allows folders with --idx-root)".into()
        );
    }
    let path = Path::new(path);
    let plain = path.is_absolute() && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if plain && roots.iter().any(|root| path.starts_with(root)) {
        Ok(())
    } else {
        let allowed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        Err(format!("idx: and shards: paths must be absolute, without . or .., inside {}", allowed.join(" or ")))
    }
}

/// Whether `root` may be granted as a data root: an absolute path of at most 4,096 bytes, none of whose
/// parts starts with a dot (so no `.` or `..`, no hidden folder), not `/` itself.
pub fn check_data_root(root: &str) -> Result<(), String> {
    let parts: Vec<&str> = root.split('/').collect();
    let plain = root.starts_with('/')
        && parts.len() >= 2
        && parts[1..].iter().all(|p| !p.is_empty() && !p.starts_with('.'))
        && !root.contains('\0');
    if !plain || root.len() > 4096 {
        return Err(format!("{root:?} must be an absolute folder none of whose parts starts with a dot (not /)"));
    }
    Ok(())
}

/// Why a dataset string was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DatasetParseError(String);

impl FromStr for DatasetRef {
    type Err = DatasetParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "fashion-mnist" {
            return Ok(DatasetRef::FashionMnist);
        }
        if text == "synthetic" {
            return Ok(DatasetRef::Synthetic { train_size: SYNTHETIC_DEFAULT_SIZE });
        }
        if let Some(size) = text.strip_prefix("synthetic:") {
            return match size.parse::<u64>() {
                Ok(n) if (1..=10_000_000).contains(&n) => Ok(DatasetRef::Synthetic { train_size: n }),
                _ => Err(DatasetParseError(format!(
                    "synthetic size must be an integer from 1 to 10000000 (got {size:?})"
                ))),
            };
        }
        if let Some(path) = text.strip_prefix("idx:") {
            return if path.is_empty() {
                Err(DatasetParseError("idx: needs a directory path, e.g. idx:/data/mnist".into()))
            } else {
                Ok(DatasetRef::Idx { path: path.to_string() })
            };
        }
        if let Some(path) = text.strip_prefix("shards:") {
            return if path.is_empty() {
                Err(DatasetParseError(
                    "shards: needs the folder of a packed data set, e.g. shards:/data/imagenet".into(),
                ))
            } else {
                Ok(DatasetRef::Shards { path: path.to_string() })
            };
        }
        if let Ok(id) = Uuid::parse_str(text) {
            return Ok(DatasetRef::Uploaded(DatasetId(id)));
        }
        Err(DatasetParseError(format!(
            "unknown dataset {text:?}; expected fashion-mnist, synthetic[:N], idx:PATH, shards:PATH or the id of an uploaded dataset"
        )))
    }
}

impl fmt::Display for DatasetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatasetRef::FashionMnist => f.write_str("fashion-mnist"),
            DatasetRef::Synthetic { train_size } if *train_size == SYNTHETIC_DEFAULT_SIZE => f.write_str("synthetic"),
            DatasetRef::Synthetic { train_size } => write!(f, "synthetic:{train_size}"),
            DatasetRef::Idx { path } => write!(f, "idx:{path}"),
            DatasetRef::Shards { path } => write!(f, "shards:{path}"),
            DatasetRef::Uploaded(id) => write!(f, "{id}"),
        }
    }
}

impl Serialize for DatasetRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DatasetRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod idx_tests {
    use super::check_idx_path;
    use std::path::PathBuf;

    #[test]
    fn idx_paths_stay_inside_the_allowed_roots() {
        let roots = [PathBuf::from("/data/shared"), PathBuf::from("/mnt/team-a")];
        assert!(check_idx_path("/data/shared/mnist", &roots).is_ok());
        for bad in ["/etc", "/data/shared/../../etc", "relative/mnist", "/data/sharedother"] {
            assert!(check_idx_path(bad, &roots).is_err(), "{bad}");
        }
        assert!(check_idx_path("/data/shared/mnist", &[]).unwrap_err().contains("not enabled"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_form() {
        for text in
            ["fashion-mnist", "synthetic", "synthetic:100", "idx:/data/x", "3f2504e0-4f89-41d3-9a0c-0305e82c3301"]
        {
            let parsed: DatasetRef = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn rejects_unknown_names_and_bad_sizes() {
        assert!("cifar".parse::<DatasetRef>().unwrap_err().to_string().contains("unknown dataset"));
        assert!("synthetic:0".parse::<DatasetRef>().is_err());
        assert!("synthetic:x".parse::<DatasetRef>().is_err());
        assert!("idx:".parse::<DatasetRef>().is_err());
    }
}
