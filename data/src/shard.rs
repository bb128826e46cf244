//! One shard: a POSIX tar of WebDataset-style samples. A sample is the members sharing a key (the member's
//! name up to its first dot): `000123.jpg` (or `.jpeg`, `.png`) and `000123.cls`, the class index as decimal
//! text; or, in a data set of named tensors, `000123.x.NAME.npy` for each input and `000123.cls` or
//! `000123.y.npy` (values). Members of one sample are adjacent; samples come in the shard's order.
//!
//! A reader scans the tar's headers once ([`ShardMap::scan`], seeking over the data) and then reads only the
//! bytes of the samples it needs, by offset: a rank does not read the samples of the other ranks. Anything
//! that does not fit this layout fails with the shard and the byte offset named.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::index::{DatasetIndex, SampleKind, TensorSpec};
use crate::npy::Dtype;

/// How an image is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Jpeg,
    Png,
}

impl ImageFormat {
    /// By the member's extension.
    pub fn from_extension(ext: &str) -> Option<ImageFormat> {
        match ext.to_ascii_lowercase().as_str() {
            "jpg" | "jpeg" => Some(ImageFormat::Jpeg),
            "png" => Some(ImageFormat::Png),
            _ => None,
        }
    }

    /// By the file's first bytes.
    pub fn sniff(bytes: &[u8]) -> Option<ImageFormat> {
        match bytes {
            [0xFF, 0xD8, 0xFF, ..] => Some(ImageFormat::Jpeg),
            [0x89, b'P', b'N', b'G', ..] => Some(ImageFormat::Png),
            _ => None,
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpg",
            ImageFormat::Png => "png",
        }
    }
}

/// What a shard's samples hold, as its index says: which members are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// An image and a class below `classes`.
    Images { classes: u32 },
    /// Each input's `x.NAME.npy`, in the index's order, and a class below `classes` (`KEY.cls`) or the
    /// values of shape `values` (`KEY.y.npy`, f32; then `classes` is 0).
    Tensors { inputs: Vec<TensorSpec>, classes: u32, values: Option<Vec<u64>> },
}

impl Layout {
    pub fn of(index: &DatasetIndex) -> Layout {
        let classes = index.classes.len() as u32;
        match index.kind {
            SampleKind::Images => Layout::Images { classes },
            SampleKind::Tensors => {
                Layout::Tensors { inputs: index.inputs.clone(), classes, values: index.values.clone() }
            }
        }
    }

    fn classes(&self) -> u32 {
        match self {
            Layout::Images { classes } | Layout::Tensors { classes, .. } => *classes,
        }
    }

    /// Members read per sample besides the class.
    fn members(&self) -> usize {
        match self {
            Layout::Images { .. } => 1,
            Layout::Tensors { inputs, values, .. } => inputs.len() + usize::from(values.is_some()),
        }
    }

    /// The tensors a sample's read members hold (tensors only), with the members' names after the key:
    /// each input's (`x.NAME.npy`), then the values' (`y.npy`).
    pub fn tensors(&self) -> Vec<(String, TensorSpec)> {
        match self {
            Layout::Images { .. } => Vec::new(),
            Layout::Tensors { inputs, values, .. } => {
                let values = values.iter().map(|shape| {
                    ("y.npy".to_string(), TensorSpec { name: "y".into(), dtype: Dtype::F32, shape: shape.clone() })
                });
                inputs.iter().map(|input| (format!("x.{}.npy", input.name), input.clone())).chain(values).collect()
            }
        }
    }

    /// Which read member `ext` (the member's name after the key's dot) is, and the most bytes it may hold.
    fn member(&self, ext: &str) -> Option<(usize, u64)> {
        match self {
            Layout::Images { .. } => ImageFormat::from_extension(ext).map(|_| (0, u64::MAX)),
            Layout::Tensors { inputs, values, .. } => {
                // a .npy header is at most 64 KiB (version 1) beside the elements
                let room = |bytes: u64| bytes + (64 << 10);
                if let Some(name) = ext.strip_prefix("x.").and_then(|e| e.strip_suffix(".npy")) {
                    let at = inputs.iter().position(|i| i.name == name)?;
                    return Some((at, room(inputs[at].sample_bytes())));
                }
                let values = values.as_ref().filter(|_| ext == "y.npy")?;
                Some((inputs.len(), room(values.iter().product::<u64>() * 4)))
            }
        }
    }

