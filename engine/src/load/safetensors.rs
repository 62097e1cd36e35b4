//! safetensors reading with validation: every header field is checked against the file before
//! any tensor byte is touched, so a truncated or corrupt file is an error naming the file and
//! the problem, never a panic or an out-of-bounds read.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::error::{LoadError, read_json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }
}

/// A tensor's metadata and its bytes inside the mapped file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Converts elements `[start, start + out.len())` to f32.
    pub fn read_f32(&self, start: usize, out: &mut [f32]) {
        let size = self.dtype.size();
        let bytes = &self.bytes[start * size..(start + out.len()) * size];
        match self.dtype {
            DType::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            DType::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            DType::BF16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
        }
    }

    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        self.read_f32(0, &mut out);
        out
    }
}

struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

struct Mapped {
    map: Mmap,
}

/// All safetensors files of a model folder, mapped read-only.
pub struct SafeTensors {
    files: Vec<Mapped>,
    tensors: HashMap<String, Entry>,
}

/// Header larger than this is not a model header but a corrupt length field.
const MAX_HEADER: u64 = 100 * 1024 * 1024;

impl SafeTensors {
    /// Opens `model.safetensors`, or the shards named by `model.safetensors.index.json`, or
    /// every `*.safetensors` file in `dir`.
    pub fn open_dir(dir: &Path) -> Result<Self, LoadError> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let files: Vec<PathBuf> = if index.is_file() {
            let json = read_json(&index)?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| LoadError::Config {
                    path: index.clone(),
                    message: "no weight_map object".into(),
                })?;
            let mut names: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else if single.is_file() {
            vec![single]
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| LoadError::io(dir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(LoadError::Missing {
                    path: dir.join("model.safetensors"),
                });
            }
            found
        };
        Self::open_files(&files)
    }

    pub fn open_files(paths: &[PathBuf]) -> Result<Self, LoadError> {
        let mut files = Vec::with_capacity(paths.len());
        let mut tensors = HashMap::new();
        for (index, path) in paths.iter().enumerate() {
            let map = map_file(path)?;
            parse_header(path, &map, index, &mut tensors)?;
            files.push(Mapped { map });
        }
        Ok(Self { files, tensors })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Result<TensorView<'_>, LoadError> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor {
                name: name.to_owned(),
            })?;
        Ok(TensorView {
            dtype: e.dtype,
            shape: &e.shape,
            bytes: &self.files[e.file].map[e.start..e.end],
        })
    }
}

#[allow(unsafe_code)]
fn map_file(path: &Path) -> Result<Mmap, LoadError> {
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    // SAFETY: the map is read-only; a model file changed on disk while mapped could give
    // wrong numbers but no memory unsafety beyond what every mmap-based loader accepts.
    unsafe { Mmap::map(&file) }.map_err(|e| LoadError::io(path, e))
}

fn parse_header(
    path: &Path,
    map: &Mmap,
    file: usize,
    tensors: &mut HashMap<String, Entry>,
) -> Result<(), LoadError> {
    let corrupt = |message: String| LoadError::CorruptWeights {
        path: path.to_owned(),
        message,
    };
    let len = map.len() as u64;
    if len < 8 {
        return Err(corrupt(format!(
            "file is {len} bytes, too short for a safetensors header"
        )));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&map[..8]);
    let header_len = u64::from_le_bytes(n);
    if header_len > MAX_HEADER || 8 + header_len > len {
        return Err(corrupt(format!(
            "header length {header_len} does not fit in the file ({len} bytes): truncated or not a safetensors file"
        )));
    }
    let header: serde_json::Value = serde_json::from_slice(&map[8..8 + header_len as usize])
        .map_err(|e| corrupt(format!("header is not valid JSON: {e}")))?;
    let object = header
        .as_object()
        .ok_or_else(|| corrupt("header is not a JSON object".into()))?;
    let data_start = 8 + header_len as usize;
    let data_len = map.len() - data_start;
    let mut ranges: Vec<(usize, usize, &str)> = Vec::new();
    for (name, info) in object {
        if name == "__metadata__" {
            continue;
        }
        let dtype_name = info
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| corrupt(format!("tensor {name:?} has no dtype")))?;
        let dtype = match dtype_name {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            other => {
                return Err(LoadError::UnsupportedDType {
                    name: name.clone(),
                    dtype: other.to_owned(),
                });
            }
        };
        let shape: Vec<usize> = info
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect()
            })
            .ok_or_else(|| corrupt(format!("tensor {name:?} has an invalid shape")))?;
        let offsets: Vec<usize> = info
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect()
            })
            .filter(|o: &Vec<usize>| o.len() == 2)
            .ok_or_else(|| corrupt(format!("tensor {name:?} has invalid data_offsets")))?;
        let (start, end) = (offsets[0], offsets[1]);
        let elements = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| corrupt(format!("tensor {name:?} shape overflows")))?;
        let expected = elements
            .checked_mul(dtype.size())
            .ok_or_else(|| corrupt(format!("tensor {name:?} size overflows")))?;
        if end < start || end - start != expected {
            return Err(corrupt(format!(
                "tensor {name:?}: data_offsets {start}..{end} hold {} bytes, but {dtype_name} {shape:?} needs {expected}",
                end.saturating_sub(start)
            )));
        }
        if end > data_len {
            return Err(corrupt(format!(
                "tensor {name:?} ends at byte {end} of the data section, which has only {data_len} bytes: the file is truncated"
            )));
        }
        ranges.push((start, end, name));
        tensors.insert(
            name.clone(),
            Entry {
                file,
                dtype,
                shape,
                start: data_start + start,
                end: data_start + end,
            },
        );
    }
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(corrupt(format!(
                "tensors {:?} and {:?} overlap",
                pair[0].2, pair[1].2
            )));
        }
    }
    Ok(())
}
