//! The diffusion-transformer kernels (shaders/dit.wgsl) against plain CPU references on random
//! inputs of awkward sizes: patch tokens both ways, the modulated RMS and plain LayerNorm, the
//! gated residual add, head RMSNorm with table RoPE, and padding-token rows (fixed, or from a
//! count read when the pass runs).

mod common;

use backpack_engine::gpu::{Gpu, Recorder, StorageBuffer};
use backpack_engine::ops::{
    Pass, PatchShape, RowNorm, RowNormForm, Slice, bn_unpack, fill_rows, fill_tail, gated_add,
    head_rope, join_half_rows, mod_norm, patchify, scaled_add, unpatchify,
};
use common::{Rng, assert_close, gpu, round_f16};

fn buf(gpu: &Gpu, data: &[f32]) -> StorageBuffer {
    gpu.storage_from("test", data).expect("buffer")
}

fn read(gpu: &Gpu, b: &StorageBuffer, n: usize) -> Vec<f32> {
    gpu.read(&b.buffer, 0, n as u64).expect("read back")
}

fn run(gpu: &Gpu, pass: &Pass) {
    let mut rec = Recorder::new(gpu);
    pass.encode(&mut rec);
    rec.submit();
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
    assert_close(what, got, want, &scale, 1e-5, 1e-5);
}

/// `n` values stored as f16 pairs, one to a 32-bit word.
fn read_halves(gpu: &Gpu, b: &StorageBuffer, n: usize) -> Vec<f32> {
    let words: Vec<u32> = gpu
        .read(&b.buffer, 0, n.div_ceil(2) as u64)
        .expect("read back");
    words
        .iter()
        .flat_map(|w| [*w as u16, (*w >> 16) as u16])
        .take(n)
        .map(|h| half::f16::from_bits(h).to_f32())
        .collect()
}

/// f32 values packed as f16 pairs (what a product with `half_out` writes).
fn halves(values: &[f32]) -> Vec<u32> {
    values
        .chunks(2)
        .map(|p| {
            let lo = half::f16::from_f32(p[0]).to_bits();
            let hi = half::f16::from_f32(p[1]).to_bits();
            u32::from(lo) | (u32::from(hi) << 16)
        })
        .collect()
}

/// Within f16 rounding of a value computed from f16-rounded inputs.
fn close_f16(what: &str, got: &[f32], want: &[f32]) {
    let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
    assert_close(what, got, &round_f16(want), &scale, 2e-3, 2e-3);
}

/// The head norm and rotation of every query and key head of `qkv`, on the CPU.
fn head_rope_ref(
    qkv: &[f32],
    (tokens, heads, head_dim): (usize, usize, usize),
    (q_weight, k_weight): (&[f32], &[f32]),
    table: &[f32],
) -> Vec<f32> {
    let row = 3 * heads * head_dim;
    let mut want = qkv.to_vec();
    for t in 0..tokens {
        for h in 0..2 * heads {
            let base = t * row + h * head_dim;
            let weight = if h < heads { q_weight } else { k_weight };
            let normed = row_norm(&qkv[base..base + head_dim], false, 1e-5);
            for i in 0..head_dim / 2 {
                let a = normed[2 * i] * weight[2 * i];
                let b = normed[2 * i + 1] * weight[2 * i + 1];
                let at = (t * head_dim / 2 + i) * 2;
                let (c, s) = (table[at], table[at + 1]);
                want[base + 2 * i] = a * c - b * s;
                want[base + 2 * i + 1] = a * s + b * c;
            }
        }
    }
    want
}

#[test]
fn patch_tokens_match_cpu_both_ways() {
    let gpu = gpu();
    let mut rng = Rng::new(1);
    for (h, w, c, side) in [(6, 10, 5, 2), (9, 3, 3, 3), (4, 4, 16, 1)] {
        let latent = rng.vec(h * w * c, 1.0);
        let tokens = (h / side) * (w / side);
        let features = side * side * c;
        // diffusers: view(C, H/p, p, W/p, p).permute(H/p, W/p, p, p, C).
        let mut want = vec![0.0; tokens * features];
        for ty in 0..h / side {
            for tx in 0..w / side {
                for py in 0..side {
                    for px in 0..side {
                        for ch in 0..c {
                            let t = ty * (w / side) + tx;
                            let j = (py * side + px) * c + ch;
                            want[t * features + j] =
                                latent[((ty * side + py) * w + tx * side + px) * c + ch];
                        }
                    }
                }
            }
        }
        let shape = PatchShape {
            tokens: tokens as u32,
            width: w as u32,
            channels: c as u32,
            side: side as u32,
        };
        let x = buf(&gpu, &latent);
        let y = buf(&gpu, &vec![0.0; want.len()]);
        run(&gpu, &patchify(&gpu, shape, &x, &y).expect("patchify"));
        let got = read(&gpu, &y, want.len());
        assert_eq!(got, want, "patchify {h}×{w}×{c}, side {side}");
        let back = buf(&gpu, &vec![0.0; latent.len()]);
        run(
            &gpu,
            &unpatchify(&gpu, shape, &y, &back).expect("unpatchify"),
        );
        assert_eq!(read(&gpu, &back, latent.len()), latent, "unpatchify");
    }
}