    /// The name of read member `at`, for errors.
    fn member_name(&self, at: usize) -> String {
        match self {
            Layout::Images { .. } => ".jpg, .jpeg or .png".into(),
            Layout::Tensors { inputs, .. } => {
                inputs.get(at).map_or_else(|| "y.npy".into(), |input| format!("x.{}.npy", input.name))
            }
        }
    }
}

/// Where one sample's read members lie in its shard (offset, length: the image, or each input in the
/// index's order and then the values), and its class (0 when the labels are values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleEntry {
    pub key: String,
    /// The image's format (images only).
    pub format: Option<ImageFormat>,
    pub members: Vec<(u64, u64)>,
    pub class: u32,
}

/// A problem of one shard, naming it and where.
#[derive(Debug, thiserror::Error)]
#[error("shard {shard}{}: {reason}", at.map(|a| format!(" at byte {a}")).unwrap_or_default())]
pub struct ShardError {
    pub shard: String,
    pub at: Option<u64>,
    pub reason: String,
}

/// The samples of one shard file.
#[derive(Debug)]
pub struct ShardMap {
    pub name: String,
    file: File,
    pub samples: Vec<SampleEntry>,
}

/// The sample whose members are being read: its key, image format, read members and class.
struct Pending {
    key: String,
    format: Option<ImageFormat>,
    members: Vec<Option<(u64, u64)>>,
    class: Option<u32>,
}

/// The largest `.cls` member read (a class index is a few digits).
const MAX_CLASS_BYTES: u64 = 32;

impl ShardMap {
    /// Opens `path` and scans its members. `name` names it in errors; `layout` says what a sample holds.
    pub fn scan(path: &Path, name: &str, layout: &Layout) -> Result<ShardMap, ShardError> {
        let file = File::open(path).map_err(|e| ShardError {
            shard: name.to_string(),
            at: None,
            reason: format!("cannot open {}: {e}", path.display()),
        })?;
        ShardMap::scan_file(file, name, layout)
    }

    /// Scans the members of an open shard file (kept open: its samples are read from it later).
    pub fn scan_file(file: File, name: &str, layout: &Layout) -> Result<ShardMap, ShardError> {
        let fail = |at: Option<u64>, reason: String| ShardError { shard: name.to_string(), at, reason };
        let (classes, wanted) = (layout.classes(), layout.members());
        let mut archive = tar::Archive::new(&file);
        let entries = archive.entries_with_seek().map_err(|e| fail(Some(0), format!("not a tar: {e}")))?;
        let mut samples: Vec<SampleEntry> = Vec::new();
        let mut pending: Option<Pending> = None;
        let mut finish = |pending: Option<Pending>, at: u64| {
            let Some(Pending { key, format, members, class }) = pending else { return Ok(()) };
            if let Some(missing) = members.iter().position(Option::is_none) {
                return Err(fail(Some(at), format!("sample {key} has no {} member", layout.member_name(missing))));
            }
            let class = match class {
                Some(class) => class,
                None if classes == 0 => 0,
                None => return Err(fail(Some(at), format!("sample {key} has no .cls member"))),
            };
            samples.push(SampleEntry { key, format, members: members.into_iter().flatten().collect(), class });
            Ok(())
        };
        for entry in entries {
            let mut entry = entry.map_err(|e| fail(None, format!("a damaged tar header: {e}")))?;
            let offset = entry.raw_file_position();
            let header_at = offset.saturating_sub(512);
            if !entry.header().entry_type().is_file() {
                continue; // folders, pax headers: not members of samples
            }
            let path =
                entry.path().map_err(|e| fail(Some(header_at), format!("a member name that is not UTF-8: {e}")))?;
            let member = path.to_string_lossy().to_string();
            let file_name = member.rsplit('/').next().unwrap_or(&member).to_string();
            let (stem, ext) = match file_name.split_once('.') {
                Some((stem, ext)) if !stem.is_empty() => (stem.to_string(), ext.to_string()),
                _ => return Err(fail(Some(header_at), format!("member {member} has no KEY.EXT name"))),
            };
            let key = match member.rsplit_once('/') {
                Some((folder, _)) => format!("{folder}/{stem}"),
                None => stem,
            };
            if pending.as_ref().is_none_or(|p| p.key != key) {
                finish(pending.take(), header_at)?;
                pending = Some(Pending { key: key.clone(), format: None, members: vec![None; wanted], class: None });
            }
            let Some(Pending { format, members, class, .. }) = pending.as_mut() else { continue };
            let len = entry.size();
            if ext == "cls" && classes > 0 {
                if len > MAX_CLASS_BYTES {
                    return Err(fail(Some(offset), format!("{member} is {len} bytes, not a class index")));
                }
                let mut text = String::new();
                entry.read_to_string(&mut text).map_err(|e| fail(Some(offset), format!("{member}: {e}")))?;
                let parsed: u32 = text
                    .trim()
                    .parse()
                    .map_err(|_| fail(Some(offset), format!("{member} holds {text:?}, not a class index")))?;
                if parsed >= classes {
                    return Err(fail(Some(offset), format!("{member}: class {parsed}, but the index names {classes}")));
                }
                *class = Some(parsed);
            } else if let Some((at, most)) = layout.member(&ext) {
                if len > most {
                    return Err(fail(Some(offset), format!("{member} is {len} bytes, more than its index allows")));
                }
                *format = ImageFormat::from_extension(&ext);
                members[at] = Some((offset, len));
            }
            // other members (a caption, metadata) are carried but not read
        }
        let end = file.metadata().map(|m| m.len()).unwrap_or(0);
        finish(pending.take(), end)?;
        Ok(ShardMap { name: name.to_string(), file, samples })
    }

