//! Every WGSL kernel against a plain CPU reference on random inputs of awkward sizes (odd
//! lengths, not multiples of any workgroup size), with f32 and f16 storage.
//!
//! Tolerances: both sides accumulate in f32 from identical inputs (f16 weights are rounded on
//! the host before the reference runs), so the only difference is summation order, bounded by
//! about k·2⁻²⁴·Σ|wᵢxᵢ|; we allow 2·10⁻⁵·Σ|wᵢxᵢ| (k ≤ 4100 makes the worst case 2.4·10⁻⁴ but
//! random-sign terms give √k behaviour) plus 10⁻⁵ absolute. f16 caches round values written
//! by the kernel, so those tests compare against a reference that rounds the same values.

#[path = "kernels/attention.rs"]
mod attention;
mod common;
#[path = "kernels/matmul.rs"]
mod matmul;
#[path = "kernels/sampling.rs"]
mod sampling;

use backpack_engine::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use backpack_engine::load::quant::dequantize;
use backpack_engine::load::{GgmlType, RopeScaling, RopeSpec};
use backpack_engine::ops::*;
use common::{
    Rng, assert_close, attention_atol, coop_tiles, gpu, own_gpu, product_gpus, product_input,
    round_f16,
};

const DTYPES: [WeightDType; 2] = [WeightDType::F32, WeightDType::F16];

fn step(gpu: &Gpu, pos0: u32, n: u32) -> UniformBuffer {
    gpu.uniform("step", &StepParams::new(pos0, n))
}

fn buf(gpu: &Gpu, data: &[f32]) -> StorageBuffer {
    gpu.storage_from("test", data).expect("buffer")
}

fn read(gpu: &Gpu, b: &StorageBuffer, n: usize) -> Vec<f32> {
    gpu.read(&b.buffer, 0, n as u64).expect("read back")
}

fn host_weights(w: &[f32], dtype: WeightDType) -> Vec<f32> {
    match dtype {
        WeightDType::F32 => w.to_vec(),
        WeightDType::F16 => round_f16(w),
    }
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

fn gelu_tanh(v: f32) -> f32 {
    let c = (2.0f64 / std::f64::consts::PI).sqrt();
    let v = f64::from(v);
    (0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())) as f32
}

/// erf in f64: Taylor series near zero, asymptotic erfc beyond (both far below f32 precision
/// over the ranges used).
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        let mut term = a;
        let mut sum = a;
        for n in 1..200 {
            term *= -a * a / f64::from(n);
            let add = term / f64::from(2 * n + 1);
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        let x2 = a * a;
        let series = 1.0 - 1.0 / (2.0 * x2) + 3.0 / (4.0 * x2 * x2) - 15.0 / (8.0 * x2 * x2 * x2)
            + 105.0 / (16.0 * x2.powi(4));
        1.0 - (-x2).exp() / (a * std::f64::consts::PI.sqrt()) * series
    };
    r.copysign(x)
}

fn gelu_erf(v: f32) -> f32 {
    let v = f64::from(v);
    (0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2))) as f32
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + f64::from(eps)).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, g)| (f64::from(*v) * inv) as f32 * g)
        .collect()
}

fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let n = x.len() as f64;
    let mean = x.iter().map(|v| f64::from(*v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|v| (f64::from(*v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let inv = 1.0 / (var + f64::from(eps)).sqrt();
    x.iter()
        .zip(w.iter().zip(b))
        .map(|(v, (g, bb))| ((f64::from(*v) - mean) * inv) as f32 * g + bb)
        .collect()
}

/// (values, Σ|terms|) of W·x for each row.
fn matvec_ref(w: &[f32], x: &[f32], rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>) {
    let mut out = Vec::with_capacity(rows);
    let mut mag = Vec::with_capacity(rows);
    for r in 0..rows {
        let (mut s, mut m) = (0.0f64, 0.0f64);
        for c in 0..cols {
            let t = f64::from(w[r * cols + c]) * f64::from(x[c]);
            s += t;
            m += t.abs();
        }
        out.push(s as f32);
        mag.push(m as f32);
    }
    (out, mag)
}

/// Y = X·Wᵀ for `m` rows of `x`, with each output's sum of absolute terms (for tolerances).
fn product_ref(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut out, mut mag) = (Vec::with_capacity(m * n), Vec::with_capacity(m * n));
    for row in x.chunks(k).take(m) {
        let (v, a) = matvec_ref(w, row, n, k);
        out.extend(v);
        mag.extend(a);
    }
    (out, mag)
}

/// `x` as the int8 decode products see it: 32-value blocks, scale max |x| / 127, rounded to
/// even; and per value, the weight of one rounding step where the rounding is a near tie (the
/// GPU normalises the input in f32, so such a value may round the other way there).
fn int8_input(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (mut quantized, mut near_tie) = (Vec::with_capacity(x.len()), Vec::new());
    for block in x.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        for &v in block {
            let t = v * inv;
            quantized.push(t.round_ties_even() * d);
            let tie = ((t - t.trunc()).abs() - 0.5).abs() < 1e-3;
            near_tie.push(if tie { d } else { 0.0 });
        }
    }
    (quantized, near_tie)
}

/// [`matvec_ref`] of the int8 input, the allowance for near-tie roundings added to Σ|terms|.
fn matvec_ref_int8(w: &[f32], x: &[f32], rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>) {
    let (quantized, near_tie) = int8_input(x);
    let (out, mut mag) = matvec_ref(w, &quantized, rows, cols);
    let w_abs: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    let (ties, _) = matvec_ref(&w_abs, &near_tie, rows, cols);
    // Callers allow rtol·mag with rtol 2e-5: two rounding steps per near tie.
    for (m, t) in mag.iter_mut().zip(ties) {
        *m += t * 1e5;
    }
    (out, mag)
}

/// The exact product, with magnitudes that allow for two-level int8 inputs: each value is
/// carried to within 1/64,516 of its 32-value block's largest, below the callers' rtol of 2e-5.
fn matvec_ref_int8_fine(w: &[f32], x: &[f32], rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>) {
    let (out, mut mag) = matvec_ref(w, x, rows, cols);
    let block_max: Vec<f32> = x
        .chunks(32)
        .flat_map(|b| {
            let m = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            std::iter::repeat_n(m, b.len())
        })
        .collect();
    let w_abs: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    let (bound, _) = matvec_ref(&w_abs, &block_max, rows, cols);
    for (m, b) in mag.iter_mut().zip(bound) {
        *m += b;
    }
    (out, mag)
}

#[derive(Clone, Copy, Debug)]
enum Variant {
    Plain,
    Bias,
    Rms,
    LayerBias,
    Glu,
    /// Gemma's gelu_tanh(gate) * up.
    GeGlu,
    GeluBias,
    GeluErfBias,
    Residual,
}

// A test (and a device) per weight type, so that the test threads share the shader compilation.
#[test]
fn matvec_f32_matches_cpu() {
    matvec_parity(&own_gpu(), WeightDType::F32);
}

#[test]
fn matvec_f16_matches_cpu() {
    matvec_parity(&own_gpu(), WeightDType::F16);
}

fn matvec_without_subgroups_parity(dtype: WeightDType) {
    let gpu = own_gpu();
    if !gpu.caps().subgroups {
        eprintln!(
            "this adapter has no subgroups: the fallback already ran in matvec_*_matches_cpu"
        );
    }
    matvec_parity(&gpu.without_subgroups(), dtype);
}

#[test]
fn matvec_f32_without_subgroups_matches_cpu() {
    matvec_without_subgroups_parity(WeightDType::F32);
}

#[test]
fn matvec_f16_without_subgroups_matches_cpu() {
    matvec_without_subgroups_parity(WeightDType::F16);
}

/// Layouts the decode-product tests force besides the chosen one: few lanes with several rows
/// each (shuffle reductions where the subgroup size is fixed), lanes spanning subgroups
/// (workgroup reductions) with two rows, the input staged or streamed against the default,
/// smaller workgroups, several row blocks per workgroup, and a whole row per invocation (what
/// CPU adapters choose). Dense and int8 products take their units in unrolled loop trips where
/// every lane has as many (by default, and two a trip in one layout where that divides), or in
/// the plain strided loop (forced in the last layout); int8 trips load their weights as each
/// starts, or a trip ahead (the layouts of several row blocks and of two units a trip). The
/// last layout takes int8 inputs in two levels, as LM heads do.
const MATVEC_LAYOUTS: [MatVecLayout; 7] = [
    MatVecLayout {
        int8: Some(true),
        ..CHOSEN
    },
    // Block formats keep f32 inputs (dense weights always do; the other layouts turn int8
    // inputs on).
    MatVecLayout {
        int8: Some(false),
        ..CHOSEN
    },
    MatVecLayout {
        lanes: Some(4),
        rows: Some(3),
        stage: Some(true),
        workgroup: Some(64),
        blocks: Some(3),
        int8: Some(true),
        pipeline: Some(true),
        ..CHOSEN
    },
    MatVecLayout {
        lanes: Some(64),
        rows: Some(2),
        stage: Some(false),
        int8: Some(true),
        ..CHOSEN
    },
    MatVecLayout {
        lanes: Some(8),
        rows: Some(4),
        workgroup: Some(128),
        blocks: Some(1),
        int8: Some(true),
        unroll: Some(2),
        pipeline: Some(true),
        ..CHOSEN
    },
    MatVecLayout {
        lanes: Some(1),
        rows: Some(4),
        stage: Some(true),
        workgroup: Some(64),
        int8: Some(true),
        unroll: Some(0),
        ..CHOSEN
    },
    // LM heads' two-level int8 inputs.
    MatVecLayout {
        int8: Some(true),
        int8_fine: Some(true),
        ..CHOSEN
    },
];

/// Every part of the layout left to the engine (`MatVecLayout::default()`, in a constant).
const CHOSEN: MatVecLayout = MatVecLayout {
    lanes: None,
    rows: None,
    stage: None,
    workgroup: None,
    blocks: None,
    int8: None,
    int8_max_cols: None,
    unroll: None,
    pipeline: None,
    int8_fine: None,
    handoff: None,
};

fn matvec_parity(gpu: &Gpu, dtype: WeightDType) {
    let gpu = gpu.clone();
    let mut rng = Rng::new(1);
    // Rows past 16 KiB (k = 4100, 8200, 4999) stream x instead of staging it; 4999 is odd.
    let shapes = [
        (1, 1),
        (7, 13),
        (33, 100),
        (65, 257),
        (130, 1001),
        (5, 4100),
        (3, 8200),
        // Words enough for every lane of the few-lane layouts to take several (the unrolled
        // loop forms).
        (3, 2048),
        // Enough rows that one workgroup computes several row blocks (RB > 1), not a multiple.
        (8203, 37),
    ];
    let variants = [
        Variant::Plain,
        Variant::Bias,
        Variant::Rms,
        Variant::LayerBias,
        Variant::Glu,
        Variant::GeGlu,
        Variant::GeluBias,
        Variant::GeluErfBias,
        Variant::Residual,
    ];
    for (si, &(n, k)) in shapes.iter().enumerate() {
        for (vi, variant) in variants.into_iter().enumerate() {
            // Each shape meets the forced layouts over its variants.
            let layout = MATVEC_LAYOUTS[(si + vi) % MATVEC_LAYOUTS.len()];
            let glu = matches!(variant, Variant::Glu | Variant::GeGlu);
            let rows = if glu { 2 * n } else { n };
            let w = rng.vec(rows * k, 1.0);
            // Three token rows: the kernel must use the last.
            let tokens = 3;
            let x = rng.vec(tokens * k, 2.0);
            let last = &x[(tokens - 1) * k..];
            let bias = rng.vec(rows, 1.0);
            let gain = rng.vec(k, 1.0);
            let shift = rng.vec(k, 0.5);
            let y0 = rng.vec(n, 1.0);
            let eps = 1e-5;
            let wm = Matrix::from_f32(&gpu, "w", &w, rows as u32, k as u32, dtype).expect("w");
            let (xb, yb) = (buf(&gpu, &x), buf(&gpu, &y0));
            let (bb, gb, sb) = (buf(&gpu, &bias), buf(&gpu, &gain), buf(&gpu, &shift));
            let st = step(&gpu, 0, tokens as u32);
            let opts = MatVecOptions {
                norm: match variant {
                    Variant::Rms => Some((NormKind::Rms, &gb, None, eps)),
                    Variant::LayerBias => Some((NormKind::Layer, &gb, Some(&sb), eps)),
                    _ => None,
                },
                bias: matches!(
                    variant,
                    Variant::Bias | Variant::LayerBias | Variant::GeluBias | Variant::GeluErfBias
                )
                .then_some(&bb),
                glu,
                gelu: match variant {
                    Variant::GeluBias | Variant::GeGlu => Some(Gelu::Tanh),
                    Variant::GeluErfBias => Some(Gelu::Erf),
                    _ => None,
                },
                residual: matches!(variant, Variant::Residual),
                layout,
                ..Default::default()
            };
            let op = MatVec::new(&gpu, &wm, &xb, &yb, &st, opts).expect("matvec");
            let mut rec = Recorder::new(&gpu);
            op.encode(&mut rec);
            rec.submit();
            let got = read(&gpu, &yb, n);

            let hw = host_weights(&w, dtype);
            let xin = match variant {
                Variant::Rms => rms_norm(last, &gain, eps),
                Variant::LayerBias => layer_norm(last, &gain, &shift, eps),
                _ => last.to_vec(),
            };
            let (mut want, mag) = matvec_ref(&hw, &xin, rows, k);
            let mut scale = mag[..n].to_vec();
            match variant {
                Variant::Bias | Variant::LayerBias => {
                    want.iter_mut().zip(&bias).for_each(|(v, b)| *v += b)
                }
                Variant::GeluErfBias => want
                    .iter_mut()
                    .zip(&bias)
                    .for_each(|(v, b)| *v = gelu_erf(*v + b)),
                Variant::GeluBias => want
                    .iter_mut()
                    .zip(&bias)
                    .for_each(|(v, b)| *v = gelu_tanh(*v + b)),
                Variant::Residual => want.iter_mut().zip(&y0).for_each(|(v, r)| *v += r),
                Variant::Glu => {
                    let (gate, up) = want.split_at(n);
                    let combined: Vec<f32> =
                        gate.iter().zip(up).map(|(g, u)| silu(*g) * u).collect();
                    // Error of silu(g)·u: |u|·δg + |silu(g)|·δu, δ ∝ Σ|terms|.
                    scale = (0..n)
                        .map(|i| up[i].abs() * mag[i] + silu(gate[i]).abs() * mag[n + i])
                        .collect();
                    want = combined;
                }
                Variant::GeGlu => {
                    let (gate, up) = want.split_at(n);
                    let combined: Vec<f32> = gate
                        .iter()
                        .zip(up)
                        .map(|(g, u)| gelu_tanh(*g) * u)
                        .collect();
                    // gelu's slope is below 1.13.
                    scale = (0..n)
                        .map(|i| {
                            1.13 * up[i].abs() * mag[i] + gelu_tanh(gate[i]).abs() * mag[n + i]
                        })
                        .collect();
                    want = combined;
                }
                _ => {}
            }
            want.truncate(n);
            let what = format!("matvec {dtype:?} {variant:?} n={n} k={k} {layout:?}");
            assert_close(&what, &got, &want, &scale, 1e-5, 2e-5);
        }
    }
}

#[test]
fn reference_erf_is_accurate() {
    // Values from tables of erf.
    for (x, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.5, 0.999_593_047_982_555),
        (3.5, 0.999_999_256_901_628),
        (-1.0, -0.842_700_792_949_714_9),
    ] {
        assert!((erf(x) - want).abs() < 1e-9, "erf({x}) = {}", erf(x));
    }
}

