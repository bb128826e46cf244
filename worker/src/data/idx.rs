//! MNIST-format IDX files (gzipped or not): the format of MNIST and Fashion-MNIST.
//!
//! Header: two zero bytes, a type byte (0x08 = u8, the only type these data sets use), the number of
//! dimensions, then each dimension as a big-endian u32, then the data.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{Kind, Tensor};

use super::Split;

const U8_TYPE: u8 = 0x08;

/// The most an IDX file may hold, decompressed (ImageNet at 224×224 as u8 is ~190 GB, but no IDX data set
/// is; Fashion-MNIST is 47 MB): a small gzip bomb must not take the node's memory.
pub const MAX_IDX_BYTES: u64 = 8 << 30;

/// Reads one IDX file into a u8 tensor of its shape.
pub fn read_idx(path: &Path) -> Result<Tensor> {
    read_idx_capped(path, MAX_IDX_BYTES)
}

/// [`read_idx`] with a cap on the file's size, compressed and decompressed.
pub fn read_idx_capped(path: &Path, cap: u64) -> Result<Tensor> {
    let mut raw = Vec::new();
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    file.take(cap + 1).read_to_end(&mut raw).with_context(|| format!("cannot read {}", path.display()))?;
    let too_big = || anyhow::anyhow!("{} holds more than {cap} bytes", path.display());
    if raw.len() as u64 > cap {
        return Err(too_big());
    }
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .take(cap + 1)
            .read_to_end(&mut out)
            .with_context(|| format!("{} is not valid gzip", path.display()))?;
        if out.len() as u64 > cap {
            return Err(too_big());
        }
        out
    } else {
        raw
    };
    parse_idx(&bytes).with_context(|| format!("{} is not an IDX file", path.display()))
}

/// Parses IDX bytes (already decompressed).
pub fn parse_idx(bytes: &[u8]) -> Result<Tensor> {
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        bail!("missing the IDX magic number");
    }
    if bytes[2] != U8_TYPE {
        bail!("element type 0x{:02x} is not supported (only unsigned bytes, 0x08)", bytes[2]);
    }
    let ndims = usize::from(bytes[3]);
    let header = 4 + 4 * ndims;
    if ndims == 0 || bytes.len() < header {
        bail!("truncated header");
    }
    let dims: Vec<i64> =
        bytes[4..header].chunks_exact(4).map(|c| i64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]))).collect();
    let numel: i64 = dims.iter().product();
    let data = &bytes[header..];
    if data.len() as i64 != numel {
        bail!("header promises {numel} values for shape {dims:?} but the file has {}", data.len());
    }
    Ok(Tensor::from_slice(data).view(dims.as_slice()))
}

/// The files of an IDX directory, named as MNIST names them, with or without `.gz`.
fn find(dir: &Path, stem: &str) -> Result<PathBuf> {
    for candidate in [format!("{stem}.gz"), stem.to_string()] {
        let path = dir.join(candidate);
        if path.exists() {
            return Ok(path);
        }
    }
    bail!("{} has no {stem}[.gz]", dir.display())
}

/// Loads `train-*`/`t10k-*` images and labels from an MNIST-layout directory: images as N×1×H×W u8, labels
/// as N i64.
pub fn load_dir(dir: &Path) -> Result<(Split, Split)> {
    let split = |images: &str, labels: &str| -> Result<Split> {
        let x = read_idx(&find(dir, images)?)?;
        let y = read_idx(&find(dir, labels)?)?.to_kind(Kind::Int64);
        let x = match x.dim() {
            3 => x.unsqueeze(1),
            4 => x,
            d => bail!("{images}: expected N×H×W images, got {d} dimensions"),
        };
        Split::new(x, y).with_context(|| format!("{images} / {labels}"))
    };
    Ok((
        split("train-images-idx3-ubyte", "train-labels-idx1-ubyte")?,
        split("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64 KB gzip that inflates to 64 MB is stopped at the cap, not read into memory.
    #[test]
    fn a_gzip_bomb_stops_at_the_cap() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("ringtrain-idx-bomb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bomb.gz");
        let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(&path).unwrap(), flate2::Compression::best());
        gz.write_all(&idx_bytes(&[64 << 20], &[])[..8]).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            gz.write_all(&zeros).unwrap();
        }
        gz.finish().unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() < 1 << 20);
        let err = read_idx_capped(&path, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("more than 1048576 bytes"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn idx_bytes(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, U8_TYPE, dims.len() as u8];
        for d in dims {
            out.extend_from_slice(&d.to_be_bytes());
        }
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn parses_shape_and_values() {
        let t = parse_idx(&idx_bytes(&[2, 3], &[1, 2, 3, 4, 5, 6])).unwrap();
        assert_eq!(t.size(), vec![2, 3]);
        assert_eq!(t.int64_value(&[1, 2]), 6);
    }

    #[test]
    fn rejects_bad_headers_and_lengths() {
        assert!(parse_idx(&[1, 2, 3]).is_err());
        assert!(parse_idx(&[0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0]).unwrap_err().to_string().contains("0x0d"));
        assert!(parse_idx(&idx_bytes(&[4], &[1, 2])).unwrap_err().to_string().contains("promises 4"));
    }

    #[test]
    fn reads_gzip_and_plain_files_alike() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("ringtrain-idx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bytes = idx_bytes(&[3], &[7, 8, 9]);
        std::fs::write(dir.join("plain"), &bytes).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        std::fs::write(dir.join("packed.gz"), gz.finish().unwrap()).unwrap();
        for name in ["plain", "packed.gz"] {
            let t = read_idx(&dir.join(name)).unwrap();
            assert_eq!(Vec::<u8>::try_from(&t).unwrap(), vec![7, 8, 9]);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