    /// The stored bytes of sample `i`'s image (its first read member).
    pub fn read(&self, i: usize) -> Result<Vec<u8>, ShardError> {
        self.read_member(i, 0)
    }

    /// The stored bytes of read member `m` of sample `i`.
    pub fn read_member(&self, i: usize, m: usize) -> Result<Vec<u8>, ShardError> {
        let fail = |at: Option<u64>, reason: String| ShardError { shard: self.name.clone(), at, reason };
        let entry = self
            .samples
            .get(i)
            .ok_or_else(|| fail(None, format!("no sample {i}: the shard holds {}", self.samples.len())))?;
        let &(offset, len) =
            entry.members.get(m).ok_or_else(|| fail(None, format!("no member {m} of {}", entry.key)))?;
        let mut bytes = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut bytes, offset)
            .map_err(|e| fail(Some(offset), format!("sample {} cannot be read: {e}", entry.key)))?;
        Ok(bytes)
    }
}

/// Writes samples into one tar shard (the packer's side).
pub struct ShardWriter {
    builder: tar::Builder<File>,
    pub samples: u64,
}

impl std::fmt::Debug for ShardWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardWriter").field("samples", &self.samples).finish_non_exhaustive()
    }
}

impl ShardWriter {
    pub fn create(path: &Path) -> std::io::Result<ShardWriter> {
        Ok(ShardWriter { builder: tar::Builder::new(File::create(path)?), samples: 0 })
    }

    /// Appends one sample: `KEY.EXT` holding the image as stored, and `KEY.cls`.
    pub fn append(&mut self, key: &str, format: ImageFormat, image: &[u8], class: u32) -> std::io::Result<()> {
        self.append_sample(key, &[(format.extension(), image), ("cls", class.to_string().as_bytes())])
    }

    /// Appends one sample of members `KEY.EXT`, in order.
    pub fn append_sample(&mut self, key: &str, members: &[(&str, &[u8])]) -> std::io::Result<()> {
        for (ext, data) in members {
            self.member(&format!("{key}.{ext}"), data)?;
        }
        self.samples += 1;
        Ok(())
    }

    fn member(&mut self, name: &str, data: &[u8]) -> std::io::Result<()> {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        self.builder.append_data(&mut header, name, data)
    }

