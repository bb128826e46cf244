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
    /// A sharded data set: the folder (on a filesystem every node mounts) or the `s3://BUCKET/PREFIX` of an
    /// S3-compatible bucket holding `index.json` and the shards `ringtrain datasets pack` writes; streamed,
    /// never held whole. A bucket's data set is copied into each node's cache by its agent.
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

    /// A folder on the nodes' filesystems (`idx:` or `shards:`) or a bucket's prefix (`shards:s3://`), which
    /// only granted roots may hold.
    pub fn node_path(&self) -> Option<&str> {
        match self {
            DatasetRef::Idx { path } | DatasetRef::Shards { path } => Some(path),
            _ => None,
        }
    }

    /// The bucket's URL of a `shards:s3://BUCKET/PREFIX` data set.
    pub fn bucket_url(&self) -> Option<&str> {
        match self {
            DatasetRef::Shards { path } if path.starts_with(S3_SCHEME) => Some(path),
            _ => None,
        }
    }
}

/// How a data set or a root in an S3-compatible bucket is written: `s3://BUCKET/PREFIX`.
pub const S3_SCHEME: &str = "s3://";

/// A bucket's URL split into its bucket and its key prefix (without a trailing `/`), when it is one: a
/// bucket name of 3 to 63 lowercase letters, digits, dots and hyphens (starting and ending with a letter
/// or a digit, as S3 names them) and a prefix of parts none of which is empty or starts with a dot.
pub fn parse_bucket_url(url: &str) -> Result<(&str, &str), String> {
    let Some(rest) = url.strip_prefix(S3_SCHEME) else { return Err(format!("{url:?} is not an s3:// URL")) };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && edge(bucket.chars().next())
        && edge(bucket.chars().last());
    if !bucket_ok {
        return Err(format!(
            "{url:?}: a bucket name is 3 to 63 lowercase letters, digits, dots and hyphens, starting and ending \
             with a letter or a digit"
        ));
    }
    let prefix_ok = prefix.is_empty()
        || prefix.split('/').all(|part| !part.is_empty() && !part.starts_with('.') && !part.contains('\0'));
    if !prefix_ok || url.len() > 4096 {
        return Err(format!("{url:?}: the prefix's parts must not be empty or start with a dot"));
    }
    Ok((bucket, prefix))
}

/// Whether `path` lies inside `root`, part by part (so `/data/a` is not inside `/data/ab`, nor
/// `s3://b/p2` inside `s3://b/p`); lexical only.
fn inside(path: &str, root: &std::path::Path) -> bool {
    std::path::Path::new(path).starts_with(root)
}

/// Whether an `idx:` or `shards:` path may be read: an absolute path, without `.` or `..` parts, or an
/// `s3://BUCKET/PREFIX` (only `shards:`), inside one of `roots` (the folders and bucket prefixes a platform
/// admin allowed). Lexical only: the server cannot see the workers' file systems; each agent checks the
/// resolved path (links followed) against its own roots before a rank reads it. The reason never
/// describes the file system.
pub fn check_idx_path(path: &str, roots: &[std::path::PathBuf]) -> Result<(), String> {
    use std::path::{Component, Path};
    if roots.is_empty() {
        return Err("idx: and shards: datasets are not enabled here (a platform admin grants folders and buckets \
                    with --idx-root or a team's data_roots)"
            .into());
    }
    let plain = if path.starts_with(S3_SCHEME) {
        parse_bucket_url(path)?;
        true
    } else {
        let path = Path::new(path);
        path.is_absolute() && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    };
    if plain && roots.iter().any(|root| inside(path, root)) {
        Ok(())
    } else {
        let allowed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        Err(format!(
            "idx: and shards: paths must be absolute, without . or .., or s3:// URLs, inside {}",
            allowed.join(" or ")
        ))
    }
}

/// Whether `root` may be granted as a data root: an absolute path of at most 4,096 bytes, none of whose
/// parts starts with a dot (so no `.` or `..`, no hidden folder), not `/` itself; or a bucket, or a prefix
/// in one, `s3://BUCKET[/PREFIX]` ([`parse_bucket_url`]).
pub fn check_data_root(root: &str) -> Result<(), String> {
    if root.starts_with(S3_SCHEME) {
        return parse_bucket_url(root).map(|_| ());
    }
    let parts: Vec<&str> = root.split('/').collect();
    let plain = root.starts_with('/')
        && parts.len() >= 2
        && parts[1..].iter().all(|p| !p.is_empty() && !p.starts_with('.'))
        && !root.contains('\0');
    if !plain || root.len() > 4096 {
        return Err(format!(
            "{root:?} must be an absolute folder none of whose parts starts with a dot (not /), or s3://BUCKET[/PREFIX]"
        ));
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
            if path.is_empty() {
                return Err(DatasetParseError(
                    "shards: needs the folder or bucket prefix of a packed data set, e.g. shards:/data/imagenet \
                     or shards:s3://datasets/imagenet"
                        .into(),
                ));
            }
            if path.starts_with(S3_SCHEME) {
                parse_bucket_url(path).map_err(DatasetParseError)?;
            }
            return Ok(DatasetRef::Shards { path: path.to_string() });
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

    #[test]
    fn bucket_paths_stay_inside_the_granted_prefixes() {
        let roots = [PathBuf::from("s3://datasets/team-a"), PathBuf::from("/data/shared")];
        assert!(check_idx_path("s3://datasets/team-a/imagenet", &roots).is_ok());
        assert!(check_idx_path("s3://datasets/team-a", &roots).is_ok());
        for bad in [
            "s3://datasets/team-ab/imagenet",
            "s3://datasets/team-a/../team-b",
            "s3://datasets/team-a/.hidden",
            "s3://other/team-a/x",
            "s3://Datasets/team-a/x",
            "s3://datasets//team-a/x",
        ] {
            assert!(check_idx_path(bad, &roots).is_err(), "{bad}");
        }
    }

    #[test]
    fn bucket_roots_are_checked_like_folders() {
        use super::{check_data_root, parse_bucket_url};
        assert_eq!(parse_bucket_url("s3://data-sets.x/a/b/"), Ok(("data-sets.x", "a/b")));
        assert_eq!(parse_bucket_url("s3://abc"), Ok(("abc", "")));
        for good in ["s3://abc", "s3://datasets/team-a", "/data/team-a"] {
            assert!(check_data_root(good).is_ok(), "{good}");
        }
        for bad in ["s3://ab", "s3://-abc", "s3://ABC/x", "s3://abc/.x", "s3://abc//x", "s3:/abc", "/", "/a/../b"] {
            assert!(check_data_root(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_form() {
        for text in [
            "fashion-mnist",
            "synthetic",
            "synthetic:100",
            "idx:/data/x",
            "shards:/data/x",
            "shards:s3://datasets/imagenet",
            "3f2504e0-4f89-41d3-9a0c-0305e82c3301",
        ] {
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
        assert!("shards:s3://A/x".parse::<DatasetRef>().unwrap_err().to_string().contains("bucket name"));
    }
}
