//! One shard: a POSIX tar of WebDataset-style samples. A sample is the members sharing a key (the member's
//! name up to its first dot): `000123.jpg` (or `.jpeg`, `.png`) and `000123.cls`, the class index as decimal
//! text. Members of one sample are adjacent; samples come in the shard's order.
//!
//! A reader scans the tar's headers once ([`ShardMap::scan`], seeking over the data) and then reads only the
//! bytes of the samples it needs, by offset: a rank does not read the samples of the other ranks. Anything
//! that does not fit this layout fails with the shard and the byte offset named.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

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

/// Where one sample's image lies in its shard, and its class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleEntry {
    pub key: String,
    pub format: ImageFormat,
    pub offset: u64,
    pub len: u64,
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

/// The sample whose members are being read: its key, image (format, offset, length) and class.
struct Pending {
    key: String,
    image: Option<(ImageFormat, u64, u64)>,
    class: Option<u32>,
}

/// The largest `.cls` member read (a class index is a few digits).
const MAX_CLASS_BYTES: u64 = 32;

impl ShardMap {
    /// Opens `path` and scans its members. `name` names it in errors; `classes` bounds the class indices.
    pub fn scan(path: &Path, name: &str, classes: u32) -> Result<ShardMap, ShardError> {
        let file = File::open(path).map_err(|e| ShardError {
            shard: name.to_string(),
            at: None,
            reason: format!("cannot open {}: {e}", path.display()),
        })?;
        ShardMap::scan_file(file, name, classes)
    }

    /// Scans the members of an open shard file (kept open: its samples are read from it later).
    pub fn scan_file(file: File, name: &str, classes: u32) -> Result<ShardMap, ShardError> {
        let fail = |at: Option<u64>, reason: String| ShardError { shard: name.to_string(), at, reason };
        let mut archive = tar::Archive::new(&file);
        let entries = archive.entries_with_seek().map_err(|e| fail(Some(0), format!("not a tar: {e}")))?;
        let mut samples: Vec<SampleEntry> = Vec::new();
        let mut pending: Option<Pending> = None;
        let mut finish = |pending: Option<Pending>, at: u64| {
            let Some(Pending { key, image, class }) = pending else { return Ok(()) };
            match (image, class) {
                (Some((format, offset, len)), Some(class)) => {
                    samples.push(SampleEntry { key, format, offset, len, class });
                    Ok(())
                }
                (None, _) => Err(fail(Some(at), format!("sample {key} has no .jpg, .jpeg or .png member"))),
                (_, None) => Err(fail(Some(at), format!("sample {key} has no .cls member"))),
            }
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
                pending = Some(Pending { key: key.clone(), image: None, class: None });
            }
            let Some(Pending { image, class, .. }) = pending.as_mut() else { continue };
            let len = entry.size();
            if ext == "cls" {
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
            } else if let Some(format) = ImageFormat::from_extension(&ext) {
                *image = Some((format, offset, len));
            }
            // other members (a caption, metadata) are carried but not read
        }
        let end = file.metadata().map(|m| m.len()).unwrap_or(0);
        finish(pending.take(), end)?;
        Ok(ShardMap { name: name.to_string(), file, samples })
    }

    /// The stored bytes of sample `i` of this shard.
    pub fn read(&self, i: usize) -> Result<Vec<u8>, ShardError> {
        let entry = self.samples.get(i).ok_or_else(|| ShardError {
            shard: self.name.clone(),
            at: None,
            reason: format!("no sample {i}: the shard holds {}", self.samples.len()),
        })?;
        let mut bytes = vec![0u8; entry.len as usize];
        self.file.read_exact_at(&mut bytes, entry.offset).map_err(|e| ShardError {
            shard: self.name.clone(),
            at: Some(entry.offset),
            reason: format!("sample {} cannot be read: {e}", entry.key),
        })?;
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
        self.member(&format!("{key}.{}", format.extension()), image)?;
        self.member(&format!("{key}.cls"), class.to_string().as_bytes())?;
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
        let map = ShardMap::scan(&path, "s.tar", 10).unwrap();
        assert_eq!(map.samples.len(), 2);
        assert_eq!((map.samples[0].class, map.samples[0].format), (3, ImageFormat::Jpeg));
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
            let err = ShardMap::scan(&path, name, 10).unwrap_err().to_string();
            assert!(err.starts_with(&format!("shard {name} at byte ")) && err.contains(expected), "{err}");
        }
        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, vec![7u8; 3000]).unwrap();
        assert!(ShardMap::scan(&garbage, "garbage", 10).unwrap_err().to_string().starts_with("shard garbage"));
    }
}