    /// Ends the tar; returns its size.
    pub fn finish(self) -> std::io::Result<u64> {
        let mut file = self.builder.into_inner()?;
        file.sync_all()?;
        file.seek(SeekFrom::End(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, members: &[(&str, &[u8])]) {
        let mut builder = tar::Builder::new(File::create(path).unwrap());
        for (name, data) in members {
            let mut header = tar::Header::new_ustar();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            builder.append_data(&mut header, name, *data).unwrap();
        }
        builder.finish().unwrap();
    }

    #[test]
    fn samples_are_found_by_key_and_read_by_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        let mut writer = ShardWriter::create(&path).unwrap();
        writer.append("000001", ImageFormat::Jpeg, b"\xFF\xD8\xFFjpeg bytes", 3).unwrap();
        writer.append("000002", ImageFormat::Png, b"\x89PNG png bytes", 0).unwrap();
        let bytes = writer.finish().unwrap();
        assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());
        let map = ShardMap::scan(&path, "s.tar", &Layout::Images { classes: 10 }).unwrap();
        assert_eq!(map.samples.len(), 2);
        assert_eq!((map.samples[0].class, map.samples[0].format), (3, Some(ImageFormat::Jpeg)));
        assert_eq!(map.read(1).unwrap(), b"\x89PNG png bytes");
        assert!(map.read(2).unwrap_err().to_string().contains("no sample 2"));
    }

    #[test]
    fn a_shard_that_does_not_fit_the_layout_is_refused_naming_it_and_where() {
        let dir = tempfile::tempdir().unwrap();
        type Members<'a> = Vec<(&'a str, &'a [u8])>;
        let cases: [(&str, Members, &str); 4] = [
            ("no-class", vec![("a.jpg", b"x")], "sample a has no .cls member"),
            ("no-image", vec![("a.cls", b"1")], "sample a has no .jpg"),
            ("bad-class", vec![("a.jpg", b"x"), ("a.cls", b"cat")], "holds \"cat\""),
            ("big-class", vec![("a.jpg", b"x"), ("a.cls", b"12")], "class 12, but the index names 10"),
        ];
        for (name, members, expected) in cases {
            let path = dir.path().join(name);
            write(&path, &members);
            let err = ShardMap::scan(&path, name, &Layout::Images { classes: 10 }).unwrap_err().to_string();
            assert!(err.starts_with(&format!("shard {name} at byte ")) && err.contains(expected), "{err}");
        }
        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, vec![7u8; 3000]).unwrap();
        let images = Layout::Images { classes: 10 };
        assert!(ShardMap::scan(&garbage, "garbage", &images).unwrap_err().to_string().starts_with("shard garbage"));
    }

    #[test]
    fn a_sample_of_tensors_is_its_inputs_in_the_index_s_order_and_its_label() {
        let dir = tempfile::tempdir().unwrap();
        let inputs = vec![
            TensorSpec { name: "numeric".into(), dtype: Dtype::F32, shape: vec![2] },
            TensorSpec { name: "tokens".into(), dtype: Dtype::I64, shape: vec![1] },
        ];
        let path = dir.path().join("t.tar");
        // members in another order than the index's, a member no input names (carried, not read)
        let (numeric, tokens) =
            (crate::npy::encode(Dtype::F32, &[2], &[0; 8]), crate::npy::encode(Dtype::I64, &[1], &[7; 8]));
        write(
            &path,
            &[("a.x.tokens.npy", &tokens), ("a.x.numeric.npy", &numeric), ("a.txt", b"hi"), ("a.y.npy", b"v")],
        );
        let values = Layout::Tensors { inputs: inputs.clone(), classes: 0, values: Some(vec![]) };
        let map = ShardMap::scan(&path, "t.tar", &values).unwrap();
        assert_eq!(map.read_member(0, 0).unwrap(), numeric);
        assert_eq!(map.read_member(0, 1).unwrap(), tokens);
        assert_eq!(map.read_member(0, 2).unwrap(), b"v");
        // with classes, the sample needs its .cls and y.npy is not read
        let classes = Layout::Tensors { inputs: inputs.clone(), classes: 3, values: None };
        let err = ShardMap::scan(&path, "t.tar", &classes).unwrap_err().to_string();
        assert!(err.contains("sample a has no .cls member"), "{err}");
        write(&path, &[("a.x.numeric.npy", &numeric), ("a.cls", b"2")]);
        let err = ShardMap::scan(&path, "t.tar", &classes).unwrap_err().to_string();
        assert!(err.contains("sample a has no x.tokens.npy member"), "{err}");
        let huge = vec![0u8; 70 << 10];
        write(&path, &[("a.x.numeric.npy", &huge)]);
        let err = ShardMap::scan(&path, "t.tar", &classes).unwrap_err().to_string();
        assert!(err.contains("more than its index allows"), "{err}");
    }
}
