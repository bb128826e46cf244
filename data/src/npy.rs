//! One sample's tensor as a NumPy `.npy` member (format 1.0: a magic string, a header naming the dtype and
//! shape, the elements little-endian in C order): what shards of named tensors hold, so that WebDataset
//! and NumPy read them as they are. Only what a model's input can be is written or read: the dtypes of
//! [`Dtype`], C order.

use serde::{Deserialize, Serialize};

const MAGIC: &[u8] = b"\x93NUMPY";

/// The element types a named input may have (safetensors' names, lowercase). BF16 has no `.npy` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F64,
    F32,
    F16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl Dtype {
    pub const ALL: [Dtype; 9] =
        [Dtype::F64, Dtype::F32, Dtype::F16, Dtype::I64, Dtype::I32, Dtype::I16, Dtype::I8, Dtype::U8, Dtype::Bool];

    /// By safetensors' name (`F32`, `I64`, `BOOL`, ...).
    pub fn from_safetensors(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.safetensors_name() == name)
    }

    pub fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::F64 => "F64",
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::I64 => "I64",
            Dtype::I32 => "I32",
            Dtype::I16 => "I16",
            Dtype::I8 => "I8",
            Dtype::U8 => "U8",
            Dtype::Bool => "BOOL",
        }
    }

    /// NumPy's type string, little-endian.
    pub fn descr(self) -> &'static str {
        match self {
            Dtype::F64 => "<f8",
            Dtype::F32 => "<f4",
            Dtype::F16 => "<f2",
            Dtype::I64 => "<i8",
            Dtype::I32 => "<i4",
            Dtype::I16 => "<i2",
            Dtype::I8 => "|i1",
            Dtype::U8 => "|u1",
            Dtype::Bool => "|b1",
        }
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::F64 | Dtype::I64 => 8,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::I16 => 2,
            Dtype::I8 | Dtype::U8 | Dtype::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F64 | Dtype::F32 | Dtype::F16)
    }
}

/// The bytes of one sample's tensor of `shape` (its elements, `data`, little-endian) as a `.npy` file.
pub fn encode(dtype: Dtype, shape: &[u64], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}", dtype.descr());
    // the magic, version and length take 10 bytes; the header ends in a newline, the whole padded to 64
    let padded = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(padded - 10 - header.len() - 1));
    header.push('\n');
    let mut out = Vec::with_capacity(padded + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// The elements of a `.npy` file, if it holds a C-order `dtype` array of exactly `shape`; else why not.
pub fn decode<'a>(bytes: &'a [u8], dtype: Dtype, shape: &[u64]) -> Result<&'a [u8], String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file".into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(format!(".npy version {v} is not read")),
    };
    let end = start.checked_add(header_len).filter(|&e| e <= bytes.len()).ok_or("a .npy header past its end")?;
    let header = std::str::from_utf8(&bytes[start..end]).map_err(|_| "a .npy header that is not text")?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}':"))? + key.len() + 3;
        Some(header[at..].trim_start())
    };
    let descr = field("descr").and_then(|v| v.strip_prefix('\'')).and_then(|v| v.split('\'').next());
    // NumPy writes '<' for multi-byte types and '|' for single bytes; '=' is native (little-endian here)
    let descr = descr.map(|d| d.replacen('=', "<", 1));
    if descr.as_deref() != Some(dtype.descr()) && !(dtype.size() == 1 && descr.as_deref() == Some(&dtype.descr()[1..]))
    {
        return Err(format!("holds {}, the index says {}", descr.unwrap_or_else(|| "no dtype".into()), dtype.descr()));
    }
    if !field("fortran_order").is_some_and(|v| v.starts_with("False")) {
        return Err("is not in C order".into());
    }
    let stored: Option<Vec<u64>> = field("shape")
        .and_then(|v| v.strip_prefix('('))
        .and_then(|v| v.split(')').next())
        .map(|dims| dims.split(',').map(str::trim).filter(|d| !d.is_empty()).map(str::parse).collect::<Result<_, _>>())
        .and_then(Result::ok);
    if stored.as_deref() != Some(shape) {
        return Err(format!("has shape {stored:?}, the index says {shape:?}"));
    }
    let expected = shape.iter().product::<u64>() as usize * dtype.size();
    let data = &bytes[end..];
    if data.len() != expected {
        return Err(format!("holds {} bytes of elements, its shape needs {expected}", data.len()));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_round_trips_with_a_header_aligned_to_64_bytes() {
        let data: Vec<u8> = [1.5f32, -2.0, 3.25, 0.0, 7.0, 8.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let file = encode(Dtype::F32, &[2, 3], &data);
        assert_eq!((file.len() - data.len()) % 64, 0);
        assert_eq!(decode(&file, Dtype::F32, &[2, 3]).unwrap(), data.as_slice());
        let scalar = encode(Dtype::I64, &[], &7i64.to_le_bytes());
        assert_eq!(decode(&scalar, Dtype::I64, &[]).unwrap(), 7i64.to_le_bytes());
        let vector = encode(Dtype::Bool, &[4], &[1, 0, 0, 1]);
        assert!(std::str::from_utf8(&vector[10..74]).unwrap().contains("'shape': (4,)"));
        assert_eq!(decode(&vector, Dtype::Bool, &[4]).unwrap(), [1, 0, 0, 1]);
    }

    #[test]
    fn numpy_s_own_files_read() {
        // np.save of np.arange(3, dtype=np.int16) (NumPy 1.26)
        let mut file = b"\x93NUMPY\x01\x00v\x00{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }".to_vec();
        file.resize(10 + 0x76 - 1, b' ');
        file.push(b'\n');
        file.extend_from_slice(&[0, 0, 1, 0, 2, 0]);
        assert_eq!(decode(&file, Dtype::I16, &[3]).unwrap(), [0, 0, 1, 0, 2, 0]);
    }

    #[test]
    fn a_member_that_is_not_what_the_index_says_is_refused_saying_why() {
        let file = encode(Dtype::F32, &[2], &[0; 8]);
        assert!(decode(&file, Dtype::F64, &[2]).unwrap_err().contains("holds <f4, the index says <f8"));
        assert!(decode(&file, Dtype::F32, &[3]).unwrap_err().contains("shape Some([2])"));
        assert!(decode(&file[..file.len() - 1], Dtype::F32, &[2]).unwrap_err().contains("7 bytes"));
        assert!(decode(b"PK\x03\x04 a zip", Dtype::F32, &[2]).unwrap_err().contains("not a .npy"));
        let mut fortran = file.clone();
        let at = fortran.windows(5).position(|w| w == b"False").unwrap();
        fortran[at..at + 5].copy_from_slice(b"True ");
        assert!(decode(&fortran, Dtype::F32, &[2]).unwrap_err().contains("C order"));
    }
}
