//! A weight tensor as its file holds it (safetensors view or GGUF bytes), and its rows.

use super::weight_rows::RawRow;
use crate::load::quant::dequantize;
use crate::load::{DType, GgmlType, TensorView, unpermuted_row};

/// A tensor on the host, in whatever form its file holds it.
pub(super) enum HostTensor<'a> {
    /// A safetensors tensor, seen as `rows` rows (a 3-D tensor of experts as one matrix).
    Safe { view: TensorView<'a>, rows: usize },
    Gguf {
        ty: GgmlType,
        data: &'a [u8],
        row_len: usize,
        rows: usize,
        /// Q/K rows that llama.cpp's converter interleaved per head: undo while reading.
        heads: Option<u32>,
    },
}

impl<'a> HostTensor<'a> {
    /// The bytes of each row, in order (Q/K rows of a GGUF file un-interleaved).
    pub(super) fn rows(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        let (bytes, rows, row_bytes, heads): (&'a [u8], usize, usize, Option<u32>) = match self {
            Self::Safe { view, rows } => (view.bytes, *rows, view.bytes.len() / rows.max(&1), None),
            Self::Gguf {
                ty,
                data,
                row_len,
                rows,
                heads,
            } => (
                data,
                *rows,
                row_len / ty.block_elems() * ty.block_bytes(),
                *heads,
            ),
        };
        (0..rows).map(move |i| {
            let src = heads.map_or(i, |h| unpermuted_row(i, rows, h));
            &bytes[src * row_bytes..(src + 1) * row_bytes]
        })
    }

    /// The tensor's bytes cut into `rows` equal rows as the file stores them, where it needs
    /// no block decoding and no rows are interleaved.
    pub(super) fn raw_rows_split(&self, rows: usize) -> Option<Vec<RawRow<'a>>> {
        let ty = self.raw_type()?;
        let bytes = match self {
            Self::Safe { view, .. } => view.bytes,
            Self::Gguf {
                data, heads: None, ..
            } => data,
            Self::Gguf { .. } => return None,
        };
        if rows == 0 || !bytes.len().is_multiple_of(rows) {
            return None;
        }
        bytes
            .chunks_exact(bytes.len() / rows)
            .map(|b| RawRow::of(ty, b))
            .collect()
    }

    /// The file's element type where it needs no block decoding.
    pub(super) fn raw_type(&self) -> Option<GgmlType> {
        match self {
            Self::Safe { view, .. } => match view.dtype {
                DType::F32 => Some(GgmlType::F32),
                DType::F16 => Some(GgmlType::F16),
                DType::BF16 => Some(GgmlType::BF16),
                DType::U8 => None,
            },
            Self::Gguf { ty, .. } => RawRow::of(*ty, &[]).map(|_| *ty),
        }
    }

    /// Row `i` of the tensor seen as `[rows][c]`.
    pub(super) fn read_row(&self, i: usize, c: usize, out: &mut [f32]) {
        match self {
            Self::Safe { view, .. } => view.read_f32(i * c, out),
            Self::Gguf { ty, .. } => {
                if let Some(row) = self.rows().nth(i) {
                    dequantize(*ty, row, out);
                }
            }
        }
    }

    pub(super) fn to_f32(&self) -> Vec<f32> {
        match self {
            Self::Safe { view, .. } => view.to_f32(),
            Self::Gguf {
                ty,
                data,
                row_len,
                rows,
                heads,
            } => {
                let mut flat = vec![0.0; data.len() / ty.block_bytes() * ty.block_elems()];
                dequantize(*ty, data, &mut flat);
                let Some(h) = heads else {
                    return flat;
                };
                if self.is_vector() {
                    // A Q/K bias: its elements follow the permuted rows.
                    let n = flat.len();
                    return (0..n).map(|i| flat[unpermuted_row(i, n, *h)]).collect();
                }
                let mut out = vec![0.0; flat.len()];
                for (i, row) in out.chunks_mut(*row_len).enumerate() {
                    let src = unpermuted_row(i, *rows, *h);
                    row.copy_from_slice(&flat[src * row_len..(src + 1) * row_len]);
                }
                out
            }
        }
    }

    pub(super) fn is_vector(&self) -> bool {
        matches!(self, Self::Gguf { rows, row_len, data, ty, .. }
            if rows == row_len && data.len() == row_len / ty.block_elems() * ty.block_bytes())
    }
}
