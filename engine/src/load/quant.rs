//! CPU reference dequantizers (and quantizers) for the GGML block formats, bit for bit as
//! ggml defines them. They are the ground truth the GPU kernels are tested against, and the
//! path for tensors that are read on the host (norm weights, biases).

use super::gguf::GgmlType;

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Scale and minimum of sub-block `j` from the 12 packed 6-bit values of a Q4_K/Q5_K block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes whole blocks of `ty` from `data` into `out` (`out.len()` elements; `data` must
/// hold exactly the corresponding blocks).
/// The e2m1 codes' values, doubled (ggml's `kvalues_mxfp4`): bit 3 is the sign.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the e8m0 scale, 2^(e - 128), for the doubled values of [`MXFP4_VALUES`]: built from
/// its bits as ggml does (`ggml_e8m0_to_fp32_half`), subnormal for e < 2.
pub fn mxfp4_scale(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// One MXFP4 block in ggml's layout (exponent, then element j in the low nibble of byte j and
/// element j + 16 in its high nibble) from the layout of published safetensors checkpoints
/// (16 bytes holding elements 2i in the low and 2i + 1 in the high nibble of byte i, and the
/// exponent apart).
pub fn mxfp4_block_from_pairs(pairs: &[u8], exponent: u8) -> [u8; 17] {
    let nibble = |m: usize| (pairs[m / 2] >> (4 * (m % 2))) & 0xF;
    let mut block = [0u8; 17];
    block[0] = exponent;
    for j in 0..16 {
        block[1 + j] = nibble(j) | (nibble(j + 16) << 4);
    }
    block
}

pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    let be = ty.block_elems();
    let bb = ty.block_bytes();
    debug_assert_eq!(data.len() / bb * be, out.len());
    for (block, y) in data.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        dequantize_block(ty, block, y);
    }
}

fn dequantize_block(ty: GgmlType, b: &[u8], y: &mut [f32]) {
    match ty {
        GgmlType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => y[0] = f16_at(b, 0),
        GgmlType::BF16 => y[0] = half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::Q8_0 => {
            let d = f16_at(b, 0);
            for (i, v) in y.iter_mut().enumerate() {
                *v = f32::from(b[2 + i] as i8) * d;
            }
        }
        GgmlType::Mxfp4 => {
            // ggml's form: doubled e2m1 values times 2^(e - 128) (the e8m0 scale halved).
            let d = mxfp4_scale(b[0]);
            for j in 0..16 {
                y[j] = f32::from(MXFP4_VALUES[usize::from(b[1 + j] & 0xF)]) * d;
                y[j + 16] = f32::from(MXFP4_VALUES[usize::from(b[1 + j] >> 4)]) * d;
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            // Exactly ggml's expressions, signed zeros included.
            let d = f16_at(b, 0);
            if ty == GgmlType::Q4_1 {
                let (m, qs) = (f16_at(b, 2), &b[4..20]);
                for j in 0..16 {
                    y[j] = f32::from(qs[j] & 0xF) * d + m;
                    y[j + 16] = f32::from(qs[j] >> 4) * d + m;
                }
            } else {
                let qs = &b[2..18];
                for j in 0..16 {
                    y[j] = f32::from(i16::from(qs[j] & 0xF) - 8) * d;
                    y[j + 16] = f32::from(i16::from(qs[j] >> 4) - 8) * d;
                }
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let d = f16_at(b, 0);
            let (m, qh_at, offset) = if ty == GgmlType::Q5_1 {
                (f16_at(b, 2), 4, 0)
            } else {
                (0.0, 2, 16)
            };
            let qh = u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]]);
            let qs = &b[qh_at + 4..qh_at + 20];
            for j in 0..16 {
                let h0 = ((qh >> j) << 4) & 0x10;
                let h1 = (qh >> (j + 12)) & 0x10;
                let x0 = u32::from(qs[j] & 0xF) | h0;
                let x1 = u32::from(qs[j] >> 4) | h1;
                if ty == GgmlType::Q5_1 {
                    y[j] = x0 as f32 * d + m;
                    y[j + 16] = x1 as f32 * d + m;
                } else {
                    y[j] = (x0 as i32 - offset) as f32 * d;
                    y[j + 16] = (x1 as i32 - offset) as f32 * d;
                }
            }
        }
        GgmlType::Q4K => {
            let d = f16_at(b, 0);
            let dmin = f16_at(b, 2);
            let scales = &b[4..16];
            let qs = &b[16..144];
            for chunk in 0..4 {
                let (sc1, m1) = scale_min_k4(2 * chunk, scales);
                let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
                let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
                let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
                let q = &qs[32 * chunk..32 * chunk + 32];
                for l in 0..32 {
                    y[64 * chunk + l] = d1 * f32::from(q[l] & 0xF) - min1;
                    y[64 * chunk + 32 + l] = d2 * f32::from(q[l] >> 4) - min2;
                }
            }
        }
        GgmlType::Q5K => {
            let d = f16_at(b, 0);
            let dmin = f16_at(b, 2);
            let scales = &b[4..16];
            let qh = &b[16..48];
            let qs = &b[48..176];
            for chunk in 0..4 {
                let (sc1, m1) = scale_min_k4(2 * chunk, scales);
                let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
                let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
                let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
                let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
                let q = &qs[32 * chunk..32 * chunk + 32];
                for l in 0..32 {
                    let hi1 = if qh[l] & u1 != 0 { 16.0 } else { 0.0 };
                    let hi2 = if qh[l] & u2 != 0 { 16.0 } else { 0.0 };
                    y[64 * chunk + l] = d1 * (f32::from(q[l] & 0xF) + hi1) - min1;
                    y[64 * chunk + 32 + l] = d2 * (f32::from(q[l] >> 4) + hi2) - min2;
                }
            }
        }
        GgmlType::Q6K => {
            let ql = &b[0..128];
            let qh = &b[128..192];
            let sc = &b[192..208];
            let d = f16_at(b, 208);
            for half in 0..2 {
                let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
                let y = &mut y[128 * half..];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                    let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    let s = |k: usize| d * f32::from(sc[is + k] as i8);
                    y[l] = s(0) * q1 as f32;
                    y[l + 32] = s(2) * q2 as f32;
                    y[l + 64] = s(4) * q3 as f32;
                    y[l + 96] = s(6) * q4 as f32;
                }
            }
        }
    }
}