#[test]
fn norms_match_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(3);
    // Both forms on every adapter: a workgroup per row, and a row per invocation (which CPU
    // adapters take), the latter over more rows than one workgroup of 64 holds.
    for lane_rows in [false, true] {
        for kind in [NormKind::Rms, NormKind::Layer] {
            for &(rows, width) in &[(3usize, 1usize), (3, 7), (70, 300), (3, 1001), (5, 1282)] {
                let what = format!("{kind:?} {rows}×{width} (a row per invocation: {lane_rows})");
                check_norm(&gpu, &mut rng, kind, rows, width, lane_rows, &what);
            }
        }
    }
}

fn check_norm(
    gpu: &Gpu,
    rng: &mut Rng,
    kind: NormKind,
    rows: usize,
    width: usize,
    lane_rows: bool,
    what: &str,
) {
    let x: Vec<f32> = rng.vec(rows * width, 3.0).iter().map(|v| v + 0.5).collect();
    let w = rng.vec(width, 1.0);
    let b = rng.vec(width, 1.0);
    let (xb, yb, wb, bb) = (
        buf(gpu, &x),
        gpu.storage("y", (rows * width * 4) as u64).expect("y"),
        buf(gpu, &w),
        buf(gpu, &b),
    );
    let st = step(gpu, 0, rows as u32);
    let eps = 1e-5;
    let run = |form: NormForm| {
        let bias = (kind == NormKind::Layer).then_some(&bb);
        let op = Norm::with_form(gpu, kind, width as u32, eps, &wb, bias, &xb, &yb, &st, form);
        op.map(|op| {
            let mut rec = Recorder::new(gpu);
            op.encode(&mut rec, rows as u32);
            rec.submit();
        })
    };
    let norm = |residual| {
        run(NormForm {
            residual,
            lane_rows: Some(lane_rows),
            half_out: false,
        })
        .expect("norm");
        read(gpu, &yb, rows * width)
    };
    let got = norm(false);
    let mut want = Vec::new();
    for r in 0..rows {
        let row = &x[r * width..(r + 1) * width];
        want.extend(match kind {
            NormKind::Rms => rms_norm(row, &w, eps),
            NormKind::Layer => layer_norm(row, &w, &b, eps),
        });
    }
    let scale: Vec<f32> = want.iter().map(|v| v.abs() + 1.0).collect();
    assert_close(what, &got, &want, &scale, 1e-5, 1e-5);
    if kind == NormKind::Rms {
        // Gemma's post-norms: the normalised row is added into y.
        let got = norm(true);
        let twice: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
        let what = format!("{what}, added");
        assert_close(&what, &got, &twice, &scale, 1e-5, 1e-5);
    }
    // f16 outputs, two to a word, over even widths (odd ones are refused).
    let halves = run(NormForm {
        lane_rows: Some(lane_rows),
        half_out: true,
        ..Default::default()
    });
    if width.is_multiple_of(2) {
        halves.expect("norm with f16 outputs");
        let words: Vec<half::f16> = gpu.read(&yb.buffer, 0, (rows * width) as u64).expect("y");
        let got: Vec<f32> = words.iter().map(|h| h.to_f32()).collect();
        let what = format!("{what}, f16 outputs");
        assert_close(&what, &got, &want, &scale, 1e-5, 1e-3);
    } else {
        assert!(halves.is_err(), "{what}: f16 outputs over an odd width");
    }
}

