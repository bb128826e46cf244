//! Writing a safetensors file without libtorch: the format's 8-byte little-endian header length, the JSON
//! header (each tensor's dtype, shape and byte range), then the tensors' bytes, one after another. What a
//! `--dataset-file` or an upload holds; `ringtrain-bench data` writes its in-memory copy of the shards so.

use std::io::Write;
use std::path::Path;

/// One tensor to write: its name, its safetensors dtype (`U8`, `I64`, `F32`, ...), its shape and its bytes
/// (little-endian, row-major).
#[derive(Debug, Clone, Copy)]
pub struct Named<'a> {
    pub name: &'a str,
    pub dtype: &'a str,
    pub shape: &'a [u64],
    pub bytes: &'a [u8],
}

/// The file's bytes for `tensors`, in the order given.
pub fn to_bytes(tensors: &[Named<'_>]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for tensor in tensors {
        let end = offset + tensor.bytes.len() as u64;
        header.insert(
            tensor.name.to_string(),
            serde_json::json!({"dtype": tensor.dtype, "shape": tensor.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut header = serde_json::Value::Object(header).to_string().into_bytes();
    // the data starts 8-byte aligned, the header padded with spaces (as the reference implementation does)
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + header.len() + offset as usize);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    for tensor in tensors {
        out.extend_from_slice(tensor.bytes);
    }
    out
}

/// Writes `tensors` to `path` as a safetensors file.
pub fn write(path: &Path, tensors: &[Named<'_>]) -> std::io::Result<()> {
    std::fs::File::create(path)?.write_all(&to_bytes(tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_says_where_each_tensor_is() {
        let (x, y) = ([1u8, 2, 3, 4, 5, 6], 7i64.to_le_bytes());
        let bytes = to_bytes(&[
            Named { name: "x", dtype: "U8", shape: &[2, 3], bytes: &x },
            Named { name: "y", dtype: "I64", shape: &[1], bytes: &y },
        ]);
        let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(length % 8, 0);
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + length]).unwrap();
        assert_eq!(header["x"]["shape"], serde_json::json!([2, 3]));
        assert_eq!(header["y"]["data_offsets"], serde_json::json!([6, 14]));
        assert_eq!(&bytes[8 + length..8 + length + 6], &x);
        assert_eq!(&bytes[8 + length + 6..], &y);
    }
}
