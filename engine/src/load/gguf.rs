//! GGUF (v2 and v3) reading: header, metadata of every value type, tensor infos, and tensor
//! data in the mapped file. Every count, length and offset is checked against the file before
//! it is used, so a truncated or hostile file is an error naming the problem, never a panic,
//! a huge allocation or an out-of-bounds read.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::error::LoadError;

/// Tensor element types of GGML that Backpack reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    /// OCP microscaling FP4 (GPT-OSS experts): 32 e2m1 values and one e8m0 exponent a block.
    Mxfp4,
}

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            39 => Self::Mxfp4,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::BF16 => 30,
            Self::Mxfp4 => 39,
        }
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Mxfp4 => 32,
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Mxfp4 => 17,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Mxfp4 => "MXFP4",
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// Any integer that fits in u64 (GGUF writers differ in the integer width they use).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct GgufTensor {
    pub name: String,
    /// Dimensions in GGML order: `dims[0]` varies fastest (the row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte range in the file.
    pub start: usize,
    pub end: usize,
}

impl GgufTensor {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// (rows, row length) of the tensor viewed as a matrix.
    pub fn rows_cols(&self) -> (u64, u64) {
        let cols = self.dims.first().copied().unwrap_or(1);
        (self.elements() / cols.max(1), cols)
    }
}

/// A mapped GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    metadata: HashMap<String, GgufValue>,
    tensors: Vec<GgufTensor>,
    by_name: HashMap<String, usize>,
    map: Mmap,
}

const MAGIC: &[u8; 4] = b"GGUF";
/// GGML supports at most four dimensions.
const MAX_DIMS: u32 = 4;
const DEFAULT_ALIGNMENT: u64 = 32;

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "{what} at byte {} needs {n} bytes but the file ends at {}: truncated",
                    self.pos,
                    self.bytes.len()
                )
            })?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(format!(
                "{what} claims {len} bytes at byte {} but only {} remain",
                self.pos,
                self.remaining()
            ));
        }
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not valid UTF-8"))
    }

    fn value(&mut self, kind: u32, key: &str, depth: u32) -> Result<GgufValue, String> {
        Ok(match kind {
            0 => GgufValue::U8(self.array::<1>(key)?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(key)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("metadata {key:?}: invalid bool byte {b}")),
            },
            8 => GgufValue::String(self.string(key)?),
            9 => {
                if depth > 0 {
                    return Err(format!("metadata {key:?}: nested arrays are not supported"));
                }
                let inner = self.u32(key)?;
                let count = self.u64(key)?;
                // Every element takes at least one byte: a count beyond the rest of the file is
                // corrupt, and checking it first keeps allocation bounded by the file size.
                if count > self.remaining() as u64 {
                    return Err(format!(
                        "metadata {key:?}: array of {count} elements cannot fit in the {} bytes left",
                        self.remaining()
                    ));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(inner, key, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            other => return Err(format!("metadata {key:?}: unknown value type {other}")),
        })
    }
}

#[allow(unsafe_code)]
fn map_file(path: &Path) -> Result<Mmap, LoadError> {
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    // SAFETY: the map is read-only; a file changed on disk while mapped could give wrong
    // numbers but no memory unsafety beyond what every mmap-based loader accepts.
    unsafe { Mmap::map(&file) }.map_err(|e| LoadError::io(path, e))
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let map = map_file(path)?;
        let corrupt = |message: String| LoadError::CorruptGguf {
            path: path.to_owned(),
            message,
        };
        let (version, metadata, tensors) = parse(&map).map_err(corrupt)?;
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Self {
            path: path.to_owned(),
            version,
            metadata,
            tensors,
            by_name,
            map,
        })
    }

    pub fn metadata(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn metadata_keys(&self) -> impl Iterator<Item = &str> {
        self.metadata.keys().map(String::as_str)
    }

    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (blocks of its type).
    pub fn data(&self, tensor: &GgufTensor) -> &[u8] {
        &self.map[tensor.start..tensor.end]
    }
}

type Parsed = (u32, HashMap<String, GgufValue>, Vec<GgufTensor>);

fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic = c.array::<4>("magic")?;
    if &magic != MAGIC {
        return Err("not a GGUF file (bad magic)".into());
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "GGUF version {version} is not supported (2 and 3 are)"
        ));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_metadata = c.u64("metadata count")?;
    // Each entry takes well over 8 bytes; larger counts cannot be genuine.
    let limit = (bytes.len() / 8) as u64;
    if n_tensors > limit || n_metadata > limit {
        return Err(format!(
            "{n_tensors} tensors and {n_metadata} metadata entries cannot fit in {} bytes",
            bytes.len()
        ));
    }
    let mut metadata = HashMap::with_capacity(n_metadata as usize);
    for _ in 0..n_metadata {
        let key = c.string("metadata key")?;
        let kind = c.u32(&key)?;
        let value = c.value(kind, &key, 0)?;
        metadata.insert(key, value);
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v
            .as_u64()
            .filter(|a| *a > 0 && a.is_power_of_two() && *a <= 1 << 20)
            .ok_or_else(|| format!("general.alignment {v:?} is not a power of two"))?,
    };
    struct Info {
        name: String,
        dims: Vec<u64>,
        ggml_type: GgmlType,
        offset: u64,
        bytes: u64,
    }
    let mut infos = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let name = c.string("tensor name")?;
        let n_dims = c.u32(&name)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!(
                "tensor {name:?} has {n_dims} dimensions (1 to 4 allowed)"
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = c.u64(&name)?;
            if d == 0 {
                return Err(format!("tensor {name:?} has a zero dimension"));
            }
            dims.push(d);
        }
        let type_id = c.u32(&name)?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
            format!("tensor {name:?} has GGML type {type_id}, which is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K are)")
        })?;
        let offset = c.u64(&name)?;
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| format!("tensor {name:?}: dimensions {dims:?} overflow"))?;
        let block = ggml_type.block_elems() as u64;
        if dims[0] % block != 0 {
            return Err(format!(
                "tensor {name:?}: rows of {} elements are not whole {} blocks of {block}",
                dims[0],
                ggml_type.name()
            ));
        }
        let bytes = (elements / block)
            .checked_mul(ggml_type.block_bytes() as u64)
            .ok_or_else(|| format!("tensor {name:?}: size overflows"))?;
        if offset % alignment != 0 {
            return Err(format!(
                "tensor {name:?}: offset {offset} is not aligned to {alignment}"
            ));
        }
        infos.push(Info {
            name,
            dims,
            ggml_type,
            offset,
            bytes,
        });
    }
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    let mut tensors = Vec::with_capacity(infos.len());
    let mut names = std::collections::HashSet::new();
    for info in infos {
        let start = data_start
            .checked_add(info.offset)
            .ok_or_else(|| format!("tensor {:?}: offset overflows", info.name))?;
        let end = start
            .checked_add(info.bytes)
            .ok_or_else(|| format!("tensor {:?}: size overflows", info.name))?;
        if end > file_len {
            return Err(format!(
                "tensor {:?} ends at byte {end} but the file has {file_len}: truncated",
                info.name
            ));
        }
        if !names.insert(info.name.clone()) {
            return Err(format!("tensor {:?} appears twice", info.name));
        }
        tensors.push(GgufTensor {
            name: info.name,
            dims: info.dims,
            ggml_type: info.ggml_type,
            start: start as usize,
            end: end as usize,
        });
    }
    let mut ranges: Vec<(usize, usize, &str)> = tensors
        .iter()
        .map(|t| (t.start, t.end, t.name.as_str()))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(format!(
                "tensors {:?} and {:?} overlap",
                pair[0].2, pair[1].2
            ));
        }
    }
    Ok((version, metadata, tensors))
}