/// Qwen3's query/key head norms: in place over fused QKV rows, value heads untouched.
#[test]
fn head_norms_match_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(33);
    // Gated: a gate head after each query head (Qwen3.5's query product), left alone.
    for &(heads, kv_heads, hd, tokens, gated) in &[
        (3u32, 1u32, 20u32, 5u32, false),
        (4, 2, 128, 3, false),
        (2, 2, 300, 1, false),
        (3, 1, 20, 5, true),
        (4, 2, 64, 2, true),
    ] {
        let q_step = if gated { 2 } else { 1 };
        let slots = (heads * q_step + 2 * kv_heads) as usize;
        let (hdu, t) = (hd as usize, tokens as usize);
        let qkv = rng.vec(t * slots * hdu, 2.0);
        let (qw, kw) = (rng.vec(hdu, 1.0), rng.vec(hdu, 1.0));
        let (qkv_b, qw_b, kw_b) = (buf(&gpu, &qkv), buf(&gpu, &qw), buf(&gpu, &kw));
        let st = step(&gpu, 0, tokens);
        let op = HeadNorm::new(
            &gpu, heads, kv_heads, hd, gated, 1e-6, &qw_b, &kw_b, &qkv_b, &st,
        )
        .expect("head norm");
        let mut rec = Recorder::new(&gpu);
        op.encode(&mut rec, tokens);
        rec.submit();
        let got = read(&gpu, &qkv_b, qkv.len());
        let mut want = qkv.clone();
        let q_slots = (heads * q_step) as usize;
        for row in want.chunks_mut(hdu).enumerate().filter_map(|(i, r)| {
            let slot = i % slots;
            let is_q = slot < q_slots && slot.is_multiple_of(q_step as usize);
            let is_k = slot >= q_slots && slot < q_slots + kv_heads as usize;
            (is_q || is_k).then_some((is_q, r))
        }) {
            let (is_q, r) = row;
            let w = if is_q { &qw } else { &kw };
            let normed = rms_norm(r, w, 1e-6);
            r.copy_from_slice(&normed);
        }
        let scale = vec![1.0; want.len()];
        assert_close(
            &format!("head norm heads={heads} kv={kv_heads} hd={hd} gated={gated}"),
            &got,
            &want,
            &scale,
            1e-5,
            1e-5,
        );
    }
}

/// Qwen3.5's attention output gate: each value times sigmoid of its gate, the gate head
/// following its query head in the QKV rows, over awkward widths and several tokens.
#[test]
fn output_gate_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(71);
    for &(heads, kv_heads, hd, tokens) in &[(3u32, 1u32, 20u32, 5u32), (2, 2, 7, 1), (5, 1, 33, 3)]
    {
        let row_slots = (2 * heads + 2 * kv_heads) as usize;
        let (h, hdu, t) = (heads as usize, hd as usize, tokens as usize);
        let qkv = rng.vec(t * row_slots * hdu, 4.0);
        let attn = rng.vec(t * h * hdu, 2.0);
        let (qkv_b, attn_b) = (buf(&gpu, &qkv), buf(&gpu, &attn));
        let st = step(&gpu, 0, tokens);
        let op = OutputGate::new(&gpu, heads, kv_heads, hd, &qkv_b, &attn_b, &st).expect("gate");
        let mut rec = Recorder::new(&gpu);
        op.encode(&mut rec, tokens);
        rec.submit();
        let got = read(&gpu, &attn_b, attn.len());
        let want: Vec<f32> = (0..attn.len())
            .map(|i| {
                let (tok, head, d) = (i / (h * hdu), (i / hdu) % h, i % hdu);
                let gate = qkv[(tok * row_slots + 2 * head + 1) * hdu + d];
                attn[i] / (1.0 + (-gate).exp())
            })
            .collect();
        let scale = vec![1.0; want.len()];
        assert_close(
            &format!("output gate heads={heads} kv={kv_heads} hd={hd} tokens={tokens}"),
            &got,
            &want,
            &scale,
            1e-6,
            1e-6,
        );
    }
    // One gate per row (Qwen3.5-MoE's shared expert).
    let (width, tokens) = (37u32, 6u32);
    let gates = rng.vec(tokens as usize, 4.0);
    let values = rng.vec((width * tokens) as usize, 2.0);
    let (gates_b, values_b) = (buf(&gpu, &gates), buf(&gpu, &values));
    let st = step(&gpu, 0, tokens);
    let op = OutputGate::rows(&gpu, width, &gates_b, &values_b, &st).expect("row gate");
    let mut rec = Recorder::new(&gpu);
    op.encode(&mut rec, tokens);
    rec.submit();
    let got = read(&gpu, &values_b, values.len());
    let want: Vec<f32> = (0..values.len())
        .map(|i| values[i] / (1.0 + (-gates[i / width as usize]).exp()))
        .collect();
    let scale = vec![1.0; want.len()];
    assert_close("row gates", &got, &want, &scale, 1e-6, 1e-6);
}

#[test]
fn embedding_gather_matches_cpu_and_marks_seen() {
    let gpu = gpu();
    let mut rng = Rng::new(6);
    let (vocab, dim) = (53u32, 13u32);
    for dtype in DTYPES {
        for with_positions in [false, true] {
            // Gemma's √hidden scale where there are no learned positions.
            let scale = if with_positions { 1.0 } else { 3.25 };
            let table = rng.vec((vocab * dim) as usize, 1.0);
            let positions = rng.vec((20 * dim) as usize, 1.0);
            let tm = Matrix::from_f32(&gpu, "table", &table, vocab, dim, dtype).expect("table");
            let history: Vec<u32> = (0..20).map(|_| rng.below(vocab)).collect();
            let (pos0, tokens) = (4u32, 9u32);
            let hb = gpu.storage_from("history", &history).expect("history");
            let pb = buf(&gpu, &positions);
            let seen = gpu
                .storage("seen", u64::from(vocab.div_ceil(32)) * 4)
                .expect("seen");
            let x = gpu.storage("x", u64::from(tokens * dim) * 4).expect("x");
            let st = step(&gpu, pos0, tokens);
            let op = Embed::new(
                &gpu,
                &tm,
                with_positions.then_some(&pb),
                &hb,
                &seen,
                &x,
                &st,
                scale,
            )
            .expect("embed");
            let mut rec = Recorder::new(&gpu);
            op.encode(&mut rec, tokens);
            rec.submit();
            let got = read(&gpu, &x, (tokens * dim) as usize);
            let hw = host_weights(&table, dtype);
            let mut want = Vec::new();
            let mut bits = vec![0u32; vocab.div_ceil(32) as usize];
            for t in 0..tokens as usize {
                let id = history[pos0 as usize + t] as usize;
                bits[id / 32] |= 1 << (id % 32);
                for d in 0..dim as usize {
                    let mut v = hw[id * dim as usize + d];
                    if with_positions {
                        v += positions[(pos0 as usize + t) * dim as usize + d];
                    }
                    want.push(v * scale);
                }
            }
            let ones = vec![1.0; want.len()];
            assert_close(&format!("embed {dtype:?}"), &got, &want, &ones, 1e-6, 0.0);
            let got_bits: Vec<u32> = gpu.read(&seen.buffer, 0, bits.len() as u64).expect("bits");
            assert_eq!(got_bits, bits, "seen bits");
        }
    }
}

