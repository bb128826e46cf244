//! A sharded data set's index, `index.json` beside its shards: what a reader trusts before it opens one.
//!
//! ```json
//! {"format": "ringtrain-shards/1", "kind": "images", "classes": ["cat", "dog"],
//!  "normalize": {"mean": [0.49, 0.48, 0.45], "std": [0.25, 0.24, 0.26]},
//!  "train": {"samples": 1200, "shards": [{"name": "train-000000.tar", "bytes": 67108864, "samples": 600,
//!                                          "sha256": "…"}, …]},
//!  "test": {"samples": 200, "shards": […]}}
//! ```
//!
//! Every field is checked ([`DatasetIndex::check`]) and a problem names its field: an index that lies
//! (counts that do not add up, a shard name that would leave the data set's folder) is refused before
//! anything is read.

use serde::{Deserialize, Serialize};

/// The format this crate reads and writes.
pub const FORMAT: &str = "ringtrain-shards/1";

/// What the samples are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SampleKind {
    /// `KEY.jpg` (or `.jpeg`, `.png`) with `KEY.cls`, the class index as decimal text.
    Images,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetIndex {
    pub format: String,
    pub kind: SampleKind,
    /// The class names, by index (an image folder's sub-folder names, sorted).
    pub classes: Vec<String>,
    /// Per-channel statistics of the pixels (in [0, 1]) the pipeline normalises with.
    pub normalize: Normalize,
    pub train: SplitIndex,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<SplitIndex>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Normalize {
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitIndex {
    pub samples: u64,
    pub shards: Vec<ShardInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardInfo {
    /// A file name in the data set's folder (or under its prefix in a bucket): no folder, no `..`.
    pub name: String,
    pub bytes: u64,
    pub samples: u64,
    /// Of the whole shard file, lowercase hex.
    pub sha256: String,
}

/// A problem of an index, naming the field: `train.shards[3].sha256: ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct IndexError {
    pub field: String,
    pub reason: String,
}

fn problem(field: impl Into<String>, reason: impl Into<String>) -> IndexError {
    IndexError { field: field.into(), reason: reason.into() }
}

/// At most this many classes (ImageNet-21k has 21,841).
pub const MAX_CLASSES: usize = 100_000;

impl DatasetIndex {
    /// Parses and checks an index.
    pub fn from_json(text: &str) -> Result<DatasetIndex, Vec<IndexError>> {
        let index: DatasetIndex = serde_json::from_str(text).map_err(|e| vec![problem("index.json", e.to_string())])?;
        index.check()?;
        Ok(index)
    }

    /// Every problem of the index, each naming its field.
    pub fn check(&self) -> Result<(), Vec<IndexError>> {
        let mut problems = Vec::new();
        if self.format != FORMAT {
            problems.push(problem("format", format!("must be {FORMAT:?} (got {:?})", self.format)));
        }
        if self.classes.is_empty() || self.classes.len() > MAX_CLASSES {
            problems
                .push(problem("classes", format!("must name 1 to {MAX_CLASSES} classes (got {})", self.classes.len())));
        }
        for (channel, (&mean, &std)) in self.normalize.mean.iter().zip(&self.normalize.std).enumerate() {
            if !(0.0..=1.0).contains(&mean) {
                problems.push(problem(format!("normalize.mean[{channel}]"), format!("must be in [0, 1] (got {mean})")));
            }
            if !(std > 0.0 && std <= 1.0) {
                problems.push(problem(format!("normalize.std[{channel}]"), format!("must be in (0, 1] (got {std})")));
            }
        }
        self.train.check("train", &mut problems);
        if let Some(test) = &self.test {
            test.check("test", &mut problems);
        }
        let mut names: Vec<&str> = self.splits().flat_map(|(_, s)| s.shards.iter().map(|s| s.name.as_str())).collect();
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
            problems.push(problem("shards", format!("{} is listed twice", pair[0])));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// The splits with their names.
    pub fn splits(&self) -> impl Iterator<Item = (&'static str, &SplitIndex)> {
        std::iter::once(("train", &self.train)).chain(self.test.iter().map(|t| ("test", t)))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl SplitIndex {
    fn check(&self, split: &str, problems: &mut Vec<IndexError>) {
        if self.shards.is_empty() {
            problems.push(problem(format!("{split}.shards"), "must list at least one shard"));
        }
        let counted: u64 = self.shards.iter().map(|s| s.samples).sum();
        if counted != self.samples {
            problems.push(problem(
                format!("{split}.samples"),
                format!("is {} but its shards hold {counted} samples", self.samples),
            ));
        }
        for (i, shard) in self.shards.iter().enumerate() {
            let field = |name: &str| format!("{split}.shards[{i}].{name}");
            if let Err(why) = check_name(&shard.name) {
                problems.push(problem(field("name"), why));
            }
            if shard.samples == 0 {
                problems.push(problem(field("samples"), "a shard holds at least one sample"));
            }
            // a tar member is a 512-byte header and at least one block of data, and a sample two members
            if shard.bytes < shard.samples.saturating_mul(2 * 1024) {
                problems.push(problem(
                    field("bytes"),
                    format!("{} bytes cannot hold {} samples", shard.bytes, shard.samples),
                ));
            }
            if shard.sha256.len() != 64
                || !shard.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                problems.push(problem(field("sha256"), "must be 64 lowercase hex digits"));
            }
        }
    }

    /// The first sample of each shard (samples are numbered through the split, shard by shard).
    pub fn first_samples(&self) -> Vec<u64> {
        self.shards
            .iter()
            .scan(0u64, |next, s| {
                let first = *next;
                *next += s.samples;
                Some(first)
            })
            .collect()
    }

    /// The samples each shard holds, in order.
    pub fn shard_samples(&self) -> Vec<u64> {
        self.shards.iter().map(|s| s.samples).collect()
    }
}

/// A shard's name is a plain file name ending in `.tar`: no folder, nothing hidden, nothing that could
/// leave the data set's folder or prefix.
pub fn check_name(name: &str) -> Result<(), String> {
    let plain = name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if name.is_empty() || name.len() > 200 || !plain || name.starts_with('.') || name.contains("..") {
        return Err(format!("{name:?} is not a plain file name (letters, digits, - _ and ., at most 200)"));
    }
    if !name.ends_with(".tar") {
        return Err(format!("{name:?} does not end in .tar"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(name: &str, samples: u64) -> ShardInfo {
        ShardInfo { name: name.into(), bytes: samples * 4096, samples, sha256: "ab".repeat(32) }
    }

    pub(crate) fn index() -> DatasetIndex {
        DatasetIndex {
            format: FORMAT.into(),
            kind: SampleKind::Images,
            classes: vec!["a".into(), "b".into()],
            normalize: Normalize { mean: [0.5; 3], std: [0.25; 3] },
            train: SplitIndex { samples: 30, shards: vec![shard("train-0.tar", 10), shard("train-1.tar", 20)] },
            test: Some(SplitIndex { samples: 5, shards: vec![shard("test-0.tar", 5)] }),
        }
    }

    #[test]
    fn a_sound_index_reads_back_and_numbers_its_samples_shard_by_shard() {
        let index = index();
        assert_eq!(DatasetIndex::from_json(&index.to_json()).unwrap(), index);
        assert_eq!(index.train.first_samples(), vec![0, 10]);
    }

    #[test]
    fn an_index_that_lies_is_refused_naming_each_field() {
        let mut index = index();
        index.train.samples = 31;
        index.train.shards[1].name = "../../etc/passwd.tar".into();
        index.train.shards[0].sha256 = "XYZ".into();
        index.test.as_mut().unwrap().shards[0].name = "train-0.tar".into();
        index.test.as_mut().unwrap().shards[0].bytes = 100;
        index.normalize.std[1] = 0.0;
        let fields: Vec<String> = index.check().unwrap_err().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "normalize.std[1]",
                "train.samples",
                "train.shards[0].sha256",
                "train.shards[1].name",
                "test.shards[0].bytes",
                "shards"
            ]
        );
        assert!(DatasetIndex::from_json("{\"format\": 1}").unwrap_err()[0].field == "index.json");
    }

    #[test]
    fn shard_names_stay_in_their_folder() {
        for bad in ["", "a/b.tar", ".hidden.tar", "x..tar", "shard.zip", "a b.tar", "\u{e9}.tar"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("train-000123.tar").is_ok());
    }
}