/// For the GPU layout (shaders/quant.wgsl): which bytes of a block are payload (whole words)
/// and which are its f16 scales, for each quantized type; None for unquantized types.
fn gpu_split(ty: GgmlType) -> Option<([std::ops::Range<usize>; 2], std::ops::Range<usize>)> {
    use GgmlType as T;
    Some(match ty {
        T::Q8_0 => ([2..34, 0..0], 0..2),
        T::Q4_0 => ([2..18, 0..0], 0..2),
        T::Q4_1 => ([4..20, 0..0], 0..4),
        // Quants first, then the high bits, so the payload is qs words then the qh word.
        T::Q5_0 => ([6..22, 2..6], 0..2),
        T::Q5_1 => ([8..24, 4..8], 0..4),
        T::Q4K => ([0..144, 0..0], 0..0),
        T::Q5K => ([0..176, 0..0], 0..0),
        T::Q6K => ([0..208, 0..0], 208..210),
        // The e8m0 exponent is the scale: one byte a block.
        T::Mxfp4 => ([1..17, 0..0], 0..1),
        T::F32 | T::F16 | T::BF16 => return None,
    })
}

/// Bytes a block of `ty` takes in the GPU layout: (payload, scales); None for unquantized
/// types.
pub fn gpu_block_parts(ty: GgmlType) -> Option<(usize, usize)> {
    let (payload, scale) = gpu_split(ty)?;
    Some((payload.iter().map(|r| r.len()).sum(), scale.len()))
}

/// The GPU layout of `blocks` blocks of `ty`: (total bytes, whole words; word offset of the
/// scales). None for unquantized types.
pub fn gpu_layout(ty: GgmlType, blocks: usize) -> Option<(usize, u32)> {
    let (payload, scale) = gpu_block_parts(ty)?;
    let scales_at = blocks * payload;
    Some((
        (scales_at + blocks * scale).div_ceil(4) * 4,
        (scales_at / 4) as u32,
    ))
}