#[test]
fn glu_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(7);
    // An odd width (one value per invocation) and a multiple of four (vec4 views).
    for (tokens, width) in [(3u32, 37u32), (5, 44)] {
        let gu = rng.vec((tokens * 2 * width) as usize, 4.0);
        let (gub, h) = (
            buf(&gpu, &gu),
            gpu.storage("h", u64::from(tokens * width) * 4).expect("h"),
        );
        let st = step(&gpu, 0, tokens);
        let w = width as usize;
        let pairs = || (0..tokens as usize).flat_map(move |t| (0..w).map(move |i| (t, i)));
        let run = |op: Glu| {
            let mut rec = Recorder::new(&gpu);
            op.encode(&mut rec, tokens);
            rec.submit();
            read(&gpu, &h, (tokens * width) as usize)
        };
        let got = run(Glu::new(&gpu, GluKind::Silu, width, &gub, &h, &st).expect("glu"));
        let want: Vec<f32> = pairs()
            .map(|(t, i)| silu(gu[t * 2 * w + i]) * gu[t * 2 * w + w + i])
            .collect();
        let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
        assert_close(&format!("glu {width}"), &got, &want, &scale, 1e-6, 1e-5);
        // Gemma's GeGLU: the gate block first, tanh GELU.
        let got = run(Glu::new(&gpu, GluKind::GeluTanh, width, &gub, &h, &st).expect("geglu"));
        let want: Vec<f32> = pairs()
            .map(|(t, i)| gelu_tanh(gu[t * 2 * w + i]) * gu[t * 2 * w + w + i])
            .collect();
        let scale: Vec<f32> = want.iter().map(|v| v.abs() + 1e-3).collect();
        assert_close(&format!("geglu {width}"), &got, &want, &scale, 1e-5, 1e-5);
    }
}

/// A recorder submitting in parts holds the device's submission lock from its first part to
/// its last, so another thread's submission (here a read-back) cannot land between the parts
/// and clobber scratch the parts share (the CPU adapters' attention scratch, for one).
#[test]
fn parts_keep_other_submissions_out() {
    let gpu = gpu();
    let gate_up = buf(&gpu, &[1.0; 8]);
    let h = buf(&gpu, &[0.0; 4]);
    let st = step(&gpu, 0, 1);
    let glu = Glu::new(&gpu, GluKind::Silu, 4, &gate_up, &h, &st).expect("glu");
    let read_back = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let mut rec = Recorder::in_parts(&gpu);
        // Past the first part, which is submitted.
        for _ in 0..40 {
            glu.encode(&mut rec, 1);
        }
        scope.spawn(|| {
            gpu.read::<f32>(&h.buffer, 0, 4).expect("read");
            read_back.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            !read_back.load(std::sync::atomic::Ordering::SeqCst),
            "another thread's submission landed between the parts"
        );
        rec.submit();
    });
    assert!(read_back.load(std::sync::atomic::Ordering::SeqCst));
}

#[test]
fn fill_matches_its_host_formula() {
    let gpu = gpu();
    for dtype in DTYPES {
        let elems = 1001u32;
        let b = gpu
            .storage("fill", u64::from(elems) * dtype.bytes())
            .expect("buffer");
        fill_random(&gpu, &b, dtype, 42, 0.5, false).expect("fill");
        let got: Vec<f32> = match dtype {
            WeightDType::F32 => read(&gpu, &b, elems as usize),
            WeightDType::F16 => {
                let halves: Vec<u16> = gpu.read(&b.buffer, 0, u64::from(elems)).expect("read");
                halves
                    .iter()
                    .take(elems as usize)
                    .map(|h| half::f16::from_bits(*h).to_f32())
                    .collect()
            }
        };
        let want: Vec<f32> = (0..elems).map(|i| fill_value(42, i, 0.5)).collect();
        let want = match dtype {
            WeightDType::F32 => want,
            WeightDType::F16 => round_f16(&want),
        };
        assert_eq!(got, want, "fill {dtype:?}");
        assert!(got.iter().all(|v| v.abs() <= 0.5));
    }
}

/// Random GGML blocks of `ty` for a `[rows][cols]` matrix: random payload bytes, scale fields
/// set to finite f16 values of either sign so every weight is finite.
fn random_blocks(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    let mut out = Vec::with_capacity(rows * cols / be * bb);
    for _ in 0..rows * cols / be {
        let mut block: Vec<u8> = (0..bb).map(|_| rng.below(256) as u8).collect();
        let mut put = |at: usize, v: f32| {
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        };
        let scale = |rng: &mut Rng| rng.uniform() * 0.05;
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => put(0, scale(rng)),
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => {
                put(0, scale(rng));
                put(2, scale(rng));
            }
            GgmlType::Q6K => put(208, scale(rng)),
            // e8m0 exponents around 2^-6: weights up to 6/64.
            GgmlType::Mxfp4 => block[0] = 118 + rng.below(6) as u8,
            _ => {}
        }
        out.extend(block);
    }
    out
}

