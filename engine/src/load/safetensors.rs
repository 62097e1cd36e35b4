//! safetensors reading with validation: every header field is checked against the file before
//! any tensor byte is touched, so a truncated or corrupt file is an error naming the file and
//! the problem, never a panic or an out-of-bounds read.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::error::{LoadError, read_json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// Bytes: MXFP4 checkpoints' packed e2m1 pairs and e8m0 exponents.
    U8,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::U8 => 1,
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
            DType::U8 => {
                for (o, b) in out.iter_mut().zip(bytes) {
                    *o = f32::from(*b);
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
    /// Index into `SafeTensors::blobs`.
    blob: usize,
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// Bytes behind tensors: a mapped file, or tensors a derived table had to materialise.
enum Blob {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Blob {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Map(map) => map,
            Self::Owned(bytes) => bytes,
        }
    }
}

/// All safetensors files of a model folder, mapped read-only.
pub struct SafeTensors {
    /// Shared with the tables derived from this one (see [`SafeTensors::remap`]).
    blobs: Vec<Arc<Blob>>,
    tensors: HashMap<String, Entry>,
    /// Tensors of dtypes this engine does not read (integer buffers such as CLIP's
    /// `position_ids`): an error only when asked for, so checkpoints that carry them open.
    unsupported: HashMap<String, String>,
}

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
        let mut blobs = Vec::with_capacity(paths.len());
        let mut tensors = HashMap::new();
        let mut unsupported = HashMap::new();
        for (index, path) in paths.iter().enumerate() {
            let map = map_file(path)?;
            parse_header(path, &map, index, &mut tensors, &mut unsupported)?;
            blobs.push(Arc::new(Blob::Map(map)));
        }
        Ok(Self {
            blobs,
            tensors,
            unsupported,
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    fn entry(&self, name: &str) -> Result<&Entry, LoadError> {
        self.tensors
            .get(name)
            .ok_or_else(|| match self.unsupported.get(name) {
                Some(dtype) => LoadError::UnsupportedDType {
                    name: name.to_owned(),
                    dtype: dtype.clone(),
                },
                None => LoadError::MissingTensor {
                    name: name.to_owned(),
                },
            })
    }

    pub fn get(&self, name: &str) -> Result<TensorView<'_>, LoadError> {
        let e = self.entry(name)?;
        Ok(TensorView {
            dtype: e.dtype,
            shape: &e.shape,
            bytes: &self.blobs[e.blob].bytes()[e.start..e.end],
        })
    }

    /// A table of views into this one's tensors, sharing its memory maps (nothing is copied;
    /// the files stay mapped while either table lives). Each `(name, source, rows, shape)`
    /// becomes tensor `name`: rows `rows` of `source`'s first dimension (all when `None`), seen
    /// with `shape` (the rows' own when `None`; the element count must agree). This renames
    /// checkpoints' tensors, splits fused weights and squeezes 1×1 convolutions into matrices.
    pub fn remap<'s>(
        &self,
        views: impl IntoIterator<Item = (String, &'s str, Option<Range<usize>>, Option<Vec<usize>>)>,
    ) -> Result<Self, LoadError> {
        let mut tensors = HashMap::new();
        for (name, source, rows, shape) in views {
            let e = self.entry(source)?;
            let first = e.shape.first().copied().unwrap_or(1);
            let rows = rows.unwrap_or(0..first);
            let mut kept = e.shape.clone();
            if let Some(d) = kept.first_mut() {
                *d = rows.end.saturating_sub(rows.start);
            }
            if rows.start > rows.end || rows.end > first {
                return Err(LoadError::ShapeMismatch {
                    name: source.to_owned(),
                    actual: e.shape.clone(),
                    expected: kept,
                });
            }
            let row_elements: usize = e.shape.iter().skip(1).product();
            let shape = shape.unwrap_or_else(|| kept.clone());
            if shape.iter().product::<usize>() != kept.iter().product::<usize>() {
                return Err(LoadError::ShapeMismatch {
                    name: source.to_owned(),
                    actual: kept,
                    expected: shape,
                });
            }
            let row_bytes = row_elements * e.dtype.size();
            let entry = Entry {
                blob: e.blob,
                dtype: e.dtype,
                shape,
                start: e.start + rows.start * row_bytes,
                end: e.start + rows.end * row_bytes,
            };
            tensors.insert(name, entry);
        }
        Ok(Self {
            blobs: self.blobs.clone(),
            tensors,
            unsupported: HashMap::new(),
        })
    }

    /// Adds a tensor held in memory, for what a view cannot express (a transposed matrix).
    pub fn insert_owned(
        &mut self,
        name: String,
        dtype: DType,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    ) -> Result<(), LoadError> {
        let elements: usize = shape.iter().product();
        if elements * dtype.size() != bytes.len() {
            return Err(LoadError::ShapeMismatch {
                name,
                actual: vec![bytes.len() / dtype.size()],
                expected: shape,
            });
        }
        let end = bytes.len();
        self.blobs.push(Arc::new(Blob::Owned(bytes)));
        let entry = Entry {
            blob: self.blobs.len() - 1,
            dtype,
            shape,
            start: 0,
            end,
        };
        self.tensors.insert(name, entry);
        Ok(())
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
    unsupported: &mut HashMap<String, String>,
) -> Result<(), LoadError> {
    let corrupt = |message: String| LoadError::CorruptWeights {
        path: path.to_owned(),
        message,
    };
    // The format's own reader checks the header: its length, its JSON, every tensor's size
    // against its dtype and shape, and that the tensors tile the data section exactly.
    let (header_len, metadata) = safetensors::SafeTensors::read_metadata(map)
        .map_err(|e| corrupt(header_problem(&e, map.len())))?;
    let data_start = 8 + header_len;
    for (name, info) in metadata.tensors() {
        let dtype = match info.dtype {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::U8 => DType::U8,
            // Integer buffers such as CLIP's `position_ids`: an error only when asked for.
            other => {
                unsupported.insert(name, format!("{other:?}"));
                continue;
            }
        };
        let (start, end) = info.data_offsets;
        tensors.insert(
            name,
            Entry {
                blob: file,
                dtype,
                shape: info.shape.clone(),
                start: data_start + start,
                end: data_start + end,
            },
        );
    }
    Ok(())
}

/// What is wrong with a header, in words that say what to do about it.
fn header_problem(e: &safetensors::SafeTensorError, file_len: usize) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooSmall => {
            format!("file is {file_len} bytes, too short for a safetensors header")
        }
        E::HeaderTooLarge | E::InvalidHeaderLength => format!(
            "the header length does not fit in the file ({file_len} bytes): truncated or not a safetensors file"
        ),
        E::InvalidHeader(e) => format!("header is not UTF-8: {e}"),
        E::InvalidHeaderDeserialization(e) => format!("header is not valid safetensors JSON: {e}"),
        E::MetadataIncompleteBuffer => format!(
            "the tensors the header lists do not end where the file ({file_len} bytes) does: the file is truncated or has bytes past its last tensor"
        ),
        E::InvalidOffset(name) => format!(
            "tensor {name:?}: its data_offsets do not match its dtype and shape, or do not follow the tensor before it"
        ),
        E::TensorInvalidInfo | E::ValidationOverflow => {
            "a tensor's shape and dtype give an impossible size".into()
        }
        other => other.to_string(),
    }
}