fn row_norm(row: &[f32], layer: bool, eps: f32) -> Vec<f32> {
    let n = row.len() as f64;
    let mean = if layer {
        row.iter().map(|&v| f64::from(v)).sum::<f64>() / n
    } else {
        0.0
    };
    let var = row
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let inv = 1.0 / (var + f64::from(eps)).sqrt();
    row.iter()
        .map(|&v| ((f64::from(v) - mean) * inv) as f32)
        .collect()
}

#[test]
fn modulated_norms_match_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(2);
    for (rows, cols) in [(37, 75), (5, 300), (1, 1)] {
        let x = rng.vec(rows * cols, 2.0);
        let weight = rng.vec(cols, 1.0);
        let offset = 3;
        let shift_at = offset + cols + 1;
        let modulation = rng.vec(shift_at + cols + 2, 0.5);
        for (norm, with_scale, with_shift) in [
            (RowNorm::Rms, true, false),
            (RowNorm::Rms, false, false),
            (RowNorm::PlainLayer, true, false),
            (RowNorm::PlainLayer, true, true),
        ] {
            let layer = norm == RowNorm::PlainLayer;
            let mut want = Vec::with_capacity(x.len());
            for r in 0..rows {
                let normed = row_norm(&x[r * cols..(r + 1) * cols], layer, 1e-5);
                for (k, v) in normed.iter().enumerate() {
                    let w = if layer { 1.0 } else { weight[k] };
                    let s = if with_scale {
                        1.0 + modulation[offset + k]
                    } else {
                        1.0
                    };
                    let shift = if with_shift {
                        modulation[shift_at + k]
                    } else {
                        0.0
                    };
                    want.push(v * w * s + shift);
                }
            }
            let (xb, wb, mb) = (buf(&gpu, &x), buf(&gpu, &weight), buf(&gpu, &modulation));
            for half_out in [false, true] {
                if half_out && !cols.is_multiple_of(2) {
                    continue;
                }
                let y = buf(&gpu, &vec![0.0; x.len()]);
                let form = RowNormForm {
                    norm,
                    eps: 1e-5,
                    weight: (!layer).then_some(&wb),
                    scale: with_scale.then_some(Slice {
                        buffer: &mb,
                        offset: offset as u32,
                    }),
                    shift: with_shift.then_some(shift_at as u32),
                    half_out,
                };
                let pass =
                    mod_norm(&gpu, (rows as u32, cols as u32), form, &xb, &y).expect("mod_norm");
                run(&gpu, &pass);
                let what = format!(
                    "{norm:?} {rows}×{cols}, scale {with_scale}, shift {with_shift}, f16 {half_out}"
                );
                if half_out {
                    close_f16(&what, &read_halves(&gpu, &y, x.len()), &want);
                } else {
                    close(&what, &read(&gpu, &y, x.len()), &want);
                }
            }
        }
    }
}

#[test]
fn gated_residual_add_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(3);
    for (rows, cols) in [(19, 130), (3, 257)] {
        let branch = rng.vec(rows * cols, 3.0);
        let residual = rng.vec(rows * cols, 1.0);
        let weight = rng.vec(cols, 1.0);
        let gate = rng.vec(2 * cols, 2.0);
        for gated in [true, false] {
            let mut want = residual.clone();
            for r in 0..rows {
                let normed = row_norm(&branch[r * cols..(r + 1) * cols], false, 1e-6);
                for k in 0..cols {
                    let g = if gated { gate[cols + k].tanh() } else { 1.0 };
                    want[r * cols + k] += g * normed[k] * weight[k];
                }
            }
            let (xb, wb, gb) = (buf(&gpu, &branch), buf(&gpu, &weight), buf(&gpu, &gate));
            let y = buf(&gpu, &residual);
            let pass = gated_add(
                &gpu,
                (rows as u32, cols as u32),
                1e-6,
                &wb,
                gated.then_some(Slice {
                    buffer: &gb,
                    offset: cols as u32,
                }),
                &xb,
                &y,
            )
            .expect("gated_add");
            run(&gpu, &pass);
            close(
                &format!("gated add {rows}×{cols}, gate {gated}"),
                &read(&gpu, &y, residual.len()),
                &want,
            );
        }
    }
}