const QUANT_TYPES: [GgmlType; 9] = [
    GgmlType::Mxfp4,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Fused dequantize + product (decode) for every block format, plain, with a fused RMSNorm,
/// and as the gate/up pair of SwiGLU, against the CPU dequantizer and an f32 product. A test
/// and a device per format, so that the test threads share the work of compiling its many
/// shader variants (most of this binary's time on a software adapter with an empty shader
/// cache). The flag says whether the format has an integer form: then most layouts take int8
/// inputs, otherwise none may.
macro_rules! quantized_matvec_tests {
    ($($name:ident: $ty:expr, $int8:expr;)*) => {$(
        #[test]
        fn $name() {
            let int8_runs = quantized_matvec_parity($ty);
            if $int8 {
                assert!(int8_runs >= 4, "int8 products ran {int8_runs} times");
            } else {
                assert_eq!(int8_runs, 0, "a format without an integer form took int8 inputs");
            }
        }
    )*};
}

quantized_matvec_tests! {
    quantized_matvec_q8_0_matches_cpu_dequantize: GgmlType::Q8_0, true;
    quantized_matvec_q4_0_matches_cpu_dequantize: GgmlType::Q4_0, true;
    quantized_matvec_q4_1_matches_cpu_dequantize: GgmlType::Q4_1, true;
    quantized_matvec_q5_0_matches_cpu_dequantize: GgmlType::Q5_0, false;
    quantized_matvec_q5_1_matches_cpu_dequantize: GgmlType::Q5_1, false;
    quantized_matvec_q4k_matches_cpu_dequantize: GgmlType::Q4K, true;
    quantized_matvec_q5k_matches_cpu_dequantize: GgmlType::Q5K, true;
    quantized_matvec_q6k_matches_cpu_dequantize: GgmlType::Q6K, true;
    quantized_matvec_mxfp4_matches_cpu_dequantize: GgmlType::Mxfp4, true;
}

/// Every shape, layout and fused variant for one block format; returns how many products took
/// int8 inputs.
fn quantized_matvec_parity(ty: GgmlType) -> usize {
    let gpu = own_gpu();
    let mut rng = Rng::new(21 + ty as u64);
    let mut int8_runs = 0;
    // Rows not a multiple of the rows per workgroup; 4864 columns stream x instead of staging;
    // 33,001 rows are enough for the few-lanes-per-row shuffle reduction (SGX) on adapters
    // with a fixed subgroup size, lavapipe included.
    for &(n, k) in &[
        (37usize, 256usize),
        (5, 768),
        // Enough sub-blocks for every lane of the few-lane layouts to take two or more (the
        // unrolled loop forms).
        (5, 1024),
        // K-quant pairs for several trips of the few-lane layouts in one row block.
        (3, 2048),
        (9, 4864),
        (33_001, 256),
        (49_153, 576),
    ] {
        // 576 (SmolLM2-135M's width, a tied LM head's rows) is no whole number of K blocks.
        if k % ty.block_elems() != 0 {
            continue;
        }
        // The small shapes run every forced layout (K-quant pairs need at most k / 64 lanes).
        let layouts = if n * k < 10_000 {
            &MATVEC_LAYOUTS[..]
        } else {
            &MATVEC_LAYOUTS[..1]
        };
        for (variant, &layout) in [Variant::Plain, Variant::Rms, Variant::Glu]
            .into_iter()
            .flat_map(|v| layouts.iter().map(move |l| (v, l)))
        {
            if n > 1000 && !matches!(variant, Variant::Rms) {
                continue;
            }
            let glu = matches!(variant, Variant::Glu);
            let rows = if glu { 2 * n } else { n };
            let blocks = random_blocks(&mut rng, ty, rows, k);
            let mut w = vec![0.0f32; rows * k];
            dequantize(ty, &blocks, &mut w);
            // One to three token rows: the kernel must take the last.
            let tokens = 1 + n % 3;
            let x_rows = rng.vec(tokens * k, 2.0);
            let x = x_rows[(tokens - 1) * k..].to_vec();
            let gain = rng.vec(k, 1.0);
            let wm = Matrix::from_blocks(&gpu, "w", ty, &blocks, rows as u32, k as u32).expect("w");
            let (xb, yb, gb) = (
                buf(&gpu, &x_rows),
                gpu.storage("y", n as u64 * 4).expect("y"),
                buf(&gpu, &gain),
            );
            let st = step(&gpu, 0, tokens as u32);
            let op = MatVec::new(
                &gpu,
                &wm,
                &xb,
                &yb,
                &st,
                MatVecOptions {
                    norm: matches!(variant, Variant::Rms).then_some((
                        NormKind::Rms,
                        &gb,
                        None,
                        1e-5,
                    )),
                    glu,
                    layout,
                    ..Default::default()
                },
            )
            .expect("matvec");
            let mut rec = Recorder::new(&gpu);
            op.encode(&mut rec);
            rec.submit();
            let got = read(&gpu, &yb, n);
            let xin = if matches!(variant, Variant::Rms) {
                rms_norm(&x, &gain, 1e-5)
            } else {
                x.clone()
            };
            int8_runs += usize::from(op.takes_int8());
            let (all, mag) = match op.int8_levels() {
                0 => matvec_ref(&w, &xin, rows, k),
                1 => matvec_ref_int8(&w, &xin, rows, k),
                _ => matvec_ref_int8_fine(&w, &xin, rows, k),
            };
            let (want, scale): (Vec<f32>, Vec<f32>) = if glu {
                (0..n)
                    .map(|i| {
                        let (g, u) = (all[i], all[n + i]);
                        (silu(g) * u, u.abs() * mag[i] + silu(g).abs() * mag[n + i])
                    })
                    .unzip()
            } else {
                (all, mag)
            };
            assert_close(
                &format!("quantized matvec {ty:?} {variant:?} n={n} k={k} {layout:?}"),
                &got,
                &want,
                &scale,
                1e-5,
                2e-5,
            );
        }
    }
    int8_runs
}

/// A product hands its output row to the next as int8 blocks (shaders/matvec_handoff.wgsl):
/// the next product's output equals what it computes staging the f32 row itself, within one
/// rounding step of each input (16-row writer blocks rounded again to their 32-value block's
/// scale), for writers whose workgroups take 16 rows, 32, several blocks, or several row blocks
/// (dense and block weights, residual and gated), readers with and without a fused RMSNorm,
/// and a second round. Writers whose workgroups cannot take whole blocks do not hand off.
#[test]
fn int8_handoff_matches_staging_the_row() {
    let gpu = own_gpu();
    let mut rng = Rng::new(91);
    // Writer rows per workgroup: 16 with 256 invocations (where the adapter's layout leaves
    // the workgroup size free), 128 (four blocks), 32 in four row blocks, the engine's choice,
    // one row (no handoff), and 16 with 64 invocations.
    let writer_layouts = [
        MatVecLayout {
            lanes: Some(32),
            rows: Some(2),
            blocks: Some(1),
            ..CHOSEN
        },
        MatVecLayout {
            lanes: Some(4),
            rows: Some(2),
            workgroup: Some(256),
            blocks: Some(1),
            ..CHOSEN
        },
        MatVecLayout {
            lanes: Some(16),
            rows: Some(1),
            workgroup: Some(128),
            blocks: Some(4),
            ..CHOSEN
        },
        CHOSEN,
        MatVecLayout {
            lanes: Some(64),
            rows: Some(1),
            workgroup: Some(64),
            blocks: Some(1),
            ..CHOSEN
        },
        MatVecLayout {
            lanes: Some(4),
            rows: Some(1),
            workgroup: Some(64),
            blocks: Some(1),
            ..CHOSEN
        },
    ];
    let mut handed_off = 0;
    // (reader's format, handed-off row, writer's input, reader's outputs, writer's weights)
    let cases = [
        (GgmlType::Q8_0, 96, 64, 37, None),
        (GgmlType::Q4K, 512, 256, 19, Some(GgmlType::Q6K)),
        (GgmlType::Q4_0, 224, 100, 5, None),
        (GgmlType::Q6K, 256, 512, 9, Some(GgmlType::Q4K)),
    ];
    for (ci, &(reader_ty, len, k_in, n_out, writer_ty)) in cases.iter().enumerate() {
        let handoff = Int8Handoff::new(&gpu, len as u32).expect("handoff");
        let reader_blocks = random_blocks(&mut rng, reader_ty, n_out, len);
        let mut reader_w_host = vec![0.0f32; n_out * len];
        dequantize(reader_ty, &reader_blocks, &mut reader_w_host);
        let reader_w = Matrix::from_blocks(
            &gpu,
            "reader",
            reader_ty,
            &reader_blocks,
            n_out as u32,
            len as u32,
        )
        .expect("reader");
        for (li, &layout) in writer_layouts.iter().enumerate() {
            let normed = (ci + li) % 2 == 0;
            let glu = li == 1 && writer_ty.is_none();
            let rows = if glu { 2 * len } else { len };
            let writer_w = match writer_ty {
                Some(ty) => {
                    let blocks = random_blocks(&mut rng, ty, rows, k_in);
                    Matrix::from_blocks(&gpu, "writer", ty, &blocks, rows as u32, k_in as u32)
                }
                None => Matrix::from_f32(
                    &gpu,
                    "writer",
                    &rng.vec(rows * k_in, 1.0),
                    rows as u32,
                    k_in as u32,
                    WeightDType::F16,
                ),
            }
            .expect("writer");
            let gain_host = rng.vec(len, 1.0);
            let gain = buf(&gpu, &gain_host);
            let x = buf(&gpu, &rng.vec(k_in, 2.0));
            let row = buf(&gpu, &rng.vec(len, 1.0));
            let (via_handoff, staged) = (
                gpu.storage("via handoff", n_out as u64 * 4).expect("y"),
                gpu.storage("staged", n_out as u64 * 4).expect("y"),
            );
            let st = step(&gpu, 0, 1);
            let writer = MatVec::new(
                &gpu,
                &writer_w,
                &x,
                &row,
                &st,
                MatVecOptions {
                    residual: !glu,
                    glu,
                    layout,
                    handoff_out: Some((&handoff, normed.then_some(&gain))),
                    ..Default::default()
                },
            )
            .expect("writer");
            let reader = |y: &StorageBuffer, handoff_in| {
                MatVec::new(
                    &gpu,
                    &reader_w,
                    &row,
                    y,
                    &st,
                    MatVecOptions {
                        norm: normed.then_some((NormKind::Rms, &gain, None, 1e-5)),
                        handoff_in,
                        // Every other case loads its weights before staging the row, as QKV
                        // products do.
                        layout: MatVecLayout {
                            pipeline: Some(li % 2 == 0),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                )
                .expect("reader")
            };
            if li == 4 {
                assert!(!writer.hands_off(), "one row per workgroup handed off");
                continue;
            }
            if !writer.hands_off() {
                continue;
            }
            handed_off += 1;
            let (reads_handoff, stages) =
                (reader(&via_handoff, Some(&handoff)), reader(&staged, None));
            assert!(reads_handoff.reads_handoff() && !stages.reads_handoff());
            for round in 0..2 {
                if round == 1 {
                    gpu.queue().write_buffer(
                        &x.buffer,
                        0,
                        bytemuck::cast_slice(&rng.vec(k_in, 2.0)),
                    );
                }
                let mut rec = Recorder::new(&gpu);
                writer.encode(&mut rec);
                reads_handoff.encode(&mut rec);
                stages.encode(&mut rec);
                rec.submit();
                let want = read(&gpu, &staged, n_out);
                let steps = one_step_each(
                    &reader_w_host,
                    &read(&gpu, &row, len),
                    normed.then_some(&gain_host),
                );
                let scale: Vec<f32> = want.iter().map(|v| v.abs() + 1.0).collect();
                let got = read(&gpu, &via_handoff, n_out);
                for (i, ((g, w), step)) in got.iter().zip(&want).zip(&steps).enumerate() {
                    let allowed = step + 1e-4 * scale[i];
                    assert!(
                        (g - w).abs() <= allowed,
                        "handoff {reader_ty:?} len={len} writer {writer_ty:?} glu={glu} normed={normed} round {round} {layout:?}: output {i} is {g}, staged {w} (allowed {allowed})"
                    );
                }
            }
        }
    }
    assert!(handed_off >= 16, "{handed_off} writers handed off");
}

/// Per output of `w` (`[n][k]`), what moving every input by one int8 step of its 32-value
/// block moves it by: the input `x` (times `gain`, then RMS-normalised, where given).
fn one_step_each(w: &[f32], x: &[f32], gain: Option<&Vec<f32>>) -> Vec<f32> {
    let k = x.len();
    let scaled: Vec<f32> = match gain {
        Some(g) => x.iter().zip(g).map(|(v, g)| v * g).collect(),
        None => x.to_vec(),
    };
    let rms = match gain {
        Some(_) => 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / k as f32 + 1e-5).sqrt(),
        None => 1.0,
    };
    let step: Vec<f32> = scaled
        .chunks(32)
        .flat_map(|b| {
            let d = b.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            std::iter::repeat_n(d * rms, b.len())
        })
        .collect();
    w.chunks(k)
        .map(|row| row.iter().zip(&step).map(|(w, s)| w.abs() * s).sum())
        .collect()
}

/// Quantized weights in the prompt product: tiles dequantized into workgroup memory.
#[test]
fn quantized_matmul_matches_cpu_dequantize() {
    for gpu in product_gpus() {
        quantized_matmul_parity(&gpu);
    }
}

fn quantized_matmul_parity(gpu: &Gpu) {
    let gpu = gpu.clone();
    let mut rng = Rng::new(22);
    for ty in QUANT_TYPES {
        for &(m, n, k) in &[
            (3usize, 37usize, 256usize),
            (70, 5, 1024),
            (67, 130, 512),
            (40, 1024, 256),
        ] {
            let blocks = random_blocks(&mut rng, ty, n, k);
            let mut w = vec![0.0f32; n * k];
            dequantize(ty, &blocks, &mut w);
            let x = rng.vec(m * k, 1.0);
            let wm = Matrix::from_blocks(&gpu, "w", ty, &blocks, n as u32, k as u32).expect("w");
            let (xb, yb) = (
                buf(&gpu, &x),
                gpu.storage("y", (m * n) as u64 * 4).expect("y"),
            );
            let scratch = gpu
                .storage(
                    "scratch",
                    MatMul::scratch_bytes(n as u32, k as u32, m as u32),
                )
                .expect("scratch");
            let st = step(&gpu, 0, m as u32);
            // A CPU adapter's own tiles and the GPUs' 64-wide ones, each forced there.
            // On tensor cores, every tile layout the adapter can take.
            let tile_modes: Vec<(Option<bool>, Option<CoopTile>)> = if gpu.is_software() {
                vec![(Some(true), None), (Some(false), None)]
            } else {
                coop_tiles(&gpu).into_iter().map(|t| (None, t)).collect()
            };
            // The reference, once per rounding of the inputs.
            let mut products: [Option<(Vec<f32>, Vec<f32>)>; 2] = [None, None];
            for &(cpu_tiles, coop_tile) in &tile_modes {
                let op = MatMul::new(
                    &gpu,
                    &wm,
                    &xb,
                    &yb,
                    &st,
                    MatMulOptions {
                        split_scratch: Some((&scratch, m as u32)),
                        cpu_tiles,
                        coop_tile,
                        ..Default::default()
                    },
                )
                .expect("matmul");
                let mut rec = Recorder::new(&gpu);
                rec.clear(&yb.buffer);
                op.encode(&mut rec, m as u32);
                rec.submit();
                let got = read(&gpu, &yb, m * n);
                let tc = op.uses_tensor_cores();
                let (want, scale) = products[usize::from(tc)].get_or_insert_with(|| {
                    product_ref(&product_input(tc, &w), &product_input(tc, &x), m, n, k)
                });
                assert_close(
                    &format!(
                        "quantized matmul {ty:?} m={m} n={n} k={k} tensor_cores={tc} cpu_tiles={cpu_tiles:?} coop_tile={coop_tile:?}"
                    ),
                    &got,
                    want,
                    scale,
                    1e-5,
                    2e-5,
                );
            }
        }
    }
}

#[test]
fn sum_reduce_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(31);
    // Lengths that are not multiples of the workgroup or of the four-load unroll.
    for &(len, groups) in &[(4usize, 1u32), (1028, 3), (40_004, 7), (262_148, 64)] {
        let x = rng.vec(len, 1.0);
        let xb = buf(&gpu, &x);
        let partials = gpu
            .storage("partials", u64::from(groups) * 4)
            .expect("partials");
        let op = SumReduce::new(&gpu, &xb, &partials, groups).expect("reduce");
        let mut rec = Recorder::new(&gpu);
        op.encode(&mut rec);
        rec.submit();
        let got: f32 = read(&gpu, &partials, groups as usize).iter().sum();
        let want: f64 = x.iter().map(|v| f64::from(*v)).sum();
        let scale: f64 = x.iter().map(|v| f64::from(v.abs())).sum();
        assert!(
            (f64::from(got) - want).abs() <= 1e-5 * scale,
            "len {len}: {got} vs {want}"
        );
    }
}

/// Expansion of block-quantized matrices to dense f16 for prompt products.
#[test]
fn dequantize_to_f16_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(41);
    // One partial workgroup, and several with a partial last one.
    for (ty, (rows, cols)) in QUANT_TYPES
        .into_iter()
        .flat_map(|ty| [(ty, (7usize, 512usize)), (ty, (67, 1024))])
    {
        let blocks = random_blocks(&mut rng, ty, rows, cols);
        let mut want = vec![0.0f32; rows * cols];
        dequantize(ty, &blocks, &mut want);
        let wm = Matrix::from_blocks(&gpu, "w", ty, &blocks, rows as u32, cols as u32).expect("w");
        let scratch = gpu
            .storage("scratch", Dequantize::scratch_bytes(&wm))
            .expect("scratch");
        let (op, view) = Dequantize::new(&gpu, &wm, &scratch).expect("dequantize");
        assert_eq!((view.rows, view.cols), (rows as u32, cols as u32));
        let mut rec = Recorder::new(&gpu);
        op.encode(&mut rec);
        rec.submit();
        let halves: Vec<u16> = gpu
            .read(&scratch.buffer, 0, (rows * cols) as u64)
            .expect("read");
        let got: Vec<f32> = halves
            .iter()
            .map(|h| half::f16::from_bits(*h).to_f32())
            .collect();
        let want = round_f16(&want);
        let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
        // f16 rounding of values the GPU may compute with another f32 operation order.
        assert_close(
            &format!("dequantize {ty:?}"),
            &got,
            &want,
            &scale,
            1e-7,
            1e-3,
        );
    }
}