/// Repacks whole source rows of blocks into their stretch of the GPU layout's payload region
/// and of its scales region (each exactly as long as those rows need).
pub fn repack_rows<'r>(
    ty: GgmlType,
    rows: impl IntoIterator<Item = &'r [u8]>,
    payload_out: &mut [u8],
    scales_out: &mut [u8],
) {
    let Some((payload, scale)) = gpu_split(ty) else {
        return;
    };
    let bb = ty.block_bytes();
    let (mut p, mut s) = (0, 0);
    for row in rows {
        for block in row.chunks_exact(bb) {
            for r in &payload {
                payload_out[p..p + r.len()].copy_from_slice(&block[r.clone()]);
                p += r.len();
            }
            scales_out[s..s + scale.len()].copy_from_slice(&block[scale.clone()]);
            s += scale.len();
        }
    }
    debug_assert_eq!((p, s), (payload_out.len(), scales_out.len()));
}

/// Repacks a quantized `[rows][cols]` matrix (row `i` taken from source row `src_row(i)`) into
/// the GPU layout: every block's payload words, then all block scales. Returns the bytes and
/// the word offset of the scales; None for unquantized types.
pub fn repack_for_gpu(
    ty: GgmlType,
    data: &[u8],
    rows: usize,
    cols: usize,
    src_row: impl Fn(usize) -> usize,
) -> Option<(Vec<u8>, u32)> {
    let blocks = rows * (cols / ty.block_elems());
    let (len, offset) = gpu_layout(ty, blocks)?;
    let (payload, scale) = gpu_block_parts(ty)?;
    let row_bytes = cols / ty.block_elems() * ty.block_bytes();
    let mut out = vec![0u8; len];
    let (payload_out, rest) = out.split_at_mut(blocks * payload);
    let source = (0..rows).map(|i| &data[src_row(i) * row_bytes..(src_row(i) + 1) * row_bytes]);
    repack_rows(ty, source, payload_out, &mut rest[..blocks * scale]);
    Some((out, offset))
}

/// `n` blocks of `ty` with pseudo-random quants and small finite scales (weights of
/// benchmark models at real shapes).
pub fn random_blocks(ty: GgmlType, n: usize, seed: u32) -> Vec<u8> {
    random_blocks_scaled(ty, n, seed, 1.0)
}

/// As [`random_blocks`], with values `gain` times larger. The formats with a minimum or an
/// offset get one that centres their values on zero: a model whose every matrix leans one way
/// gives every token nearly the same hidden state, and a mixture-of-experts router then sends
/// a whole prompt to the same few experts.
pub fn random_blocks_scaled(ty: GgmlType, n: usize, seed: u32, gain: f32) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut state = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = vec![0u8; n * bb];
    for chunk in out.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    let d = 0.01 * gain;
    let half = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let scale = half(d);
    // Quants 0..15 (0..31 with a fifth bit) average 7.5 (15.5); K formats subtract dmin times
    // a 6-bit minimum as random as the scale it offsets.
    let mean_q = if matches!(ty, GgmlType::Q5_1 | GgmlType::Q5K) {
        15.5
    } else {
        7.5
    };
    // 2^-7 / 2: values up to 12·2^-8, times the gain's nearest power of two.
    let mxfp4_exponent = (121.0 + gain.log2().round()).clamp(1.0, 254.0) as u8;
    for block in out.chunks_mut(bb) {
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => block[..2].copy_from_slice(&scale),
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                block[..2].copy_from_slice(&scale);
                block[2..4].copy_from_slice(&half(-mean_q * d));
            }
            GgmlType::Q4K | GgmlType::Q5K => {
                block[..2].copy_from_slice(&scale);
                block[2..4].copy_from_slice(&half(mean_q * d));
            }
            GgmlType::Q6K => block[208..210].copy_from_slice(&scale),
            GgmlType::Mxfp4 => block[0] = mxfp4_exponent,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {}
        }
    }
    out
}

/// Quantizes `x` (a whole number of blocks) to Q8_0 as ggml does: per block of 32,
/// d = max|x| / 127 and q = round(x / d).
pub fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    for block in x.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for &v in block {
            out.push((v * id).round() as i8 as u8);
        }
    }
}

/// Quantizes `x` (a whole number of blocks) to Q4_0 as ggml's reference does: the value of
/// largest magnitude maps to -8, d = max / -8, q = min(15, trunc(x / d + 8.5)).
pub fn quantize_q4_0(x: &[f32], out: &mut Vec<u8>) {
    for block in x.chunks(32) {
        let max = block
            .iter()
            .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        for j in 0..16 {
            out.push(q(block[j]) | (q(block[j + 16]) << 4));
        }
    }
}

