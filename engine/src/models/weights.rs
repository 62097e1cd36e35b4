//! Getting weight tensors onto the GPU in the kernels' layout: matrices row-major with padded
//! rows in the chosen dtype (GPT-2's Conv1D `[in, out]` transposed on the way), norms and
//! biases as f32 vectors. Random weights for benchmarks are generated on the GPU.

use crate::Error;
use crate::gpu::{Gpu, StorageBuffer};
use crate::load::quant::{
    gpu_layout, quantize_q4_0, quantize_q4_k, quantize_q8_0, random_blocks_scaled,
};
use crate::load::{DecoderSpec, GgmlType, GgufFile, LoadError, SafeTensors, gguf_tensor_name};
use crate::ops::{Matrix, WeightDType, encode_row, fill_random};

use super::host_tensor::HostTensor;
use super::weight_rows::{RawRow, encode_conv_row, encode_raw_row, fill_block_rows, fill_rows};

/// Where a model's weights come from.
pub enum WeightSource<'a> {
    Files(&'a SafeTensors),
    /// A GGUF file; names are mapped from the engine's (HF) names, and quantized tensors are
    /// dequantized on the host while uploading.
    Gguf(&'a GgufFile, &'a DecoderSpec),
    /// Random values on the GPU (benchmarks at real shapes).
    Random {
        seed: u32,
    },
}

/// One tensor that contributes rows to a matrix, with the shape it must have.
pub struct Part<'n> {
    pub name: &'n str,
    pub rows: u32,
    pub cols: u32,
}

pub struct Uploader<'a> {
    pub gpu: &'a Gpu,
    pub source: WeightSource<'a>,
    pub dtype: WeightDType,
    /// Bytes of weights placed on the GPU so far.
    pub bytes: u64,
    /// Keep block-quantized tensors (GGUF) in their format rather than expanding them.
    pub keep_quantized: bool,
    /// Quantize other weight matrices to this block format while loading (rows that are not
    /// whole blocks stay dense).
    pub quantize: Option<GgmlType>,
    counter: u32,
    /// Multiplies the values of the random matrices made while set (see `with_random_gain`).
    random_gain: f32,
}

const ROWS_PER_CHUNK: usize = 256;

/// Whether a tensor of shape `actual` holds a `wanted` one in the same row-major order: the
/// same shape, or leading dimensions that merge into the wanted rows (a 3-D tensor of experts
/// read as one matrix, `[experts][n]` biases as one vector).
fn same_layout(actual: &[usize], wanted: &[usize]) -> bool {
    if actual == wanted {
        return true;
    }
    let product = |s: &[usize]| s.iter().product::<usize>();
    match wanted {
        [_] => actual.len() > 1 && product(actual) == product(wanted),
        // A one-row matrix stored as a vector (GGUF's shared-expert gate).
        [1, cols] if actual == [*cols] => true,
        [_, cols] => {
            actual.len() > 2 && actual.last() == Some(cols) && product(actual) == product(wanted)
        }
        _ => false,
    }
}

impl<'a> Uploader<'a> {
    pub fn new(gpu: &'a Gpu, source: WeightSource<'a>, dtype: WeightDType) -> Self {
        Self {
            gpu,
            source,
            dtype,
            bytes: 0,
            keep_quantized: true,
            quantize: None,
            counter: 0,
            random_gain: 1.0,
        }
    }

    /// Runs `make` with the random matrices it makes `gain` times larger (random weights
    /// only; files are read as they are).
    pub fn with_random_gain<T>(
        &mut self,
        gain: f32,
        make: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let before = std::mem::replace(&mut self.random_gain, gain);
        let made = make(self);
        self.random_gain = before;
        made
    }

    /// Whether the weights come from a GGUF file (whose converter already stored Conv1D
    /// matrices as `[out][in]`).
    pub fn is_gguf(&self) -> bool {
        matches!(self.source, WeightSource::Gguf(..))
    }

    /// Whether the weights are generated (benchmarks at real shapes).
    pub fn is_random(&self) -> bool {
        matches!(self.source, WeightSource::Random { .. })
    }