/// Embedding rows gathered from a block-quantized table (GGUF embeddings stay quantized).
#[test]
fn quantized_embedding_gather_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(51);
    for ty in QUANT_TYPES {
        let (vocab, dim) = (37u32, 512u32);
        let blocks = random_blocks(&mut rng, ty, vocab as usize, dim as usize);
        let mut table = vec![0.0f32; (vocab * dim) as usize];
        dequantize(ty, &blocks, &mut table);
        let tm = Matrix::from_blocks(&gpu, "table", ty, &blocks, vocab, dim).expect("table");
        let history: Vec<u32> = (0..12).map(|_| rng.below(vocab)).collect();
        let (pos0, tokens) = (2u32, 9u32);
        let hb = gpu.storage_from("history", &history).expect("history");
        let seen = gpu
            .storage("seen", u64::from(vocab.div_ceil(32)) * 4)
            .expect("seen");
        let x = gpu.storage("x", u64::from(tokens * dim) * 4).expect("x");
        let st = step(&gpu, pos0, tokens);
        // Gemma scales embeddings by √hidden.
        let scale = 5.5;
        let op = Embed::new(&gpu, &tm, None, &hb, &seen, &x, &st, scale).expect("embed");
        let mut rec = Recorder::new(&gpu);
        op.encode(&mut rec, tokens);
        rec.submit();
        let got = read(&gpu, &x, (tokens * dim) as usize);
        let want: Vec<f32> = (0..tokens as usize)
            .flat_map(|t| {
                let id = history[pos0 as usize + t] as usize;
                table[id * dim as usize..(id + 1) * dim as usize]
                    .iter()
                    .map(|v| v * scale)
                    .collect::<Vec<_>>()
            })
            .collect();
        let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
        assert_close(
            &format!("quantized embedding {ty:?}"),
            &got,
            &want,
            &scale,
            1e-7,
            1e-6,
        );
    }
}