#[test]
fn head_norm_and_table_rope_match_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(4);
    // Heads of fewer pairs than a lane group, of more (96, 128), and items that leave a
    // workgroup's last lane groups idle.
    for (tokens, heads, head_dim) in [(7, 3, 10), (33, 2, 64), (2, 1, 2), (5, 3, 128), (3, 2, 96)] {
        let qkv = rng.vec(tokens * 3 * heads * head_dim, 2.0);
        let q_weight = rng.vec(head_dim, 1.0);
        let k_weight = rng.vec(head_dim, 1.0);
        let angles = rng.vec(tokens * head_dim / 2, 6.0);
        let table: Vec<f32> = angles.iter().flat_map(|a| [a.cos(), a.sin()]).collect();
        let shape = (tokens, heads, head_dim);
        let weights = (q_weight.as_slice(), k_weight.as_slice());
        let (qw, kw, tb) = (
            buf(&gpu, &q_weight),
            buf(&gpu, &k_weight),
            buf(&gpu, &table),
        );
        let what = format!("head rope {tokens} tokens, {heads} heads of {head_dim}");
        let dims = (tokens as u32, heads as u32, head_dim as u32);
        let y = buf(&gpu, &qkv);
        let pass = head_rope(&gpu, dims, 1e-5, &qw, &kw, &tb, &y, false).expect("head_rope");
        run(&gpu, &pass);
        let want = head_rope_ref(&qkv, shape, weights, &table);
        close(&what, &read(&gpu, &y, qkv.len()), &want);
        // From f16 rows (value heads kept as they were): against the rounded inputs.
        let y16 = gpu
            .storage_from("qkv halves", &halves(&qkv))
            .expect("buffer");
        let pass = head_rope(&gpu, dims, 1e-5, &qw, &kw, &tb, &y16, true).expect("head_rope");
        run(&gpu, &pass);
        let want16 = head_rope_ref(&round_f16(&qkv), shape, weights, &table);
        close_f16(
            &format!("{what}, f16"),
            &read_halves(&gpu, &y16, qkv.len()),
            &want16,
        );
    }
    let odd = head_rope(
        &gpu,
        (1, 1, 3),
        1e-5,
        &buf(&gpu, &[1.0; 3]),
        &buf(&gpu, &[1.0; 3]),
        &buf(&gpu, &[1.0; 4]),
        &buf(&gpu, &[0.0; 9]),
        false,
    );
    assert!(odd.is_err(), "odd head sizes are refused");
}

#[test]
fn padding_rows_take_the_token() {
    let gpu = gpu();
    let mut rng = Rng::new(5);
    let (rows, cols, first) = (11, 13, 4);
    let x = rng.vec(rows * cols, 1.0);
    let token = rng.vec(cols, 1.0);
    let y = buf(&gpu, &x);
    let pass = fill_rows(
        &gpu,
        (first as u32, (rows - first) as u32, cols as u32),
        &buf(&gpu, &token),
        &y,
    )
    .expect("fill");
    run(&gpu, &pass);
    let mut want = x.clone();
    for r in first..rows {
        want[r * cols..(r + 1) * cols].copy_from_slice(&token);
    }
    assert_eq!(read(&gpu, &y, x.len()), want);
}

/// The rows past a count read when the pass runs take the token; changing the count between
/// runs of the same pass moves the boundary.
#[test]
fn tail_rows_follow_the_count_set_at_run_time() {
    let gpu = gpu();
    let mut rng = Rng::new(6);
    let (rows, cols) = (9, 7);
    let x = rng.vec(rows * cols, 1.0);
    let token = rng.vec(cols, 1.0);
    let used = gpu.storage_from("used", &[0u32]).expect("buffer");
    let y = buf(&gpu, &x);
    let t = buf(&gpu, &token);
    let pass = fill_tail(&gpu, (rows as u32, cols as u32), &used, &t, &y).expect("fill");
    for count in [9usize, 4, 0] {
        gpu.queue()
            .write_buffer(&y.buffer, 0, bytemuck::cast_slice(&x));
        gpu.queue()
            .write_buffer(&used.buffer, 0, bytemuck::cast_slice(&[count as u32]));
        run(&gpu, &pass);
        let mut want = x.clone();
        for r in count..rows {
            want[r * cols..(r + 1) * cols].copy_from_slice(&token);
        }
        assert_eq!(read(&gpu, &y, x.len()), want, "rows from {count}");
    }
}

