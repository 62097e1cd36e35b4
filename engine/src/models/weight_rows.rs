//! Weight rows written straight from the mapped model file into the GPU's upload memory:
//! rows already in the kernels' dtype copied as stored, f32 and bf16 rows converted a slice at
//! a time, block rows repacked a row at a time. Converting each value through an f32 row
//! made loading bound by the conversions: `generate` on a random-weight SmolLM2-1.7B GGUF took
//! 17 s to load the f16 file (3.4 GB) and over 4 s for q8_0, against 1.8 s for both this way
//! (device machine, H200 host). The GPU also fell to idle clocks during such a long load, so
//! the first prompt ran at a quarter of its speed.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::load::GgmlType;
use crate::load::quant::{gpu_block_parts, repack_rows};
use crate::ops::WeightDType;
use wgpu::WriteOnly;

/// A row's values as the file stores them, when they need no block decoding.
#[derive(Clone, Copy)]
pub enum RawRow<'a> {
    F32(&'a [u8]),
    F16(&'a [u8]),
    Bf16(&'a [u8]),
}

impl<'a> RawRow<'a> {
    /// The row `bytes` of a file tensor in `ty`; None for block formats.
    pub fn of(ty: GgmlType, bytes: &'a [u8]) -> Option<Self> {
        match ty {
            GgmlType::F32 => Some(Self::F32(bytes)),
            GgmlType::F16 => Some(Self::F16(bytes)),
            GgmlType::BF16 => Some(Self::Bf16(bytes)),
            _ => None,
        }
    }
}

/// Values converted per step: enough to amortise the slice conversions, small enough for
/// the stack.
const STEP: usize = 256;

impl RawRow<'_> {
    fn len(self) -> usize {
        match self {
            Self::F32(b) => b.len() / 4,
            Self::F16(b) | Self::Bf16(b) => b.len() / 2,
        }
    }
}

/// Writes `row` into `out`: one row in `dtype`, zero-padded to the length of `out`. Rows
/// already in `dtype` are copied as stored; conversions to f16 saturate.
pub fn encode_raw_row(row: RawRow<'_>, dtype: WeightDType, out: WriteOnly<'_, [u8]>) {
    let n = row.len();
    let (mut out, mut padding) = out.split_at(n * dtype.bytes() as usize);
    padding.fill(0);
    match (row, dtype) {
        (RawRow::F16(b), WeightDType::F16) | (RawRow::F32(b), WeightDType::F32) => {
            out.copy_from_slice(b);
        }
        (row, dtype) => {
            let mut values = [0f32; STEP];
            for start in (0..n).step_by(STEP) {
                let len = STEP.min(n - start);
                to_f32(row, start, &mut values[..len]);
                encode_values(
                    &mut values[..len],
                    dtype,
                    out.slice(start * dtype.bytes() as usize..),
                );
            }
        }
    }
}

/// Writes a convolution's weight row, stored `[in][taps]`, as `[taps][in]` (channels innermost,
/// as the implicit-product kernel reads them) in `dtype`, zero-padded to the length of `out`.
/// `scratch` is reused from row to row.
pub fn encode_conv_row(
    row: RawRow<'_>,
    cin: usize,
    taps: usize,
    dtype: WeightDType,
    scratch: &mut Vec<f32>,
    out: WriteOnly<'_, [u8]>,
) {
    let n = row.len();
    scratch.resize(2 * n, 0.0);
    let (values, permuted) = scratch.split_at_mut(n);
    for start in (0..n).step_by(STEP) {
        to_f32(row, start, &mut values[start..(start + STEP).min(n)]);
    }
    for ci in 0..cin {
        for t in 0..taps {
            permuted[t * cin + ci] = values[ci * taps + t];
        }
    }
    let (out, mut padding) = out.split_at(n * dtype.bytes() as usize);
    padding.fill(0);
    let mut out = out;
    for start in (0..n).step_by(STEP) {
        let len = STEP.min(n - start);
        let (chunk, rest) = out.split_at(len * dtype.bytes() as usize);
        out = rest;
        encode_values(&mut permuted[start..start + len], dtype, chunk);
    }
}

/// Writes at most STEP `values` in `dtype` at the start of `out` (f16 saturating).
fn encode_values(values: &mut [f32], dtype: WeightDType, mut out: WriteOnly<'_, [u8]>) {
    let mut out = out.slice(..values.len() * dtype.bytes() as usize);
    match dtype {
        WeightDType::F32 => out.copy_from_slice(bytemuck::cast_slice(values)),
        WeightDType::F16 => {
            // Saturate rather than turn the rare weight beyond f16's range into infinity.
            for v in values.iter_mut() {
                *v = v.clamp(-65504.0, 65504.0);
            }
            let mut halves = [f16::ZERO; STEP];
            halves[..values.len()].convert_from_f32_slice(values);
            out.copy_from_slice(bytemuck::cast_slice(&halves[..values.len()]));
        }
    }
}

/// Values `start..start + out.len()` of `row` as f32.
fn to_f32(row: RawRow<'_>, start: usize, out: &mut [f32]) {
    let n = out.len();
    match row {
        RawRow::F32(b) => {
            for (o, w) in out
                .iter_mut()
                .zip(b[start * 4..(start + n) * 4].chunks_exact(4))
            {
                *o = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            }
        }
        RawRow::F16(b) => {
            let mut halves = [f16::ZERO; STEP];
            for (h, w) in halves
                .iter_mut()
                .zip(b[start * 2..(start + n) * 2].chunks_exact(2))
            {
                *h = f16::from_le_bytes([w[0], w[1]]);
            }
            halves[..n].convert_to_f32_slice(out);
        }
        RawRow::Bf16(b) => {
            let mut halves = [bf16::ZERO; STEP];
            for (h, w) in halves
                .iter_mut()
                .zip(b[start * 2..(start + n) * 2].chunks_exact(2))
            {
                *h = bf16::from_le_bytes([w[0], w[1]]);
            }
            halves[..n].convert_to_f32_slice(out);
        }
    }
}

/// Fills `out` (`rows.len()` rows of `row_bytes` each) by calling `write` for each row with its
/// stretch of `out`.
pub fn fill_rows<T>(
    rows: &[T],
    row_bytes: usize,
    mut out: WriteOnly<'_, [u8]>,
    mut write: impl FnMut(&T, WriteOnly<'_, [u8]>),
) {
    for row in rows {
        let (dst, after) = out.split_at(row_bytes);
        out = after;
        write(row, dst);
    }
}

/// Repacks whole rows of `ty` blocks (each `blocks_per_row` blocks) into `out`, laid out as
/// `gpu_layout` describes.
pub fn fill_block_rows(
    ty: GgmlType,
    rows: &[&[u8]],
    blocks_per_row: usize,
    out: WriteOnly<'_, [u8]>,
) {
    let Some((payload, scale)) = gpu_block_parts(ty) else {
        return;
    };
    let blocks = rows.len() * blocks_per_row;
    let (mut payload_out, scales) = out.split_at(blocks * payload);
    let (mut scales_out, _) = scales.split_at(blocks * scale);
    // A row at a time through host memory: the mapped memory takes whole copies only.
    let mut row_payload = vec![0u8; blocks_per_row * payload];
    let mut row_scales = vec![0u8; blocks_per_row * scale];
    for row in rows {
        repack_rows(ty, [*row], &mut row_payload, &mut row_scales);
        let (mut dst, after) = payload_out.split_at(row_payload.len());
        payload_out = after;
        dst.copy_from_slice(&row_payload);
        let (mut dst, after) = scales_out.split_at(row_scales.len());
        scales_out = after;
        dst.copy_from_slice(&row_scales);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37).sin() * 3.0 + if i == 5 { 1e6 } else { 0.0 })
            .collect()
    }

    /// Every conversion matches converting one value at a time, with saturation to f16's
    /// range (f16 rows stay as stored), over a row that is not a whole number of steps, and
    /// the padding is zeroed.
    #[test]
    fn raw_rows_encode_like_single_values() {
        let v = values(STEP * 2 + 37);
        let f32_bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let f16_bytes: Vec<u8> = v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect();
        let bf16_bytes: Vec<u8> = v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect();
        let sources = [
            (RawRow::F32(&f32_bytes), v.clone()),
            (
                RawRow::F16(&f16_bytes),
                v.iter().map(|x| f16::from_f32(*x).to_f32()).collect(),
            ),
            (
                RawRow::Bf16(&bf16_bytes),
                v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect(),
            ),
        ];
        for (row, exact) in sources {
            for dtype in [WeightDType::F32, WeightDType::F16] {
                let width = dtype.bytes() as usize;
                let mut out = vec![0u8; (v.len() + 3) * width];
                out.fill(0xAB);
                encode_raw_row(row, dtype, WriteOnly::from(&mut out[..]));
                let expected: Vec<u8> = match (row, dtype) {
                    // Copied as stored, an infinity included.
                    (RawRow::F16(b), WeightDType::F16) => b.to_vec(),
                    (_, WeightDType::F32) => exact.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    (_, WeightDType::F16) => exact
                        .iter()
                        .flat_map(|x| f16::from_f32(x.clamp(-65504.0, 65504.0)).to_le_bytes())
                        .collect(),
                };
                assert_eq!(out[..expected.len()], expected[..]);
                assert!(out[expected.len()..].iter().all(|&b| b == 0));
            }
        }
    }

    /// A convolution row comes out with its taps outermost, as converting each value and
    /// permuting one at a time puts it, over a row longer than a conversion step.
    #[test]
    fn conv_rows_put_taps_outermost() {
        let (cin, taps) = (37, 9);
        let v = values(cin * taps);
        let bf16_bytes: Vec<u8> = v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect();
        let exact: Vec<f32> = v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect();
        let mut scratch = Vec::new();
        for dtype in [WeightDType::F32, WeightDType::F16] {
            let width = dtype.bytes() as usize;
            let mut out = vec![0xABu8; (v.len() + 5) * width];
            encode_conv_row(
                RawRow::Bf16(&bf16_bytes),
                cin,
                taps,
                dtype,
                &mut scratch,
                WriteOnly::from(&mut out[..]),
            );
            let mut expected = Vec::new();
            for t in 0..taps {
                for ci in 0..cin {
                    let x = exact[ci * taps + t];
                    match dtype {
                        WeightDType::F32 => expected.extend(x.to_le_bytes()),
                        WeightDType::F16 => {
                            expected.extend(f16::from_f32(x.clamp(-65504.0, 65504.0)).to_le_bytes())
                        }
                    }
                }
            }
            assert_eq!(out[..expected.len()], expected[..]);
            assert!(out[expected.len()..].iter().all(|&b| b == 0));
        }
    }

    /// Rows repacked one at a time into mapped memory land where repacking the whole
    /// matrix puts them, reordered rows included.
    #[test]
    fn block_rows_fill_like_whole_repacks() {
        // Q6_K keeps its scales apart: both regions must follow the row order.
        let ty = GgmlType::Q6K;
        let blocks_per_row = 3;
        let data: Vec<u8> = (0..400 * blocks_per_row * ty.block_bytes())
            .map(|i| (i * 7 % 253) as u8)
            .collect();
        let row_len = blocks_per_row * ty.block_bytes();
        let rows: Vec<&[u8]> = data.chunks_exact(row_len).rev().collect();
        let n = rows.len();
        let (expected, _) = crate::load::quant::repack_for_gpu(
            ty,
            &data,
            n,
            blocks_per_row * ty.block_elems(),
            |i| n - 1 - i,
        )
        .expect("block format");
        let mut out = vec![0u8; expected.len()];
        fill_block_rows(ty, &rows, blocks_per_row, WriteOnly::from(&mut out[..]));
        assert_eq!(out, expected);
    }
}