/// Quantizes `x` (a whole number of 256-element super-blocks) to Q4_K: per 32-element
/// sub-block an affine 4-bit code (scale and minimum), the sub-block scales and minimums
/// themselves 6-bit codes of the super-block's f16 `d` and `dmin`.
pub fn quantize_q4_k(x: &[f32], out: &mut Vec<u8>) {
    for block in x.chunks(256) {
        let mut scales = [0.0f32; 8];
        let mut mins = [0.0f32; 8];
        for (j, sub) in block.chunks(32).enumerate() {
            let lo = sub.iter().fold(0.0f32, |m, &v| m.min(v));
            let hi = sub.iter().fold(f32::MIN, |m, &v| m.max(v));
            scales[j] = (hi - lo).max(0.0) / 15.0;
            mins[j] = -lo;
        }
        let max_scale = scales.iter().fold(0.0f32, |m, &v| m.max(v));
        let max_min = mins.iter().fold(0.0f32, |m, &v| m.max(v));
        let d = half::f16::from_f32(max_scale / 63.0);
        let dmin = half::f16::from_f32(max_min / 63.0);
        let (df, dminf) = (d.to_f32(), dmin.to_f32());
        let code = |v: f32, unit: f32| {
            if unit > 0.0 {
                (v / unit).round().clamp(0.0, 63.0) as u8
            } else {
                0
            }
        };
        let sc: Vec<u8> = scales.iter().map(|&v| code(v, df)).collect();
        let mn: Vec<u8> = mins.iter().map(|&v| code(v, dminf)).collect();
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
        // The 12-byte packing that dequantization's scale_min_k4 reads back.
        let mut packed = [0u8; 12];
        for j in 0..4 {
            packed[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
            packed[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
            packed[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
        }
        out.extend_from_slice(&packed);
        let mut q = [0u8; 256];
        for (j, sub) in block.chunks(32).enumerate() {
            let step = df * f32::from(sc[j]);
            let offset = dminf * f32::from(mn[j]);
            for (l, &v) in sub.iter().enumerate() {
                q[32 * j + l] = if step > 0.0 {
                    ((v + offset) / step).round().clamp(0.0, 15.0) as u8
                } else {
                    0
                };
            }
        }
        // Chunk c packs sub-block 2c in the low nibbles and 2c+1 in the high.
        for c in 0..4 {
            for l in 0..32 {
                out.push(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_and_q4_0_round_trip_within_their_steps() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) / 10.0)
            .collect();
        let mut q8 = Vec::new();
        quantize_q8_0(&x, &mut q8);
        let mut y = vec![0.0; 64];
        dequantize(GgmlType::Q8_0, &q8, &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 3.15 / 127.0 * 0.51 + 1e-3, "{a} vs {b}");
        }
        let mut q4 = Vec::new();
        quantize_q4_0(&x, &mut q4);
        dequantize(GgmlType::Q4_0, &q4, &mut y);
        // Q4_0 spans [-8, 7]·d: the extreme of the opposite sign to the block's largest
        // magnitude is off by up to one whole step.
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 3.15 / 8.0 * 1.01, "{a} vs {b}");
        }
    }

    #[test]
    fn q4_k_round_trips_within_its_steps() {
        // Sub-blocks of different ranges and offsets, including all-positive and constant.
        let x: Vec<f32> = (0..512)
            .map(|i| {
                let sub = i / 32;
                let t = ((i * 7919) % 97) as f32 / 96.0;
                match sub % 4 {
                    0 => t * 2.0 - 1.0,
                    1 => t * 0.1 + 0.5,
                    2 => 0.25,
                    _ => (t - 0.5) * 8.0,
                }
            })
            .collect();
        let mut q = Vec::new();
        quantize_q4_k(&x, &mut q);
        assert_eq!(q.len(), 2 * 144);
        let mut y = vec![0.0; 512];
        dequantize(GgmlType::Q4K, &q, &mut y);
        for sub in 0..16 {
            let xs = &x[32 * sub..32 * sub + 32];
            let range =
                xs.iter().fold(0.0f32, |m, &v| m.max(v)) - xs.iter().fold(0.0f32, |m, &v| m.min(v));
            // Half a 4-bit step, plus the 6-bit coding of the sub-block scale and minimum.
            let allowed = range / 15.0 * 0.5 + range * 0.05 + 0.02;
            for l in 0..32 {
                let (a, b) = (xs[l], y[32 * sub + l]);
                assert!(
                    (a - b).abs() <= allowed,
                    "sub {sub} element {l}: {a} vs {b}"
                );
            }
        }
    }
}