/// Writes a GGUF file (v3) with the given metadata and tensors: for tests and tools that make
/// small models.
pub fn write_gguf(
    metadata: &[(&str, GgufValue)],
    tensors: &[(&str, &[u64], GgmlType, &[u8])],
) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn value(out: &mut Vec<u8>, v: &GgufValue) {
        match v {
            GgufValue::U8(x) => out.push(*x),
            GgufValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::Bool(x) => out.push(u8::from(*x)),
            GgufValue::String(s) => string(out, s),
            GgufValue::Array(items) => {
                let inner = items.first().map_or(4, kind);
                out.extend_from_slice(&inner.to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for item in items {
                    value(out, item);
                }
            }
        }
    }
    fn kind(v: &GgufValue) -> u32 {
        match v {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => 8,
            GgufValue::Array(_) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        string(&mut out, k);
        out.extend_from_slice(&kind(v).to_le_bytes());
        value(&mut out, v);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for (name, dims, ty, data) in tensors {
        string(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in *dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&ty.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + data.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
    }
    let start = (out.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
    out.resize(start as usize, 0);
    for ((_, _, _, data), off) in tensors.iter().zip(offsets) {
        out.resize((start + off) as usize, 0);
        out.extend_from_slice(data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let data: Vec<u8> = (0..64u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        write_gguf(
            &[
                ("general.architecture", GgufValue::String("llama".into())),
                ("llama.block_count", GgufValue::U32(2)),
                ("scale", GgufValue::F32(0.5)),
                (
                    "tokenizer.ggml.tokens",
                    GgufValue::Array(vec![
                        GgufValue::String("a".into()),
                        GgufValue::String("b".into()),
                    ]),
                ),
                ("flag", GgufValue::Bool(true)),
                ("big", GgufValue::I64(-5)),
            ],
            &[
                ("w", &[8, 2], GgmlType::F32, &data[..64]),
                ("v", &[16], GgmlType::F32, &data[..64]),
            ],
        )
    }

    #[test]
    fn round_trips_metadata_and_tensors() {
        let bytes = sample();
        let (version, meta, tensors) = parse(&bytes).expect("valid");
        assert_eq!(version, 3);
        assert_eq!(meta["general.architecture"].as_str(), Some("llama"));
        assert_eq!(meta["llama.block_count"].as_u64(), Some(2));
        assert_eq!(meta["scale"].as_f64(), Some(0.5));
        assert_eq!(
            meta["tokenizer.ggml.tokens"].as_array().map(<[_]>::len),
            Some(2)
        );
        assert_eq!(meta["flag"], GgufValue::Bool(true));
        assert_eq!(meta["big"].as_u64(), None);
        assert_eq!(tensors.len(), 2);
        assert_eq!(tensors[0].rows_cols(), (2, 8));
        assert_eq!(tensors[1].start % 32, 0);
        let first = f32::from_le_bytes(
            bytes[tensors[1].start..tensors[1].start + 4]
                .try_into()
                .expect("4 bytes"),
        );
        assert_eq!(first, 0.0);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = sample();
        for len in 0..bytes.len() {
            assert!(
                parse(&bytes[..len]).is_err(),
                "a file cut at {len} bytes parsed"
            );
        }
    }

    #[test]
    fn hostile_headers_are_refused() {
        let good = sample();
        // Absurd tensor count.
        let mut bad = good.clone();
        bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&bad).expect_err("count").contains("cannot fit"));
        // Absurd first key length.
        let mut bad = good.clone();
        bad[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        assert!(parse(&bad).expect_err("length").contains("claims"));
        // Wrong magic and version.
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(parse(&bad).is_err());
        let mut bad = good.clone();
        bad[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(parse(&bad).expect_err("version").contains("version 1"));
        // Random corruption anywhere must never panic.
        let mut state = 0x1234_5678_9abc_def0u64;
        for _ in 0..2000 {
            let mut bad = good.clone();
            for _ in 0..3 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let at = (state % bad.len() as u64) as usize;
                bad[at] = (state >> 32) as u8;
            }
            let _ = parse(&bad);
        }
    }

    #[test]
    fn overlapping_and_out_of_range_tensors_are_refused() {
        let data = vec![0u8; 64];
        let overlapping = write_gguf(
            &[],
            &[
                ("a", &[16], GgmlType::F32, &data),
                ("b", &[16], GgmlType::F32, &data),
            ],
        );
        // b's offset field is the last header word holding 64 (the data are zeros): point it
        // into a's data, then past the end of the file.
        assert!(parse(&overlapping).is_ok());
        let needle = 64u64.to_le_bytes();
        let at = overlapping
            .windows(8)
            .rposition(|w| w == needle)
            .expect("b's offset field");
        let mut bad = overlapping.clone();
        bad[at..at + 8].copy_from_slice(&32u64.to_le_bytes());
        assert!(parse(&bad).expect_err("overlap").contains("overlap"));
        let mut bad = overlapping;
        bad[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(parse(&bad).expect_err("range").contains("truncated"));
    }
}
