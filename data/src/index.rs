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
//! A data set of named tensors (`"kind": "tensors"`, for uploaded models) lists its inputs instead of the
//! pixel statistics, and either class names or the shape of the values its labels are:
//!
//! ```json
//! {"format": "ringtrain-shards/1", "kind": "tensors", "classes": [],
//!  "inputs": [{"name": "numeric", "dtype": "f32", "shape": [8]}, {"name": "tokens", "dtype": "i64", "shape": [16]}],
//!  "values": [], "train": {…}, "test": {…}}
//! ```
//!
//! Every field is checked ([`DatasetIndex::check`]) and a problem names its field: an index that lies
//! (counts that do not add up, a shard name that would leave the data set's folder) is refused before
//! anything is read.

use serde::{Deserialize, Serialize};

use crate::npy::Dtype;

/// The format this crate reads and writes.
pub const FORMAT: &str = "ringtrain-shards/1";

/// What the samples are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SampleKind {
    /// `KEY.jpg` (or `.jpeg`, `.png`) with `KEY.cls`, the class index as decimal text.
    Images,
    /// `KEY.x.NAME.npy` for each input, with `KEY.cls` (a class) or `KEY.y.npy` (values, f32).
    Tensors,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetIndex {
    pub format: String,
    pub kind: SampleKind,
    /// The class names, by index (an image folder's sub-folder names, sorted).
    pub classes: Vec<String>,
    /// Per-channel statistics of the pixels (in [0, 1]) the pipeline normalises with: images only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<Normalize>,
    /// Each sample's named tensors, in the order they were packed: tensors only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<TensorSpec>,
    /// The shape of one sample's values (`[]` or `[M]`, f32) when the labels are values to regress rather
    /// than classes (then `classes` is empty): tensors only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<u64>>,
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

/// One named input of a data set of tensors: what each sample's `KEY.x.NAME.npy` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    /// One sample's shape (without the batch's dimension).
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// The bytes of one sample's elements.
    pub fn sample_bytes(&self) -> u64 {
        self.shape.iter().product::<u64>().saturating_mul(self.dtype.size() as u64)
    }
}

/// The most bytes one sample's tensor may hold (a 1024×1024×16 f32 volume): a batch is assembled in memory.
pub const MAX_TENSOR_BYTES: u64 = 64 << 20;

/// At most this many named inputs.
pub const MAX_INPUTS: usize = 64;

/// Whether `name` may name an input (as an upload's `x.NAME`): 1 to 100 letters, digits or underscores.
pub fn input_name_ok(name: &str) -> bool {
    !name.is_empty() && name.len() <= 100 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
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
        let values = self.kind == SampleKind::Tensors && self.values.is_some();
        if values && !self.classes.is_empty() {
            problems.push(problem("classes", "must be empty when the labels are values"));
        } else if !values && (self.classes.is_empty() || self.classes.len() > MAX_CLASSES) {
            problems
                .push(problem("classes", format!("must name 1 to {MAX_CLASSES} classes (got {})", self.classes.len())));
        }
        match self.kind {
            SampleKind::Images => self.check_images(&mut problems),
            SampleKind::Tensors => self.check_tensors(&mut problems),
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

    fn check_images(&self, problems: &mut Vec<IndexError>) {
        if self.normalize.is_none() {
            problems.push(problem("normalize", "an image data set needs its pixels' per-channel mean and std"));
        }
        let stats = self.normalize.iter().flat_map(|n| n.mean.iter().zip(&n.std));
        for (channel, (&mean, &std)) in stats.enumerate() {
            if !(0.0..=1.0).contains(&mean) {
                problems.push(problem(format!("normalize.mean[{channel}]"), format!("must be in [0, 1] (got {mean})")));
            }
            if !(std > 0.0 && std <= 1.0) {
                problems.push(problem(format!("normalize.std[{channel}]"), format!("must be in (0, 1] (got {std})")));
            }
        }
        if !self.inputs.is_empty() {
            problems.push(problem("inputs", "an image data set has no named inputs"));
        }
        if self.values.is_some() {
            problems.push(problem("values", "an image data set's labels are classes"));
        }
    }

    fn check_tensors(&self, problems: &mut Vec<IndexError>) {
        if self.normalize.is_some() {
            problems.push(problem("normalize", "a data set of tensors is not normalised by the pipeline"));
        }
        if self.inputs.is_empty() || self.inputs.len() > MAX_INPUTS {
            problems.push(problem("inputs", format!("must name 1 to {MAX_INPUTS} inputs (got {})", self.inputs.len())));
        }
        for (i, input) in self.inputs.iter().enumerate() {
            if !input_name_ok(&input.name) {
                problems.push(problem(format!("inputs[{i}].name"), "must be 1 to 100 letters, digits or underscores"));
            } else if self.inputs[..i].iter().any(|other| other.name == input.name) {
                problems.push(problem(format!("inputs[{i}].name"), format!("{} is named twice", input.name)));
            }
            if input.shape.len() > 8 || input.shape.contains(&0) || input.sample_bytes() > MAX_TENSOR_BYTES {
                problems.push(problem(
                    format!("inputs[{i}].shape"),
                    format!("must have at most 8 dimensions, none 0, and at most {MAX_TENSOR_BYTES} bytes a sample"),
                ));
            }
        }
        if let Some(shape) = &self.values {
            if shape.len() > 1 || shape.first().is_some_and(|&m| m == 0 || m > 1 << 20) {
                problems.push(problem("values", "must be [] (one value a sample) or [M], M from 1 to 2^20"));
            }
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
            normalize: Some(Normalize { mean: [0.5; 3], std: [0.25; 3] }),
            inputs: Vec::new(),
            values: None,
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
        index.normalize.as_mut().unwrap().std[1] = 0.0;
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
    fn an_index_of_tensors_names_its_inputs_and_its_labels() {
        let mut index = index();
        index.kind = SampleKind::Tensors;
        index.normalize = None;
        index.inputs = vec![TensorSpec { name: "tokens".into(), dtype: Dtype::I64, shape: vec![16] }];
        assert_eq!(DatasetIndex::from_json(&index.to_json()).unwrap(), index);
        index.values = Some(vec![2]);
        index.classes.clear();
        assert!(index.check().is_ok());
        index.inputs.push(TensorSpec { name: "tokens".into(), dtype: Dtype::F32, shape: vec![0] });
        index.inputs.push(TensorSpec { name: "a b".into(), dtype: Dtype::F32, shape: vec![1 << 30] });
        index.values = Some(vec![2, 3]);
        index.classes.push("a".into());
        let fields: Vec<String> = index.check().unwrap_err().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            ["classes", "inputs[1].name", "inputs[1].shape", "inputs[2].name", "inputs[2].shape", "values"]
        );
        let mut images = self::index();
        images.normalize = None;
        images.values = Some(vec![]);
        let fields: Vec<String> = images.check().unwrap_err().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["normalize", "values"]);
    }

    #[test]
    fn shard_names_stay_in_their_folder() {
        for bad in ["", "a/b.tar", ".hidden.tar", "x..tar", "shard.zip", "a b.tar", "\u{e9}.tar"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("train-000123.tar").is_ok());
    }
}