#[test]
fn modulated_residual_add_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(9);
    // Rows of whole vec4 words too (36, 128), four values an invocation.
    for (rows, cols) in [(13, 70), (1, 3), (65, 33), (9, 36), (5, 128)] {
        let x = rng.vec(rows * cols, 1.5);
        let y0 = rng.vec(rows * cols, 1.0);
        let offset = 5;
        let m = rng.vec(offset + cols, 0.8);
        let want: Vec<f32> = (0..rows * cols)
            .map(|i| y0[i] + m[offset + i % cols] * x[i])
            .collect();
        let (xb, yb, mb) = (buf(&gpu, &x), buf(&gpu, &y0), buf(&gpu, &m));
        let gate = Slice {
            buffer: &mb,
            offset: offset as u32,
        };
        let pass = scaled_add(&gpu, (rows as u32, cols as u32), gate, &xb, &yb).expect("pass");
        run(&gpu, &pass);
        close(
            &format!("scaled add {rows}×{cols}"),
            &read(&gpu, &yb, want.len()),
            &want,
        );
    }
}

#[test]
fn packed_latents_unpack_with_batch_norm_statistics() {
    let gpu = gpu();
    let mut rng = Rng::new(10);
    // (token rows, token columns, latent channels): FLUX.2 packs 2×2 patches channel-major.
    for (h, w, c) in [(3, 5, 3), (1, 1, 1), (4, 2, 7)] {
        let features = 4 * c;
        let packed = rng.vec(h * w * features, 1.0);
        let stats = rng.vec(2 * features, 1.0);
        let mut want = vec![0.0f32; packed.len()];
        for t in 0..h * w {
            let (ty, tx) = (t / w, t % w);
            for ch in 0..c {
                for dy in 0..2 {
                    for dx in 0..2 {
                        let j = ch * 4 + dy * 2 + dx;
                        let at = ((2 * ty + dy) * 2 * w + 2 * tx + dx) * c + ch;
                        want[at] = packed[t * features + j] * stats[j] + stats[features + j];
                    }
                }
            }
        }
        let (pb, sb) = (buf(&gpu, &packed), buf(&gpu, &stats));
        let out = buf(&gpu, &vec![0.0; packed.len()]);
        let shape = ((h * w) as u32, features as u32, w as u32);
        let pass = bn_unpack(&gpu, shape, &sb, &pb, &out).expect("pass");
        run(&gpu, &pass);
        close(
            &format!("unpack {h}×{w}×{c}"),
            &read(&gpu, &out, want.len()),
            &want,
        );
    }
    let b = buf(&gpu, &[0.0; 8]);
    assert!(
        bn_unpack(&gpu, (2, 6, 1), &b, &b, &b).is_err(),
        "6 features are not 2×2 patches"
    );
}

#[test]
fn rows_join_as_f16_pairs() {
    let gpu = gpu();
    let mut rng = Rng::new(11);
    for (rows, half_cols, full_cols) in [(7, 6, 10), (1, 2, 2), (33, 48, 144)] {
        let first = round_f16(&rng.vec(rows * half_cols, 2.0));
        let second = rng.vec(rows * full_cols, 2.0);
        let mut want = Vec::new();
        for r in 0..rows {
            want.extend_from_slice(&first[r * half_cols..(r + 1) * half_cols]);
            want.extend(round_f16(&second[r * full_cols..(r + 1) * full_cols]));
        }
        let halves_buf = gpu.storage_from("halves", &halves(&first)).expect("buffer");
        let full = buf(&gpu, &second);
        let out = buf(&gpu, &vec![0.0; want.len().div_ceil(2)]);
        let shape = (half_cols as u32, full_cols as u32);
        let pass =
            join_half_rows(&gpu, rows as u32, shape, &halves_buf, &full, &out).expect("pass");
        run(&gpu, &pass);
        let got = read_halves(&gpu, &out, want.len());
        assert_eq!(got, want, "{rows} rows of {half_cols} + {full_cols}");
    }
    let b = buf(&gpu, &[0.0; 4]);
    assert!(
        join_half_rows(&gpu, 1, (3, 2), &b, &b, &b).is_err(),
        "odd widths"
    );
}
