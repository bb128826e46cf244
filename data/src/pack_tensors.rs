//! `ringtrain datasets pack FILE.safetensors OUT`: a data set of named tensors (an upload's layout: `x.NAME`
//! for each input, or one `x`; labels `y`, class indices or values; optionally `x_test.NAME` and `y_test`)
//! into shards of `.npy` members and their index, so that uploaded multi-input models train on data larger
//! than one upload or than a rank's memory.
//!
//! The file is never read whole: its header says where each tensor lies, and each sample's rows are read by
//! offset as its shard is written. Without a test split the last tenth is held out, as the worker does for
//! an upload, so the same file gives the same splits either way. Samples are shuffled (a fixed seed) before
//! they are cut into shards, as images are.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::index::{input_name_ok, DatasetIndex, SampleKind, SplitIndex, TensorSpec, FORMAT, MAX_CLASSES};
use crate::npy::{self, Dtype};
use crate::pack::{close, PackError, PackOptions, PackReport};
use crate::shard::ShardWriter;

/// The largest safetensors header read (the format's own limit is 100 MB).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor of the file: its dtype name, shape and where its bytes lie (from the data section's start).
#[derive(Debug, serde::Deserialize)]
struct Stored {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// A tensor whose first dimension is the samples, read a row at a time.
#[derive(Debug, Clone)]
struct Rows {
    /// Where sample 0's row starts in the file.
    start: u64,
    row_bytes: u64,
}

/// The labels of one split.
#[derive(Debug, Clone)]
enum Labels {
    Classes(Vec<u32>),
    /// Each sample's values as f32 bytes.
    Values(Rows, Dtype),
}

/// One split as found in the file: each input's rows (in the index's order) and the labels.
#[derive(Debug, Clone)]
struct Split {
    inputs: Vec<Rows>,
    labels: Labels,
    samples: u64,
}

impl Split {
    /// Samples `first..first + n` of the split.
    fn part(&self, first: u64, n: u64) -> Split {
        let cut = |r: &Rows| Rows { start: r.start + first * r.row_bytes, row_bytes: r.row_bytes };
        let labels = match &self.labels {
            Labels::Classes(c) => Labels::Classes(c[first as usize..(first + n) as usize].to_vec()),
            Labels::Values(rows, dtype) => Labels::Values(cut(rows), *dtype),
        };
        Split { inputs: self.inputs.iter().map(cut).collect(), labels, samples: n }
    }
}

fn input_error(path: &Path, why: impl std::fmt::Display) -> PackError {
    PackError::Input(format!("{}: {why}", path.display()))
}

/// Packs the safetensors data set `source` into `out`.
pub fn pack_tensors(source: &Path, out: &Path, options: &PackOptions) -> Result<PackReport, PackError> {
    let file = File::open(source).map_err(|e| PackError::Io { path: source.to_path_buf(), source: e })?;
    let (tensors, data_start) = read_header(&file, source)?;
    let bytes = file.metadata().map_err(|e| PackError::Io { path: source.to_path_buf(), source: e })?.len();
    let file = Source { file: &file, path: source, data_start, bytes };
    let fail = |why: String| input_error(source, why);
    // the inputs: x.NAME (sorted by name), or one x named "x"
    let names: Vec<String> = match tensors.contains_key("x") {
        true => vec!["x".to_string()],
        false => tensors.keys().filter_map(|k| k.strip_prefix("x.")).map(str::to_string).collect(),
    };
    if names.is_empty() {
        return Err(fail("holds no inputs: tensors x, or x.NAME for each named input".into()));
    }
    let key = |prefix: &str, name: &str| {
        if name == "x" && names.len() == 1 && tensors.contains_key("x") {
            prefix.to_string()
        } else {
            format!("{prefix}.{name}")
        }
    };
    let mut specs = Vec::new();
    for name in &names {
        if !input_name_ok(name) {
            return Err(fail(format!("input {name:?}: names are 1 to 100 letters, digits or underscores")));
        }
        let stored = &tensors[&key("x", name)];
        let dtype = Dtype::from_safetensors(&stored.dtype).ok_or_else(|| {
            fail(format!(
                "{}: dtype {} has no .npy type (floats, integers, BOOL; not BF16)",
                key("x", name),
                stored.dtype
            ))
        })?;
        if stored.shape.is_empty() {
            return Err(fail(format!("{} must be [N, ...] (got a scalar)", key("x", name))));
        }
        specs.push(TensorSpec { name: name.clone(), dtype, shape: stored.shape[1..].to_vec() });
    }
    let read_split = |x: &str, y: &str| -> Result<Option<Split>, PackError> {
        let Some(labels) = tensors.get(y) else { return Ok(None) };
        let samples = labels.shape.first().copied().unwrap_or(0);
        let mut inputs = Vec::new();
        for spec in &specs {
            let name = key(x, &spec.name);
            let stored = tensors.get(&name).ok_or_else(|| fail(format!("{name} is missing ({y} is given)")))?;
            if stored.dtype != spec.dtype.safetensors_name() || stored.shape.get(1..) != Some(spec.shape.as_slice()) {
                return Err(fail(format!("{name}'s samples are not shaped as {}'s", key("x", &spec.name))));
            }
            inputs.push(file.rows(stored, &name, samples)?);
        }
        let labels = file.labels(labels, y, samples)?;
        Ok(Some(Split { inputs, labels, samples }))
    };
    let all = read_split("x", "y")?.ok_or_else(|| fail("holds no labels y".into()))?;
    let (train, test) = match read_split("x_test", "y_test")? {
        Some(test) => (all, test),
        None => {
            let held_out = ringtrain_core::dataset::held_out_test_samples(all.samples);
            if all.samples <= held_out {
                return Err(fail(format!("{} samples are too few to hold out a test split", all.samples)));
            }
            (all.part(0, all.samples - held_out), all.part(all.samples - held_out, held_out))
        }
    };
    let per_sample = |name: &str| tensors.get(name).and_then(|t| t.shape.get(1..)).map(<[u64]>::to_vec);
    let values = match (&train.labels, &test.labels) {
        (Labels::Values(..), Labels::Values(..))
            if per_sample("y_test").is_none_or(|test| Some(test) == per_sample("y")) =>
        {
            per_sample("y")
        }
        (Labels::Classes(_), Labels::Classes(_)) => None,
        _ => return Err(fail("y and y_test must both be classes, or both values of the same shape".into())),
    };
    let classes = match (&train.labels, &test.labels) {
        (Labels::Classes(a), Labels::Classes(b)) => a.iter().chain(b).max().map_or(0, |&c| c + 1),
        _ => 0,
    };
    std::fs::create_dir_all(out).map_err(|e| PackError::Io { path: out.to_path_buf(), source: e })?;
    let values_shape = values.clone().unwrap_or_default();
    let writer = Writer { file: &file, out, specs: &specs, values: &values_shape, options };
    let train_split = writer.split("train", &train)?;
    let test_split = writer.split("test", &test)?;
    let index = DatasetIndex {
        format: FORMAT.into(),
        kind: SampleKind::Tensors,
        classes: (0..classes).map(|c| c.to_string()).collect(),
        normalize: None,
        inputs: specs.clone(),
        values,
        train: train_split,
        test: Some(test_split),
    };
    crate::pack::write_index(&index, out, classes as usize, Vec::new())
}

/// The file's tensors by name, and where its data section starts.
fn read_header(file: &File, path: &Path) -> Result<(BTreeMap<String, Stored>, u64), PackError> {
    let io = |source| PackError::Io { path: path.to_path_buf(), source };
    let mut length = [0u8; 8];
    file.read_exact_at(&mut length, 0).map_err(io)?;
    let length = u64::from_le_bytes(length);
    if length > MAX_HEADER_BYTES {
        return Err(input_error(path, "not a safetensors file (its header would be larger than 100 MB)"));
    }
    let mut header = vec![0u8; length as usize];
    file.read_exact_at(&mut header, 8).map_err(io)?;
    let mut tensors: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| input_error(path, format!("not a safetensors file: {e}")))?;
    tensors.remove("__metadata__");
    let tensors = tensors
        .into_iter()
        .map(|(name, value)| {
            serde_json::from_value(value)
                .map(|t| (name.clone(), t))
                .map_err(|e| input_error(path, format!("{name}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    Ok((tensors, 8 + length))
}

/// The safetensors file being packed: where its data section starts, and its length.
struct Source<'a> {
    file: &'a File,
    path: &'a Path,
    data_start: u64,
    bytes: u64,
}

impl Source<'_> {
    /// The rows of `stored`, checked to hold `samples` rows inside the file.
    fn rows(&self, stored: &Stored, name: &str, samples: u64) -> Result<Rows, PackError> {
        let size = Dtype::from_safetensors(&stored.dtype).map_or(0, Dtype::size) as u64;
        let [begin, end] = stored.data_offsets;
        let row_bytes = stored.shape.get(1..).unwrap_or(&[]).iter().product::<u64>() * size;
        if stored.shape.first() != Some(&samples) {
            let why = format!("{name} has {:?} samples where its labels have {samples}", stored.shape.first());
            return Err(input_error(self.path, why));
        }
        if end < begin || end - begin != samples * row_bytes || self.data_start + end > self.bytes {
            return Err(input_error(self.path, format!("{name}: its data offsets do not fit its shape or the file")));
        }
        Ok(Rows { start: self.data_start + begin, row_bytes })
    }

    /// Sample `sample`'s row of `rows`.
    fn read(&self, rows: &Rows, sample: u64) -> Result<Vec<u8>, PackError> {
        let mut row = vec![0u8; rows.row_bytes as usize];
        self.file
            .read_exact_at(&mut row, rows.start + sample * rows.row_bytes)
            .map_err(|source| PackError::Io { path: self.path.to_path_buf(), source })?;
        Ok(row)
    }

    /// A split's labels: class indices (integers, [N]) or values (F32 or F64, [N] or [N, M]).
    fn labels(&self, stored: &Stored, name: &str, samples: u64) -> Result<Labels, PackError> {
        let fail = |why: String| input_error(self.path, format!("{name}: {why}"));
        let dtype = Dtype::from_safetensors(&stored.dtype)
            .ok_or_else(|| fail(format!("dtype {} is not read", stored.dtype)))?;
        let rows = self.rows(stored, name, samples)?;
        if dtype.is_float() && dtype != Dtype::F16 {
            if stored.shape.len() > 2 {
                return Err(fail("values must be [N] or [N, M]".into()));
            }
            return Ok(Labels::Values(rows, dtype));
        }
        if stored.shape.len() != 1 || dtype.is_float() || dtype == Dtype::Bool {
            return Err(fail("labels must be class indices (integers, [N]) or values (F32 or F64)".into()));
        }
        let mut bytes = vec![0u8; (samples * rows.row_bytes) as usize];
        self.file
            .read_exact_at(&mut bytes, rows.start)
            .map_err(|source| PackError::Io { path: self.path.to_path_buf(), source })?;
        let classes = bytes
            .chunks_exact(dtype.size())
            .map(|b| {
                let mut wide = [0u8; 8];
                wide[..b.len()].copy_from_slice(b);
                let negative = dtype != Dtype::U8 && b[b.len() - 1] & 0x80 != 0;
                let value = if negative { -1 } else { i64::from_le_bytes(wide) };
                u32::try_from(value).ok().filter(|&c| (c as usize) < MAX_CLASSES)
            })
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| fail(format!("every class index must be in 0..{MAX_CLASSES}")))?;
        Ok(Labels::Classes(classes))
    }
}

struct Writer<'a> {
    file: &'a Source<'a>,
    out: &'a Path,
    specs: &'a [TensorSpec],
    /// The shape of one sample's values (when the labels are values).
    values: &'a [u64],
    options: &'a PackOptions,
}

impl Writer<'_> {
    /// Writes `split`'s samples, shuffled, as shards named `NAME-NNNNNN.tar`.
    fn split(&self, name: &str, split: &Split) -> Result<SplitIndex, PackError> {
        let order = crate::pack::shuffled(split.samples as usize, self.options.seed, name);
        let mut shards = Vec::new();
        let mut open: Option<(PathBuf, ShardWriter, u64)> = None;
        for (n, sample) in order.into_iter().map(|s| s as u64).enumerate() {
            if open.is_none() {
                let path = self.out.join(format!("{name}-{:06}.tar", shards.len()));
                let writer = ShardWriter::create(&path).map_err(|e| PackError::Io { path: path.clone(), source: e })?;
                open = Some((path, writer, 0));
            }
            let Some((path, writer, bytes)) = open.as_mut() else { continue };
            let mut members: Vec<(String, Vec<u8>)> = Vec::new();
            for (spec, rows) in self.specs.iter().zip(&split.inputs) {
                let row = self.file.read(rows, sample)?;
                members.push((format!("x.{}.npy", spec.name), npy::encode(spec.dtype, &spec.shape, &row)));
            }
            match &split.labels {
                Labels::Classes(classes) => {
                    members.push(("cls".into(), classes[sample as usize].to_string().into_bytes()))
                }
                Labels::Values(rows, dtype) => {
                    let row = self.file.read(rows, sample)?;
                    let values: Vec<u8> = match dtype {
                        Dtype::F64 => row
                            .chunks_exact(8)
                            .flat_map(|b| (f64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f32).to_le_bytes())
                            .collect(),
                        _ => row,
                    };
                    members.push(("y.npy".into(), npy::encode(Dtype::F32, self.values, &values)));
                }
            }
            let refs: Vec<(&str, &[u8])> = members.iter().map(|(e, d)| (e.as_str(), d.as_slice())).collect();
            writer
                .append_sample(&format!("{n:09}"), &refs)
                .map_err(|e| PackError::Io { path: path.clone(), source: e })?;
            *bytes += members.iter().map(|(_, d)| d.len() as u64 + 1024).sum::<u64>();
            if *bytes >= self.options.shard_bytes {
                shards.push(close(open.take())?);
            }
        }
        if open.is_some() {
            shards.push(close(open.take())?);
        }
        Ok(SplitIndex { samples: split.samples, shards })
    }
}