    pub fn has(&self, name: &str) -> bool {
        match &self.source {
            WeightSource::Files(st) => st.contains(name),
            WeightSource::Gguf(file, spec) => {
                gguf_tensor_name(name, spec).is_some_and(|(gguf, _)| file.tensor(&gguf).is_some())
            }
            WeightSource::Random { .. } => true,
        }
    }

    pub(super) fn next_seed(&mut self) -> u32 {
        self.counter += 1;
        match self.source {
            WeightSource::Random { seed } => seed.wrapping_mul(7919).wrapping_add(self.counter),
            WeightSource::Files(_) | WeightSource::Gguf(..) => self.counter,
        }
    }

    pub(super) fn tensor(&self, name: &str, shape: &[usize]) -> Result<HostTensor<'a>, Error> {
        let mismatch = |actual: Vec<usize>| LoadError::ShapeMismatch {
            name: name.to_owned(),
            actual,
            expected: shape.to_vec(),
        };
        match self.source {
            WeightSource::Files(st) => {
                let view = st.get(name)?;
                if !same_layout(view.shape, shape) {
                    return Err(mismatch(view.shape.to_vec()).into());
                }
                let rows = shape.first().copied().unwrap_or(1);
                Ok(HostTensor::Safe { view, rows })
            }
            WeightSource::Gguf(file, spec) => {
                let missing = || LoadError::MissingTensor {
                    name: name.to_owned(),
                };
                let (gguf, heads) = gguf_tensor_name(name, spec).ok_or_else(missing)?;
                let t = file.tensor(&gguf).ok_or_else(missing)?;
                // GGUF lists dimensions fastest first.
                let dims: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
                if !same_layout(&dims, shape) {
                    return Err(mismatch(dims).into());
                }
                Ok(HostTensor::Gguf {
                    ty: t.ggml_type,
                    data: file.data(t),
                    row_len: shape.last().copied().unwrap_or(1),
                    rows: shape.first().copied().unwrap_or(1),
                    heads,
                })
            }
            WeightSource::Random { .. } => Err(Error::Invalid(format!(
                "tensor {name:?} requested from random weights"
            ))),
        }
    }

    /// A matrix made of the rows of `parts` in order. With `transposed`, each part is stored
    /// `[cols][rows]` (Conv1D) and is transposed while uploading.
    pub fn matrix(
        &mut self,
        label: &str,
        parts: &[Part<'_>],
        transposed: bool,
    ) -> Result<Matrix, Error> {
        if self.keep_quantized
            && let Some(m) = self.quantized_matrix(label, parts)?
        {
            self.bytes += m.buffer.size;
            return Ok(m);
        }
        let cols = parts.first().map_or(0, |p| p.cols);
        if let Some(ty) = self.quantize
            && !matches!(self.source, WeightSource::Gguf(..))
            && (cols as usize).is_multiple_of(ty.block_elems())
        {
            return self.quantize_on_load(label, parts, transposed, ty);
        }
        self.dense_matrix(label, parts, transposed)
    }

    /// The block format a matrix part keeps on the GPU (a GGUF tensor uploaded as stored), or
    /// `None` where it is uploaded dense. Parts stack into one block-format matrix only where
    /// they all keep the same one.
    pub fn kept_format(&self, part: &Part<'_>) -> Result<Option<GgmlType>, Error> {
        if !self.keep_quantized || !self.is_gguf() {
            return Ok(None);
        }
        Ok(
            match self.tensor(part.name, &[part.rows as usize, part.cols as usize])? {
                HostTensor::Gguf { ty, .. } if ty.block_elems() > 1 => Some(ty),
                _ => None,
            },
        )
    }

    /// A matrix whose parts are all GGUF tensors of one block format, kept in that format.
    fn quantized_matrix(&self, label: &str, parts: &[Part<'_>]) -> Result<Option<Matrix>, Error> {
        if !matches!(self.source, WeightSource::Gguf(..)) || parts.is_empty() {
            return Ok(None);
        }
        let mut tensors = Vec::with_capacity(parts.len());
        for part in parts {
            let t = self.tensor(part.name, &[part.rows as usize, part.cols as usize])?;
            tensors.push(t);
        }
        let ty = match &tensors[0] {
            HostTensor::Gguf { ty, .. } if ty.block_elems() > 1 => *ty,
            _ => return Ok(None),
        };
        if tensors
            .iter()
            .any(|t| !matches!(t, HostTensor::Gguf { ty: other, .. } if *other == ty))
        {
            return Ok(None);
        }
        let cols = parts[0].cols;
        // Rows of all parts in order (undoing the Q/K interleave), repacked straight into the
        // upload memory.
        let rows: Vec<&[u8]> = tensors.iter().flat_map(HostTensor::rows).collect();
        let blocks_per_row = cols as usize / ty.block_elems();
        let (size, scales_at) = gpu_layout(ty, rows.len() * blocks_per_row).ok_or_else(|| {
            Error::Invalid(format!("{label}: {} is not a block format", ty.name()))
        })?;
        let buffer = self.gpu.storage_filled(label, size as u64, |out| {
            fill_block_rows(ty, &rows, blocks_per_row, out)
        })?;
        Ok(Some(Matrix {
            buffer,
            rows: rows.len() as u32,
            cols,
            dtype: WeightDType::F32,
            quant: Some((ty, scales_at)),
        }))
    }

    /// The rows of the matrix made of `parts` as their files store them, where none needs
    /// block decoding or transposing.
    fn raw_rows(
        &self,
        parts: &[Part<'_>],
        transposed: bool,
    ) -> Result<Option<Vec<RawRow<'a>>>, Error> {
        if transposed {
            return Ok(None);
        }
        let mut rows = Vec::new();
        for part in parts {
            let t = self.tensor(part.name, &[part.rows as usize, part.cols as usize])?;
            let Some(ty) = t.raw_type() else {
                return Ok(None);
            };
            rows.extend(t.rows().filter_map(|bytes| RawRow::of(ty, bytes)));
        }
        Ok(Some(rows))
    }

    /// Calls `f` with every row of the matrix made of `parts`, as f32.
    fn for_each_row(
        &self,
        parts: &[Part<'_>],
        transposed: bool,
        mut f: impl FnMut(&[f32]),
    ) -> Result<(), Error> {
        for part in parts {
            let (r, c) = (part.rows as usize, part.cols as usize);
            let shape = if transposed { [c, r] } else { [r, c] };
            let view = self.tensor(part.name, &shape)?;
            let dense = if transposed {
                Some(view.to_f32())
            } else {
                None
            };
            let mut row = vec![0.0f32; c];
            for i in 0..r {
                match &dense {
                    Some(d) => {
                        for (j, v) in row.iter_mut().enumerate() {
                            *v = d[j * r + i];
                        }
                    }
                    None => view.read_row(i, c, &mut row),
                }
                f(&row);
            }
        }
        Ok(())
    }

    /// A matrix quantized while loading (`quantize`): from the file's rows, or random blocks.
    fn quantize_on_load(
        &mut self,
        label: &str,
        parts: &[Part<'_>],
        transposed: bool,
        ty: GgmlType,
    ) -> Result<Matrix, Error> {
        let cols = parts.first().map_or(0, |p| p.cols);
        let rows: u32 = parts.iter().map(|p| p.rows).sum();
        let blocks = if let WeightSource::Random { .. } = self.source {
            let seed = self.next_seed();
            let blocks = rows as usize * cols as usize / ty.block_elems();
            random_blocks_scaled(ty, blocks, seed, self.random_gain)
        } else {
            let mut blocks = Vec::new();
            let mut failed = None;
            self.for_each_row(parts, transposed, |row| match ty {
                GgmlType::Q8_0 => quantize_q8_0(row, &mut blocks),
                GgmlType::Q4_0 => quantize_q4_0(row, &mut blocks),
                GgmlType::Q4K => quantize_q4_k(row, &mut blocks),
                other => failed = Some(other),
            })?;
            if let Some(other) = failed {
                return Err(Error::Invalid(format!(
                    "quantizing to {} while loading is not supported (q8_0, q4_0, q4_k are)",
                    other.name()
                )));
            }
            blocks
        };
        self.gpu
            .check_binding_size(label, blocks.len() as u64 + blocks.len() as u64 / 8)?;
        let m = Matrix::from_blocks(self.gpu, label, ty, &blocks, rows, cols)?;
        self.bytes += m.buffer.size;
        Ok(m)
    }

    /// A matrix in the dense dtype; see [`Uploader::matrix`].
    pub fn dense_matrix(
        &mut self,
        label: &str,
        parts: &[Part<'_>],
        transposed: bool,
    ) -> Result<Matrix, Error> {
        let cols = parts.first().map_or(0, |p| p.cols);
        let rows: u32 = parts.iter().map(|p| p.rows).sum();
        let size = Matrix::byte_size(rows, cols, self.dtype);
        self.gpu.check_binding_size(label, size)?;
        let buffer = match self.source {
            WeightSource::Random { .. } => {
                let seed = self.next_seed();
                let buffer = self.gpu.storage(label, size)?;
                // Scaled like a trained model's weights so activations stay finite.
                let scale = self.random_gain / (cols.max(1) as f32).sqrt();
                fill_random(self.gpu, &buffer, self.dtype, seed, scale, false)?;
                buffer
            }
            WeightSource::Files(_) | WeightSource::Gguf(..) => {
                let stride = Matrix::padded_cols(cols) as usize;
                if let Some(rows) = self.raw_rows(parts, transposed)? {
                    let dtype = self.dtype;
                    let row_bytes = stride * dtype.bytes() as usize;
                    return self.finish_dense(
                        self.gpu.storage_filled(label, size, |out| {
                            fill_rows(&rows, row_bytes, out, |row, dst| {
                                encode_raw_row(*row, dtype, dst)
                            })
                        })?,
                        rows.len() as u32,
                        cols,
                    );
                }
                let mut chunks: Vec<Vec<u8>> = Vec::new();
                let mut bytes = Vec::new();
                self.for_each_row(parts, transposed, |row| {
                    encode_row(row, stride, self.dtype, &mut bytes);
                    if bytes.len() >= ROWS_PER_CHUNK * stride * 4 {
                        chunks.push(std::mem::take(&mut bytes));
                    }
                })?;
                chunks.push(bytes);
                self.gpu.storage_from_chunks(label, size, chunks)?
            }
        };
        self.finish_dense(buffer, rows, cols)
    }

    fn finish_dense(
        &mut self,
        buffer: StorageBuffer,
        rows: u32,
        cols: u32,
    ) -> Result<Matrix, Error> {
        self.bytes += buffer.size;
        Ok(Matrix {
            buffer,
            rows,
            cols,
            dtype: self.dtype,
            quant: None,
        })
    }

    /// An f32 vector: the named tensors concatenated (norm weights, biases). Random weights
    /// use `random_fill`: Some(c) for a constant (norm gains), None for small random values.
    pub fn vector(
        &mut self,
        label: &str,
        parts: &[(&str, u32)],
        random_fill: Option<f32>,
    ) -> Result<StorageBuffer, Error> {
        let len: u32 = parts.iter().map(|p| p.1).sum();
        let buffer = match self.source {
            WeightSource::Random { .. } => {
                let seed = self.next_seed();
                let buffer = self.gpu.storage(label, u64::from(len) * 4)?;
                let (value, constant) = match random_fill {
                    Some(c) => (c, true),
                    None => (0.02, false),
                };
                fill_random(self.gpu, &buffer, WeightDType::F32, seed, value, constant)?;
                buffer
            }
            WeightSource::Files(_) | WeightSource::Gguf(..) => {
                let mut data = Vec::with_capacity(len as usize);
                for (name, n) in parts {
                    let view = self.tensor(name, &[*n as usize])?;
                    data.extend(view.to_f32());
                }
                self.gpu.storage_from(label, &data)?
            }
        };
        self.bytes += buffer.size;
        Ok(buffer)
    }

    /// Gated DeltaNet's per-head decay rates A = −exp(A_log) from the stored A_log (GGUF
    /// converters store A itself); random weights decay at −1.
    pub fn decay_vector(
        &mut self,
        label: &str,
        name: &str,
        heads: u32,
    ) -> Result<StorageBuffer, Error> {
        if matches!(self.source, WeightSource::Random { .. }) {
            return self.vector(label, &[(name, heads)], Some(-1.0));
        }
        let stored = self.tensor(name, &[heads as usize])?.to_f32();
        let data: Vec<f32> = if self.is_gguf() {
            stored
        } else {
            stored.into_iter().map(|a| -a.exp()).collect()
        };
        let buffer = self.gpu.storage_from(label, &data)?;
        self.bytes += buffer.size;
        Ok(buffer)
    }

    /// A norm's scale vector: the stored weights plus `offset` (Gemma stores w of (1 + w));
    /// random weights are all ones.
    pub fn norm_vector(
        &mut self,
        label: &str,
        name: &str,
        width: u32,
        offset: f32,
    ) -> Result<StorageBuffer, Error> {
        if matches!(self.source, WeightSource::Random { .. }) || offset == 0.0 {
            return self.vector(label, &[(name, width)], Some(1.0));
        }
        let data: Vec<f32> = self
            .tensor(name, &[width as usize])?
            .to_f32()
            .into_iter()
            .map(|w| w + offset)
            .collect();
        let buffer = self.gpu.storage_from(label, &data)?;
        self.bytes += buffer.size;
        Ok(buffer)
    }

    /// A dense matrix `[rows][cols]` read from one tensor of another shape with as many
    /// elements in row-major order (a convolution's `[out][in][taps]` as `[out][in·taps]`).
    pub fn reshaped_matrix(
        &mut self,
        label: &str,
        name: &str,
        file_shape: &[usize],
        rows: u32,
        cols: u32,
    ) -> Result<Matrix, Error> {
        let elems: usize = file_shape.iter().product();
        if elems != rows as usize * cols as usize {
            return Err(Error::Invalid(format!(
                "{name}: {file_shape:?} cannot be read as [{rows}, {cols}]"
            )));
        }
        let size = Matrix::byte_size(rows, cols, self.dtype);
        self.gpu.check_binding_size(label, size)?;
        let buffer = if let WeightSource::Random { .. } = self.source {
            let seed = self.next_seed();
            let buffer = self.gpu.storage(label, size)?;
            let scale = 1.0 / (cols.max(1) as f32).sqrt();
            fill_random(self.gpu, &buffer, self.dtype, seed, scale, false)?;
            buffer
        } else {
            let view = self.tensor(name, file_shape)?;
            let stride = Matrix::padded_cols(cols) as usize;
            if let Some(raw) = view.raw_rows_split(rows as usize) {
                let dtype = self.dtype;
                let row_bytes = stride * dtype.bytes() as usize;
                let buffer = self.gpu.storage_filled(label, size, |out| {
                    fill_rows(&raw, row_bytes, out, |row, dst| {
                        encode_raw_row(*row, dtype, dst)
                    })
                })?;
                return self.finish_dense(buffer, rows, cols);
            }
            let mut bytes = Vec::with_capacity(rows as usize * stride * 4);
            let mut row = vec![0.0f32; cols as usize];
            for i in 0..rows as usize {
                view.read_row(i, cols as usize, &mut row);
                encode_row(&row, stride, self.dtype, &mut bytes);
            }
            self.gpu
                .storage_from_chunks(label, size, std::iter::once(bytes))?
        };
        self.bytes += buffer.size;
        Ok(Matrix {
            buffer,
            rows,
            cols,
            dtype: self.dtype,
            quant: None,
        })
    }

    /// A 2-D convolution's weight `[out][in][k][k]` as the `[out][ky·kx·in]` matrix the
    /// implicit-product kernel reads (taps outermost, channels innermost, matching a
    /// channel-last input).
    pub fn conv_matrix(
        &mut self,
        label: &str,
        name: &str,
        out: u32,
        cin: u32,
        k: u32,
    ) -> Result<Matrix, Error> {
        let (taps, cin_us) = ((k * k) as usize, cin as usize);
        let cols = cin * k * k;
        let size = Matrix::byte_size(out, cols, self.dtype);
        self.gpu.check_binding_size(label, size)?;
        let buffer = if let WeightSource::Random { .. } = self.source {
            let seed = self.next_seed();
            let buffer = self.gpu.storage(label, size)?;
            let scale = 1.0 / (cols.max(1) as f32).sqrt();
            fill_random(self.gpu, &buffer, self.dtype, seed, scale, false)?;
            buffer
        } else {
            let shape = [out as usize, cin_us, k as usize, k as usize];
            let view = self.tensor(name, &shape)?;
            let stride = Matrix::padded_cols(cols) as usize;
            if let Some(raw) = view.raw_rows_split(out as usize) {
                let dtype = self.dtype;
                let row_bytes = stride * dtype.bytes() as usize;
                let mut scratch = Vec::new();
                let buffer = self.gpu.storage_filled(label, size, |dst| {
                    fill_rows(&raw, row_bytes, dst, |row, dst| {
                        encode_conv_row(*row, cin_us, taps, dtype, &mut scratch, dst)
                    })
                })?;
                return self.finish_dense(buffer, out, cols);
            }
            let mut chunks = Vec::new();
            let mut bytes = Vec::new();
            let mut row = vec![0.0f32; cols as usize];
            let mut permuted = vec![0.0f32; cols as usize];
            for o in 0..out as usize {
                view.read_row(o, cols as usize, &mut row);
                for ci in 0..cin_us {
                    for t in 0..taps {
                        permuted[t * cin_us + ci] = row[ci * taps + t];
                    }
                }
                encode_row(&permuted, stride, self.dtype, &mut bytes);
                if bytes.len() >= ROWS_PER_CHUNK * stride * 4 {
                    chunks.push(std::mem::take(&mut bytes));
                }
            }
            chunks.push(bytes);
            self.gpu.storage_from_chunks(label, size, chunks)?
        };
        self.bytes += buffer.size;
        Ok(Matrix {
            buffer,
            rows: out,
            cols,
            dtype: self.dtype,
            quant: None,
        })
    }

    /// An f32 vector on the GPU made of named tensors and runs of zeros (`None`): a fused
    /// bias where one part has none. Random weights give zeros.
    pub fn vector_with_zeros(
        &mut self,
        label: &str,
        parts: &[(Option<&str>, u32)],
    ) -> Result<StorageBuffer, Error> {
        let mut data = Vec::new();
        for (name, n) in parts {
            match (name, &self.source) {
                (Some(name), WeightSource::Files(_) | WeightSource::Gguf(..)) => {
                    data.extend(self.tensor(name, &[*n as usize])?.to_f32());
                }
                _ => data.resize(data.len() + *n as usize, 0.0),
            }
        }
        let buffer = self.gpu.storage_from(label, &data)?;
        self.bytes += buffer.size;
        Ok(buffer)
    }

    /// A plain f32 matrix `[rows][cols]` without padding (learned position embeddings).
    pub fn dense(
        &mut self,
        label: &str,
        name: &str,
        rows: u32,
        cols: u32,
    ) -> Result<StorageBuffer, Error> {
        let buffer = match self.source {
            WeightSource::Random { .. } => {
                let seed = self.next_seed();
                let buffer = self
                    .gpu
                    .storage(label, u64::from(rows) * u64::from(cols) * 4)?;
                fill_random(self.gpu, &buffer, WeightDType::F32, seed, 0.02, false)?;
                buffer
            }
            WeightSource::Files(_) | WeightSource::Gguf(..) => {
                let view = self.tensor(name, &[rows as usize, cols as usize])?;
                self.gpu.storage_from(label, &view.to_f32())?
            }
        };
        self.bytes += buffer.size;
        Ok(buffer)
    }
}
