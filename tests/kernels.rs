//! Every WGSL kernel against a plain CPU reference on random inputs of awkward sizes (odd
//! lengths, not multiples of any workgroup size), with f32 and f16 storage.
//!
//! Tolerances: both sides accumulate in f32 from identical inputs (f16 weights are rounded on
//! the host before the reference runs), so the only difference is summation order, bounded by
//! about k·2⁻²⁴·Σ|wᵢxᵢ|; we allow 2·10⁻⁵·Σ|wᵢxᵢ| (k ≤ 4100 makes the worst case 2.4·10⁻⁴ but
//! random-sign terms give √k behaviour) plus 10⁻⁵ absolute. f16 caches round values written
//! by the kernel, so those tests compare against a reference that rounds the same values.

mod common;

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
fn matmul_matches_cpu() {
    for gpu in product_gpus() {
        matmul_parity(&gpu);
    }
}

fn matmul_parity(gpu: &Gpu) {
    let gpu = gpu.clone();
    let mut rng = Rng::new(2);
    // Those with few output tiles and long rows (k ≥ 700 here) are split along k: partial sums
    // go through scratch and a reduce pass that applies the epilogue.
    let shapes = [
        (1, 1, 1),
        (3, 5, 7),
        (65, 67, 130),
        (130, 33, 257),
        (7, 200, 24),
        (70, 40, 1100),
        (5, 130, 700),
        (66, 3, 4099),
        // 128-wide tensor-core tiles (n ≥ 512 in whole 128s, or ≥ 1024), one split along k.
        (67, 1024, 300),
        (5, 640, 1100),
    ];
    // A CPU adapter runs its own tiles (matmul_cpu.wgsl, forced here: it keeps the SIMT tiles
    // for products this small), and the GPUs' SIMT tiles: the 128-wide ones it falls back to
    // for products at least 128 wide, and the 64-wide ones (what GPUs without tensor cores
    // run). The SIMT tiles there take the three epilogue kinds (plain, bias with GELU,
    // residual): every variant runs on GPUs, and lavapipe is slow.
    let mut fewer_slices = 0;
    // A GPU with tensor cores runs every tile layout it can take.
    let tile_choices: Vec<(Option<bool>, Option<bool>, Option<CoopTile>)> = if gpu.is_software() {
        vec![
            (None, Some(true), None),
            (None, Some(false), None),
            (Some(false), Some(false), None),
        ]
    } else {
        coop_tiles(&gpu)
            .into_iter()
            .map(|t| (None, None, t))
            .collect()
    };
    // The reference product depends only on the shape, the inputs and whether tensor cores
    // round them to f16, so each is computed once for every tile layout and epilogue.
    for dtype in DTYPES {
        for &(m, n, k) in &shapes {
            let w = rng.vec(n * k, 1.0);
            let x = rng.vec(m * k, 1.0);
            let bias = rng.vec(n, 1.0);
            let y0 = rng.vec(m * n, 1.0);
            let wm = Matrix::from_f32(&gpu, "w", &w, n as u32, k as u32, dtype).expect("w");
            let xb = buf(&gpu, &x);
            let bb = buf(&gpu, &bias);
            let hw = host_weights(&w, dtype);
            let mut products: [Option<(Vec<f32>, Vec<f32>)>; 2] = [None, None];
            for &(big_tiles, cpu_tiles, coop_tile) in &tile_choices {
                let every_epilogue = (big_tiles, cpu_tiles, coop_tile) == tile_choices[0];
                // A split product's dispatch takes fewer k slices the more output tiles it
                // has, and the reduce pass must find the same count: the f16 runs aim for 4
                // workgroups, which gives these small products counts between one and the
                // most.
                let split_target = (dtype == WeightDType::F16).then_some(4);
                for (bias_on, gelu, residual) in [
                    (false, None, false),
                    (true, None, false),
                    (true, Some(Gelu::Tanh), false),
                    (true, Some(Gelu::Erf), false),
                    (false, None, true),
                ]
                .into_iter()
                .filter(|&(bias, gelu, _)| {
                    every_epilogue || bias == matches!(gelu, Some(Gelu::Tanh))
                }) {
                    let yb = buf(&gpu, &y0);
                    let scratch_bytes = MatMul::scratch_bytes(n as u32, k as u32, m as u32);
                    let scratch = gpu.storage("scratch", scratch_bytes).expect("scratch");
                    let st = step(&gpu, 0, m as u32);
                    let op = MatMul::new(
                        &gpu,
                        &wm,
                        &xb,
                        &yb,
                        &st,
                        MatMulOptions {
                            bias: bias_on.then_some(&bb),
                            gelu,
                            residual,
                            split_scratch: Some((&scratch, m as u32)),
                            big_tiles,
                            cpu_tiles,
                            split_target,
                            coop_tile,
                            ..Default::default()
                        },
                    )
                    .expect("matmul");
                    let slices = op.slices_for(m as u32);
                    fewer_slices +=
                        usize::from(slices > 1 && slices < k_slices(n as u32, k as u32));
                    let mut rec = Recorder::new(&gpu);
                    op.encode(&mut rec, m as u32);
                    rec.submit();
                    let got = read(&gpu, &yb, m * n);
                    let tc = op.uses_tensor_cores();
                    let (product, mag) = products[usize::from(tc)].get_or_insert_with(|| {
                        product_ref(&product_input(tc, &hw), &product_input(tc, &x), m, n, k)
                    });
                    let want: Vec<f32> = (0..m * n)
                        .map(|i| {
                            let mut r = product[i] + if bias_on { bias[i % n] } else { 0.0 };
                            match gelu {
                                Some(Gelu::Tanh) => r = gelu_tanh(r),
                                Some(Gelu::Erf) => r = gelu_erf(r),
                                Some(Gelu::Quick) => r /= 1.0 + (-1.702 * r).exp(),
                                None => {}
                            }
                            if residual { r + y0[i] } else { r }
                        })
                        .collect();
                    let what = format!(
                        "matmul {dtype:?} m={m} n={n} k={k} slices={slices} of {} bias={bias_on} gelu={gelu:?} residual={residual} tensor_cores={tc} big_tiles={big_tiles:?} cpu_tiles={cpu_tiles:?} coop_tile={coop_tile:?}",
                        k_slices(n as u32, k as u32)
                    );
                    assert_close(&what, &got, &want, mag, 1e-5, 2e-5);
                }
            }
        }
    }
    assert!(
        fewer_slices > 0,
        "no split product took fewer slices than its most"
    );
}

/// f16 values, two to a word, in and out (an encoder's activations between its kernels): on
/// tensor-core tiles the outputs match the reference rounded to f16 in every tile layout, with
/// the epilogue's bias and GELU, whether X is f32 or f16; elsewhere, with a residual to add
/// into f16 outputs, or with k no multiple of 8 for f16 X, the product refuses them.
#[test]
fn matmul_takes_and_writes_f16_on_tensor_cores() {
    for gpu in product_gpus() {
        let mut rng = Rng::new(33);
        // Rows and columns that fill no tile, k no whole step.
        let (m, n, k) = (70usize, 202usize, 136usize);
        let w = rng.vec(n * k, 1.0);
        let x = round_f16(&rng.vec(m * k, 1.0));
        let bias = rng.vec(n, 1.0);
        let x_halves: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
        let xb = buf(&gpu, &x);
        let xhb = gpu.storage_from("x halves", &x_halves).expect("x");
        let bb = buf(&gpu, &bias);
        let yb = gpu.storage("y", (m * n * 2) as u64).expect("y");
        let st = step(&gpu, 0, m as u32);
        let short =
            Matrix::from_f32(&gpu, "w", &w[..n * 132], n as u32, 132, WeightDType::F16).expect("w");
        let refused = |w: &Matrix, x: &StorageBuffer, opts: MatMulOptions<'_>| {
            MatMul::new(&gpu, w, x, &yb, &st, opts).is_err()
        };
        let half_in = || MatMulOptions {
            half_in: true,
            ..Default::default()
        };
        assert!(refused(&short, &xhb, half_in()), "f16 X over k = 132");
        for dtype in [WeightDType::F16, WeightDType::F32] {
            let wm = Matrix::from_f32(&gpu, "w", &w, n as u32, k as u32, dtype).expect("w");
            let options = |coop_tile, half_in| MatMulOptions {
                bias: Some(&bb),
                gelu: Some(Gelu::Erf),
                coop_tile,
                half_out: true,
                half_in,
                ..Default::default()
            };
            let residual = MatMulOptions {
                residual: true,
                ..options(None, false)
            };
            assert!(refused(&wm, &xb, residual), "f16 outputs took a residual");
            if !gpu.caps().cooperative_matrix {
                assert!(
                    refused(&wm, &xb, options(None, false)),
                    "f16 Y off tensor cores"
                );
                assert!(refused(&wm, &xhb, half_in()), "f16 X off tensor cores");
                continue;
            }
            let hw = round_f16(&host_weights(&w, dtype));
            let (product, mag) = product_ref(&hw, &x, m, n, k);
            let want: Vec<f32> = (0..m * n)
                .map(|i| gelu_erf(product[i] + bias[i % n]))
                .collect();
            for tile in coop_tiles(&gpu) {
                for (x_in, halves) in [(&xb, false), (&xhb, true)] {
                    let op = MatMul::new(&gpu, &wm, x_in, &yb, &st, options(tile, halves))
                        .expect("matmul");
                    let mut rec = Recorder::new(&gpu);
                    rec.clear(&yb.buffer);
                    op.encode(&mut rec, m as u32);
                    rec.submit();
                    let words: Vec<half::f16> = gpu.read(&yb.buffer, 0, (m * n) as u64).expect("y");
                    let got: Vec<f32> = words.iter().map(|h| h.to_f32()).collect();
                    // f16 keeps 11 significant bits.
                    let scale: Vec<f32> = mag.iter().zip(&want).map(|(a, b)| a + b.abs()).collect();
                    let what = format!(
                        "f16 outputs {dtype:?} m={m} n={n} k={k} tile={tile:?} f16 X {halves}"
                    );
                    assert_close(&what, &got, &want, &scale, 1e-5, 1e-3);
                }
            }
        }
    }
}

/// One product recorded for a short and a long prompt: where the adapter's tensor cores give
/// long prompts a wider tile (`LONG_PROMPT_ROWS`), each length must dispatch its own tile
/// with its own parameters, split along k as its tiles need, and reduce to the same product.
#[test]
fn matmul_long_prompts_take_their_own_tile() {
    for gpu in product_gpus() {
        let mut rng = Rng::new(21);
        // Wide enough (n = 1024) over k deep enough (≥ 640) for the wide tile, k not so deep
        // that 64-deep steps win.
        let (n, k) = (1024usize, 700usize);
        let longest = LONG_PROMPT_ROWS as usize + 37;
        let w = rng.vec(n * k, 1.0);
        let x = rng.vec(longest * k, 1.0);
        let bias = rng.vec(n, 1.0);
        let dtype = WeightDType::F16;
        let wm = Matrix::from_f32(&gpu, "w", &w, n as u32, k as u32, dtype).expect("w");
        let (xb, bb) = (buf(&gpu, &x), buf(&gpu, &bias));
        let yb = buf(&gpu, &vec![0.0; longest * n]);
        let scratch_bytes = MatMul::scratch_bytes(n as u32, k as u32, longest as u32);
        let scratch = gpu.storage("scratch", scratch_bytes).expect("scratch");
        let st = step(&gpu, 0, 1);
        let op = MatMul::new(
            &gpu,
            &wm,
            &xb,
            &yb,
            &st,
            MatMulOptions {
                bias: Some(&bb),
                split_scratch: Some((&scratch, longest as u32)),
                ..Default::default()
            },
        )
        .expect("matmul");
        let tc = op.uses_tensor_cores();
        let short_tile = op.tile_for(67);
        let long_tile = op.tile_for(longest as u32);
        if tc {
            assert_ne!(short_tile, long_tile, "long prompts keep the short tile");
        }
        let hw = host_weights(&w, dtype);
        let (product, mag) = product_ref(
            &product_input(tc, &hw),
            &product_input(tc, &x),
            longest,
            n,
            k,
        );
        for m in [67, LONG_PROMPT_ROWS as usize, longest] {
            st.write(&gpu, &StepParams::new(0, m as u32));
            let mut rec = Recorder::new(&gpu);
            op.encode(&mut rec, m as u32);
            rec.submit();
            let got = read(&gpu, &yb, m * n);
            let want: Vec<f32> = (0..m * n).map(|i| product[i] + bias[i % n]).collect();
            let what = format!(
                "matmul m={m} n={n} k={k} tile={:?} slices={}",
                op.tile_for(m as u32),
                op.slices_for(m as u32)
            );
            assert_close(&what, &got, &want, &mag[..m * n], 1e-5, 2e-5);
        }
    }
}

/// Fused gate/up products that gate in their epilogue (tensor-core tiles): every form, with
/// and without bias, split along k and not, on every tile layout, at widths that leave a
/// tile's halves part-filled (odd, and a multiple of four for the vec4 k-split sums).
#[test]
fn matmul_gates_in_its_epilogue() {
    for gpu in product_gpus() {
        let mut rng = Rng::new(23);
        // k of two 256-deep slices at most, so the split products split.
        let (m, k) = (70usize, 576usize);
        let x = rng.vec(m * k, 1.0);
        let xb = buf(&gpu, &x);
        let st = step(&gpu, 0, m as u32);
        if !MatMul::gates_in_epilogue(&gpu) {
            let w = Matrix::from_f32(
                &gpu,
                "w",
                &rng.vec(2 * 8 * k, 1.0),
                16,
                k as u32,
                WeightDType::F16,
            )
            .expect("w");
            let yb = buf(&gpu, &vec![0.0; m * 8]);
            let refused = MatMul::new(
                &gpu,
                &w,
                &xb,
                &yb,
                &st,
                MatMulOptions {
                    glu: Some(GluKind::Silu),
                    ..Default::default()
                },
            );
            assert!(
                refused.is_err(),
                "an adapter without tensor cores gates in a product"
            );
            continue;
        }
        let mut tiles = coop_tiles(&gpu);
        tiles.retain(|t| t.is_none_or(|t| t.grid.1.is_multiple_of(2)));
        for (case, (width, kind)) in [
            (37usize, GluKind::Silu),
            (200, GluKind::GeluTanh),
            (132, GluKind::GeluErf),
        ]
        .into_iter()
        .enumerate()
        {
            let n = 2 * width;
            let bias = rng.vec(n, 1.0);
            let bb = buf(&gpu, &bias);
            // The second form multiplies Q4_0 blocks as they are staged.
            let (wm, w) = if kind == GluKind::GeluTanh {
                let blocks = random_blocks(&mut rng, GgmlType::Q4_0, n, k);
                let mut w = vec![0.0f32; n * k];
                dequantize(GgmlType::Q4_0, &blocks, &mut w);
                let wm =
                    Matrix::from_blocks(&gpu, "w", GgmlType::Q4_0, &blocks, n as u32, k as u32);
                (wm.expect("w"), w)
            } else {
                let w = rng.vec(n * k, 1.0);
                let wm = Matrix::from_f32(&gpu, "w", &w, n as u32, k as u32, WeightDType::F16);
                (wm.expect("w"), w)
            };
            let hw = product_input(true, &w);
            let (product, mag) = product_ref(&hw, &product_input(true, &x), m, n, k);
            let scratch_bytes = MatMul::scratch_bytes(n as u32, k as u32, m as u32);
            let scratch = gpu
                .storage("scratch", scratch_bytes.max(4))
                .expect("scratch");
            for (i, &tile) in tiles.iter().enumerate() {
                let bias_on = (case + i) % 2 == 0;
                for split in [false, true] {
                    let yb = buf(&gpu, &vec![0.0; m * width]);
                    let op = MatMul::new(
                        &gpu,
                        &wm,
                        &xb,
                        &yb,
                        &st,
                        MatMulOptions {
                            bias: bias_on.then_some(&bb),
                            split_scratch: split.then_some((&scratch, m as u32)),
                            // More workgroups wanted than these small products have
                            // tiles, so the split ones split.
                            split_target: Some(64),
                            coop_tile: tile,
                            glu: Some(kind),
                            ..Default::default()
                        },
                    )
                    .expect("gated matmul");
                    assert_eq!(op.slices_for(m as u32) > 1, split, "split {split}");
                    let mut rec = Recorder::new(&gpu);
                    op.encode(&mut rec, m as u32);
                    rec.submit();
                    let got = read(&gpu, &yb, m * width);
                    let b = |c: usize| if bias_on { bias[c] } else { 0.0 };
                    let (mut want, mut scale) = (Vec::new(), Vec::new());
                    for r in 0..m {
                        for c in 0..width {
                            let (i0, i1) = (r * n + c, r * n + width + c);
                            let (a, bv) = (product[i0] + b(c), product[i1] + b(width + c));
                            let (v, s) = match kind {
                                GluKind::Silu => {
                                    (silu(a) * bv, bv.abs() * mag[i0] + silu(a).abs() * mag[i1])
                                }
                                GluKind::GeluTanh => (
                                    gelu_tanh(a) * bv,
                                    1.13 * bv.abs() * mag[i0] + gelu_tanh(a).abs() * mag[i1],
                                ),
                                GluKind::GeluErf => (
                                    a * gelu_erf(bv),
                                    gelu_erf(bv).abs() * mag[i0] + 1.13 * a.abs() * mag[i1],
                                ),
                            };
                            want.push(v);
                            scale.push(s);
                        }
                    }
                    let what = format!(
                        "gated matmul {kind:?} m={m} width={width} k={k} bias={bias_on} split={split} slices={} tile={tile:?}",
                        op.slices_for(m as u32)
                    );
                    assert_close(&what, &got, &want, &scale, 1e-5, 2e-5);
                }
            }
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

struct RopeCase {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    /// Leading dims that rotate (partial rotary below head_dim).
    rotary_dim: u32,
    tokens: u32,
    pos0: u32,
    capacity: u32,
}

#[test]
fn rope_and_cache_store_match_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(4);
    let cases = [
        RopeCase {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            rotary_dim: 8,
            tokens: 5,
            pos0: 3,
            capacity: 16,
        },
        RopeCase {
            heads: 3,
            kv_heads: 1,
            head_dim: 12,
            rotary_dim: 12,
            tokens: 1,
            pos0: 10,
            capacity: 11,
        },
        RopeCase {
            heads: 2,
            kv_heads: 2,
            head_dim: 20,
            rotary_dim: 20,
            tokens: 7,
            pos0: 0,
            capacity: 9,
        },
        // Partial rotary: 8 of 20 dims rotate, 12 pass through.
        RopeCase {
            heads: 3,
            kv_heads: 1,
            head_dim: 20,
            rotary_dim: 8,
            tokens: 4,
            pos0: 2,
            capacity: 8,
        },
        // q8_0-sized heads (the q8_0 cache runs on these): whole and partial rotary.
        RopeCase {
            heads: 2,
            kv_heads: 1,
            head_dim: 64,
            rotary_dim: 64,
            tokens: 3,
            pos0: 5,
            capacity: 9,
        },
        RopeCase {
            heads: 3,
            kv_heads: 3,
            head_dim: 96,
            rotary_dim: 48,
            tokens: 2,
            pos0: 40,
            capacity: 7,
        },
        // A rolling cache of 6 rows: positions 9..13 wrap to rows 3, 4, 5, 0, 1.
        RopeCase {
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
            rotary_dim: 8,
            tokens: 5,
            pos0: 9,
            capacity: 6,
        },
    ];
    let spec = RopeSpec {
        theta: 10000.0,
        scaling: RopeScaling::None,
    };
    // Gated queries: a gate head after each query head in the rows (Qwen3.5), passed over.
    for (dtype, gated) in [
        (KvDType::F32, false),
        (KvDType::F16, false),
        (KvDType::Q8_0, false),
        (KvDType::F32, true),
        (KvDType::Q8_0, true),
    ] {
        for with_rope in [true, false] {
            for c in &cases {
                if dtype == KvDType::Q8_0 && c.head_dim % 32 != 0 {
                    continue;
                }
                let hd = c.head_dim as usize;
                let slots = (c.heads + 2 * c.kv_heads) as usize;
                let q_step = if gated { 2 } else { 1 };
                let row_slots = slots + if gated { c.heads as usize } else { 0 };
                // Where logical head slot s (queries, keys, values) lies in a row.
                let src_slot = |s: usize| {
                    if s < c.heads as usize {
                        s * q_step
                    } else {
                        s + (q_step - 1) * c.heads as usize
                    }
                };
                let qkv = rng.vec(c.tokens as usize * row_slots * hd, 2.0);
                let inv_freq = spec.inv_freq(c.rotary_dim);
                let positions = c.capacity.max(c.pos0 + c.tokens);
                let table = RopeTable::new(&gpu, &inv_freq, positions).expect("table");
                let cache_elems = (c.kv_heads * c.capacity) as usize * hd;
                let shape = CacheShape {
                    gated_queries: gated,
                    ..CacheShape::new(c.heads, c.kv_heads, c.head_dim, c.capacity, dtype)
                };
                let cache_bytes = shape.buffer_bytes();
                let (qkvb, qb) = (
                    buf(&gpu, &qkv),
                    gpu.storage("q", (c.tokens * c.heads) as u64 * hd as u64 * 4)
                        .expect("q"),
                );
                let kc = gpu.storage("k", cache_bytes).expect("k");
                let vc = gpu.storage("v", cache_bytes).expect("v");
                let st = step(&gpu, c.pos0, c.tokens);
                let op = RopeKv::new(
                    &gpu,
                    shape,
                    with_rope.then_some(&table),
                    &qkvb,
                    &qb,
                    &kc,
                    &vc,
                    &st,
                )
                .expect("rope");
                let mut rec = Recorder::new(&gpu);
                op.encode(&mut rec, c.tokens);
                rec.submit();

                let rotate = |v: &[f32], pos: u32| -> Vec<f32> {
                    if !with_rope {
                        return v.to_vec();
                    }
                    let h = c.rotary_dim as usize / 2;
                    let mut out = v.to_vec();
                    for i in 0..h {
                        let angle = f64::from(pos as f32 * inv_freq[i]);
                        let (s, co) = angle.sin_cos();
                        let (a, b) = (f64::from(v[i]), f64::from(v[i + h]));
                        out[i] = (a * co - b * s) as f32;
                        out[i + h] = (b * co + a * s) as f32;
                    }
                    out
                };
                let read_cache = |b: &StorageBuffer| -> Vec<f32> {
                    match dtype {
                        KvDType::F32 => read(&gpu, b, cache_elems),
                        KvDType::Q8_0 => {
                            let words: Vec<u32> = gpu
                                .read(
                                    &b.buffer,
                                    0,
                                    cache_elems as u64 / 4 + cache_elems as u64 / 32,
                                )
                                .expect("read");
                            let (values, scales) = words.split_at(cache_elems / 4);
                            values
                                .iter()
                                .enumerate()
                                .flat_map(|(i, w)| {
                                    let d = f32::from_bits(scales[i / 8]);
                                    (0..4).map(move |j| f32::from((*w >> (8 * j)) as u8 as i8) * d)
                                })
                                .collect()
                        }
                        KvDType::F16 => {
                            let words: Vec<u32> = gpu
                                .read(&b.buffer, 0, cache_elems as u64 / 2)
                                .expect("read");
                            words
                                .iter()
                                .flat_map(|w| {
                                    [
                                        half::f16::from_bits(*w as u16).to_f32(),
                                        half::f16::from_bits((*w >> 16) as u16).to_f32(),
                                    ]
                                })
                                .collect()
                        }
                    }
                };
                let (gq, gk, gv) = (
                    read(&gpu, &qb, (c.tokens * c.heads) as usize * hd),
                    read_cache(&kc),
                    read_cache(&vc),
                );
                let cache_round = |v: Vec<f32>| match dtype {
                    KvDType::F32 => v,
                    KvDType::F16 => round_f16(&v),
                    KvDType::Q8_0 => q8_blocks(&v).2,
                };
                for t in 0..c.tokens as usize {
                    let pos = c.pos0 + t as u32;
                    for s in 0..slots {
                        let at = (t * row_slots + src_slot(s)) * hd;
                        let src = &qkv[at..at + hd];
                        let is_q = s < c.heads as usize;
                        let is_k = !is_q && s < (c.heads + c.kv_heads) as usize;
                        let want = if is_q || is_k {
                            rotate(src, pos)
                        } else {
                            src.to_vec()
                        };
                        let (got, want) = if is_q {
                            let at = (t * c.heads as usize + s) * hd;
                            (gq[at..at + hd].to_vec(), want)
                        } else {
                            let g = if is_k {
                                s - c.heads as usize
                            } else {
                                s - (c.heads + c.kv_heads) as usize
                            };
                            let row = (pos % c.capacity) as usize;
                            let at = (g * c.capacity as usize + row) * hd;
                            let cache = if is_k { &gk } else { &gv };
                            (cache[at..at + hd].to_vec(), cache_round(want))
                        };
                        let scale = vec![1.0; hd];
                        // q8_0: one step of the block's scale (a rotation rounded a little
                        // differently may land on the neighbouring step).
                        let tol = match dtype {
                            _ if is_q => 1e-5,
                            KvDType::F16 => 2e-3,
                            KvDType::Q8_0 => 2.0 * 2.0 * 1.5 / 127.0,
                            KvDType::F32 => 1e-5,
                        };
                        assert_close(
                            &format!(
                                "rope {dtype:?} rope={with_rope} gated={gated} hd={hd} t={t} slot={s}"
                            ),
                            &got,
                            &want,
                            &scale,
                            tol,
                            1e-5,
                        );
                    }
                }
            }
        }
    }
}

/// Inputs of one attention case on the host (cache values as the GPU holds them) and GPU.
struct AttentionInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qb: StorageBuffer,
    kb: StorageBuffer,
    vb: StorageBuffer,
}

#[derive(Clone, Copy, Debug)]
struct AttentionCase {
    heads: u32,
    kv_heads: u32,
    hd: u32,
    tokens: u32,
    pos0: u32,
    capacity: u32,
}

fn attention_inputs(
    gpu: &Gpu,
    rng: &mut Rng,
    dtype: WeightDType,
    c: AttentionCase,
) -> AttentionInputs {
    let hdu = c.hd as usize;
    let q = rng.vec((c.tokens * c.heads * c.hd) as usize, 1.0);
    let cache_elems = (c.kv_heads * c.capacity * c.hd) as usize;
    // Positions past each query must be masked: give them values that would dominate.
    let mut k = rng.vec(cache_elems, 1.0);
    let mut v = rng.vec(cache_elems, 1.0);
    for g in 0..c.kv_heads as usize {
        for p in (c.pos0 + c.tokens) as usize..c.capacity as usize {
            for d in 0..hdu {
                let at = (g * c.capacity as usize + p) * hdu + d;
                k[at] = 50.0;
                v[at] = 1000.0;
            }
        }
    }
    let (kb, k) = upload_cache(gpu, dtype, &k);
    let (vb, v) = upload_cache(gpu, dtype, &v);
    let qb = buf(gpu, &q);
    AttentionInputs {
        q,
        k,
        v,
        qb,
        kb,
        vb,
    }
}

/// A cache buffer holding `data` as `dtype`, and the values it holds.
fn upload_cache(gpu: &Gpu, dtype: WeightDType, data: &[f32]) -> (StorageBuffer, Vec<f32>) {
    match dtype {
        WeightDType::F32 => (buf(gpu, data), data.to_vec()),
        WeightDType::F16 => {
            let halves: Vec<u16> = data
                .iter()
                .map(|x| half::f16::from_f32(*x).to_bits())
                .collect();
            let cache = gpu.storage_from("cache", &halves).expect("cache");
            (cache, round_f16(data))
        }
    }
}

/// Softmax attention in f64, `[tokens][heads][hd]`, with `sinks` a logit per head joining
/// every softmax's denominator.
fn attention_ref_with_sinks(
    inp: &AttentionInputs,
    c: AttentionCase,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let (hdu, cap) = (c.hd as usize, c.capacity as usize);
    let scale = 1.0 / f64::from(c.hd).sqrt();
    let mut want = Vec::with_capacity(inp.q.len());
    for t in 0..c.tokens as usize {
        for h in 0..c.heads as usize {
            let g = h / (c.heads / c.kv_heads) as usize;
            let qrow = &inp.q[(t * c.heads as usize + h) * hdu..][..hdu];
            let n_keys = c.pos0 as usize + t + 1;
            let scores: Vec<f64> = (0..n_keys)
                .map(|j| {
                    let krow = &inp.k[(g * cap + j) * hdu..][..hdu];
                    qrow.iter()
                        .zip(krow)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sink = sinks.map_or(0.0, |s| (f64::from(s[h]) - m).exp());
            let z: f64 = e.iter().sum::<f64>() + sink;
            for d in 0..hdu {
                let o: f64 = (0..n_keys)
                    .map(|j| e[j] * f64::from(inp.v[(g * cap + j) * hdu + d]))
                    .sum::<f64>()
                    / z;
                want.push(o as f32);
            }
        }
    }
    want
}

#[test]
fn attention_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(5);
    // GQA, MHA, long contexts that span several 256-key chunks, odd head sizes, one token;
    // prompts of several query blocks (32 queries for heads up to 64 wide, 16 above), after a
    // cached prefix or not, whose last block is partly empty.
    let cases = [
        (4u32, 2u32, 16u32, 4u32, 5u32, 12u32),
        (3, 3, 8, 1, 300, 310),
        (6, 2, 12, 3, 250, 260),
        (2, 1, 64, 2, 0, 2),
        (2, 2, 80, 3, 517, 530),
        (4, 1, 128, 1, 40, 64),
        (4, 2, 64, 37, 5, 50),
        (3, 3, 12, 70, 0, 75),
        (2, 1, 128, 19, 33, 60),
        // Three blocks of 64 queries over four of 64 keys (tensor cores).
        (2, 1, 32, 130, 70, 200),
        // Heads of 96: blocks of 32 keys, outputs in two halves (tensor cores).
        (2, 2, 96, 70, 40, 120),
        // Heads of 192 and 256 (Gemma 3, Qwen3.5): outputs in passes of 32 dims, each block
        // of keys loaded right before it is staged (tensor cores).
        (3, 1, 192, 66, 0, 70),
        (2, 1, 256, 70, 40, 120),
    ];
    for dtype in DTYPES {
        for &(heads, kv_heads, hd, tokens, pos0, capacity) in &cases {
            let c = AttentionCase {
                heads,
                kv_heads,
                hd,
                tokens,
                pos0,
                capacity,
            };
            let inp = attention_inputs(&gpu, &mut rng, dtype, c);
            check_prompt_kernels(&gpu, &inp, dtype, c, "attention");
        }
    }
}

/// Runs every kernel a prompt can take over `inp` (per query, query blocks for prompts of four
/// or more, and on tensor cores blocks of 64 queries) against the f64 reference.
fn check_prompt_kernels(
    gpu: &Gpu,
    inp: &AttentionInputs,
    dtype: WeightDType,
    c: AttentionCase,
    what: &str,
) {
    check_prompt_kernels_with_sinks(gpu, inp, dtype, c, what, None);
}

fn check_prompt_kernels_with_sinks(
    gpu: &Gpu,
    inp: &AttentionInputs,
    dtype: WeightDType,
    c: AttentionCase,
    what: &str,
    sinks: Option<&[f32]>,
) {
    let out = gpu.storage("out", inp.q.len() as u64 * 4).expect("out");
    let st = step(gpu, c.pos0, c.tokens);
    let shape = CacheShape::new(c.heads, c.kv_heads, c.hd, c.capacity, dtype);
    let op = match sinks {
        Some(s) => {
            let sb = buf(gpu, s);
            Attention::with_sinks(gpu, shape, &inp.qb, &inp.kb, &inp.vb, &out, &sb, &st)
        }
        None => Attention::new(gpu, shape, &inp.qb, &inp.kb, &inp.vb, &out, &st),
    }
    .expect("attention");
    let want = attention_ref_with_sinks(inp, c, sinks);
    let ones = vec![1.0; want.len()];
    for kernel in op.kernels() {
        let mut rec = Recorder::new(gpu);
        op.encode_with(&mut rec, c.pos0, c.tokens, kernel);
        rec.submit();
        let got = read(gpu, &out, inp.q.len());
        assert_close(
            &format!("{what} {dtype:?} {c:?} {kernel:?}"),
            &got,
            &want,
            &ones,
            attention_atol(kernel, 2e-5),
            0.0,
        );
    }
}

/// A sink logit per head: one far above the scores (the outputs all but vanish), one far
/// below (no effect), the rest among them.
fn sink_logits(rng: &mut Rng, heads: u32) -> Vec<f32> {
    (0..heads)
        .map(|h| match h {
            0 => 30.0,
            1 => -30.0,
            _ => rng.uniform() * 3.0,
        })
        .collect()
}

/// GPT-OSS's sinks: a logit per head in every softmax's denominator, one far above the
/// scores (the outputs all but vanish), one far below (no effect), others among them; on every
/// prompt kernel, decode included.
#[test]
fn attention_with_sinks_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(15);
    let cases = [
        (4u32, 2u32, 16u32, 1u32, 9u32, 12u32),
        (4, 2, 64, 37, 5, 50),
        (4, 1, 32, 130, 70, 200),
    ];
    for dtype in DTYPES {
        for &(heads, kv_heads, hd, tokens, pos0, capacity) in &cases {
            let c = AttentionCase {
                heads,
                kv_heads,
                hd,
                tokens,
                pos0,
                capacity,
            };
            let inp = attention_inputs(&gpu, &mut rng, dtype, c);
            let sinks = sink_logits(&mut rng, heads);
            check_prompt_kernels_with_sinks(&gpu, &inp, dtype, c, "sinks", Some(&sinks));
        }
    }
}

/// Prompt attention whose scores climb along the keys, so that a later block's max passes the
/// rows' running max by far (the tensor-core kernel rescales its outputs then), and falls for
/// other rows (whose first block keeps the max).
#[test]
fn attention_follows_a_climbing_max() {
    let gpu = gpu();
    let mut rng = Rng::new(31);
    let cases = [
        AttentionCase {
            heads: 2,
            kv_heads: 1,
            hd: 64,
            tokens: 130,
            pos0: 70,
            capacity: 200,
        },
        // Outputs in two halves.
        AttentionCase {
            heads: 2,
            kv_heads: 2,
            hd: 128,
            tokens: 70,
            pos0: 60,
            capacity: 130,
        },
    ];
    for dtype in DTYPES {
        for c in cases {
            let mut inp = attention_inputs(&gpu, &mut rng, dtype, c);
            // Dim 0 of key j is 3j (exact in f16) and of each query ±1 by head: the first
            // head's scores climb by 3 / sqrt(hd) a key, past the running max by more than a
            // block's worth, the second's fall.
            let hdu = c.hd as usize;
            let visible = (c.pos0 + c.tokens) as usize;
            let mut k = inp.k.clone();
            for g in 0..c.kv_heads as usize {
                for j in 0..visible {
                    k[(g * c.capacity as usize + j) * hdu] = 3.0 * j as f32;
                }
            }
            for (i, row) in inp.q.chunks_mut(hdu).enumerate() {
                row[0] = if i % c.heads as usize == 0 { 1.0 } else { -1.0 };
            }
            (inp.kb, inp.k) = upload_cache(&gpu, dtype, &k);
            inp.qb = buf(&gpu, &inp.q);
            check_prompt_kernels(&gpu, &inp, dtype, c, "climbing attention");
        }
    }
}

/// q8_0 blocks of `x` (a multiple of 32 long) as the KV cache stores them: int8 values four to
/// a word, one scale per block, and the values they stand for.
fn q8_blocks(x: &[f32]) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let (mut words, mut scales, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for block in x.chunks(32) {
        let d = block.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<i32> = block
            .iter()
            .map(|v| (v * inv).clamp(-127.0, 127.0).round_ties_even() as i32)
            .collect();
        for four in q.chunks(4) {
            words.push(
                four.iter()
                    .enumerate()
                    .fold(0u32, |w, (j, b)| w | ((*b as u32 & 255) << (8 * j))),
            );
        }
        values.extend(q.iter().map(|b| *b as f32 * d));
        scales.push(d);
    }
    (words, scales, values)
}

/// Sliding-window attention over a rolling cache (Gemma's local layers, Mistral): queries see
/// the last `window` positions, stored in rows `pos mod rows`; with a softmax scale of its own.
/// Prompt kernels (per query and tiled) and the split decode step merged by the output product,
/// over f32, f16 and q8_0 caches.
#[test]
fn windowed_attention_over_a_rolling_cache_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(25);
    // (heads, kv_heads, head_dim, window, rows, pos0, tokens)
    let cases = [
        (4u32, 2u32, 16u32, 5u32, 12u32, 17u32, 7u32),
        (2, 1, 64, 40, 80, 90, 37),
        (3, 3, 12, 300, 303, 700, 4),
        (2, 1, 128, 9, 30, 2, 19),
        (4, 2, 16, 70, 70, 200, 1),
        (4, 1, 24, 130, 131, 1000, 1),
        (4, 2, 32, 70, 80, 200, 1),
        (2, 2, 64, 300, 301, 350, 1),
    ];
    let scale = 0.3f32;
    for dtype in [KvDType::F32, KvDType::F16, KvDType::Q8_0] {
        for &(heads, kv_heads, hd, window, rows, pos0, tokens) in &cases {
            if dtype == KvDType::Q8_0 && hd % 32 != 0 {
                continue;
            }
            let hdu = hd as usize;
            let end = (pos0 + tokens) as usize;
            // Keys and values of every position; the cache holds each in row pos mod rows.
            let (k, v) = (
                rng.vec(kv_heads as usize * end * hdu, 1.0),
                rng.vec(kv_heads as usize * end * hdu, 1.0),
            );
            // What the cache can hold of them.
            let round = |x: Vec<f32>| match dtype {
                KvDType::F32 => x,
                KvDType::F16 => round_f16(&x),
                KvDType::Q8_0 => q8_blocks(&x).2,
            };
            let (k, v) = (round(k), round(v));
            let mut ring_k = vec![0.0f32; (kv_heads * rows) as usize * hdu];
            let mut ring_v = ring_k.clone();
            for g in 0..kv_heads as usize {
                for p in 0..end {
                    let src = (g * end + p) * hdu;
                    let dst = (g * rows as usize + p % rows as usize) * hdu;
                    ring_k[dst..dst + hdu].copy_from_slice(&k[src..src + hdu]);
                    ring_v[dst..dst + hdu].copy_from_slice(&v[src..src + hdu]);
                }
            }
            let upload = |data: &[f32]| match dtype {
                KvDType::F32 => buf(&gpu, data),
                KvDType::F16 => {
                    let halves: Vec<u16> = data
                        .iter()
                        .map(|x| half::f16::from_f32(*x).to_bits())
                        .collect();
                    gpu.storage_from("cache", &halves).expect("cache")
                }
                // Values four to a word, then the block scales.
                KvDType::Q8_0 => {
                    let (mut words, scales, _) = q8_blocks(data);
                    words.extend(scales.iter().map(|s| s.to_bits()));
                    gpu.storage_from("cache", &words).expect("cache")
                }
            };
            let q = rng.vec((tokens * heads) as usize * hdu, 1.0);
            let want: Vec<f32> = (0..tokens as usize)
                .flat_map(|t| (0..heads as usize).map(move |h| (t, h)))
                .flat_map(|(t, h)| {
                    let g = h / (heads / kv_heads) as usize;
                    let pos = pos0 as usize + t;
                    let keys = pos.saturating_sub(window as usize - 1)..=pos;
                    let qrow = &q[(t * heads as usize + h) * hdu..][..hdu];
                    let scores: Vec<f64> = keys
                        .clone()
                        .map(|j| {
                            let krow = &k[(g * end + j) * hdu..][..hdu];
                            qrow.iter()
                                .zip(krow)
                                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                                .sum::<f64>()
                                * f64::from(scale)
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    (0..hdu)
                        .map(|d| {
                            keys.clone()
                                .zip(&e)
                                .map(|(j, w)| w * f64::from(v[(g * end + j) * hdu + d]))
                                .sum::<f64>()
                                / z
                        })
                        .map(|o| o as f32)
                        .collect::<Vec<_>>()
                })
                .collect();
            let shape = CacheShape {
                window: Some(window),
                scale: Some(scale),
                ..CacheShape::new(heads, kv_heads, hd, rows, dtype)
            };
            let (kb, vb) = (upload(&ring_k), upload(&ring_v));
            let st = step(&gpu, pos0, tokens);
            let what = format!(
                "windowed attention {dtype:?} heads={heads}/{kv_heads} hd={hd} window={window} rows={rows} pos0={pos0} tokens={tokens}"
            );
            if tokens > 1 {
                let (qb, out) = (
                    buf(&gpu, &q),
                    gpu.storage("out", q.len() as u64 * 4).expect("out"),
                );
                let op = Attention::new(&gpu, shape, &qb, &kb, &vb, &out, &st).expect("attention");
                for kernel in op.kernels() {
                    let mut rec = Recorder::new(&gpu);
                    op.encode_with(&mut rec, pos0, tokens, kernel);
                    rec.submit();
                    let got = read(&gpu, &out, q.len());
                    let ones = vec![1.0; want.len()];
                    assert_close(
                        &format!("{what} {kernel:?}"),
                        &got,
                        &want,
                        &ones,
                        attention_atol(kernel, 2e-5),
                        0.0,
                    );
                }
                continue;
            }
            // Decoding: the token's q, k and v come from its QKV row (no RoPE here); k and v
            // of the current position are the ones the reference used.
            let mut qkv = q.clone();
            for g in 0..kv_heads as usize {
                let src = (g * end + pos0 as usize) * hdu;
                qkv.extend_from_slice(&k[src..src + hdu]);
            }
            for g in 0..kv_heads as usize {
                let src = (g * end + pos0 as usize) * hdu;
                qkv.extend_from_slice(&v[src..src + hdu]);
            }
            let width = heads * hd;
            let partials = gpu
                .storage("runs", u64::from(MAX_SPLITS * width) * 4)
                .expect("runs");
            let stats = gpu
                .storage("stats", u64::from(MAX_SPLITS * heads) * 8)
                .expect("stats");
            let qkv_b = buf(&gpu, &qkv);
            let att = Attention::new_split(
                &gpu, shape, &qkv_b, None, &kb, &vb, &partials, &stats, None, &st,
            )
            .expect("split attention");
            let n_out = 29u32;
            let w = rng.vec((n_out * width) as usize, 1.0);
            let wm = Matrix::from_f32(&gpu, "w", &w, n_out, width, WeightDType::F32).expect("w");
            let unused_x = gpu.storage("x", u64::from(width) * 4).expect("x");
            let y = gpu.storage("y", u64::from(n_out) * 4).expect("y");
            let combine = SplitAttention {
                partials: &partials,
                stats: &stats,
                heads,
                head_dim: hd,
                window: Some(window),
                gate: None,
                sinks: None,
            };
            let opts = MatVecOptions {
                combine: Some(combine),
                ..Default::default()
            };
            let merge = MatVec::new(&gpu, &wm, &unused_x, &y, &st, opts).expect("merge");
            let mut rec = Recorder::new(&gpu);
            att.encode(&mut rec, pos0, 1);
            merge.encode(&mut rec);
            rec.submit();
            let got = read(&gpu, &y, n_out as usize);
            let (want, mag) = matvec_ref(&w, &want, n_out as usize, width as usize);
            assert_close(&what, &got, &want, &mag, 1e-5, 1e-4);
        }
    }
}

/// Decoding splits the keys over workgroups, takes the token's q/k/v from the fused QKV row
/// (rotating q and k itself, and storing k and v in the cache), and the output product merges
/// the runs while it stages its input. Checked end to end: y = W · attention, and the cache.
#[test]
fn split_attention_merged_by_the_output_product_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(15);
    let mut merged_int8 = 0;
    // 1 run, 5 runs of 64 keys, 16 runs of 125 keys, GQA with head_dim 128 and 256 (their
    // runs take narrower workgroups), head_dim 12; partial rotary (the last field: rotating
    // dims).
    let cases = [
        (4u32, 2u32, 16u32, 0u32, 8u32, 16u32),
        (4, 2, 16, 300, 310, 16),
        (2, 1, 64, 1999, 2001, 64),
        (4, 1, 128, 700, 701, 128),
        (2, 1, 256, 150, 160, 256),
        (3, 1, 12, 70, 90, 12),
        (4, 2, 20, 90, 100, 8),
    ];
    let spec = RopeSpec {
        theta: 10000.0,
        scaling: RopeScaling::None,
    };
    for dtype in DTYPES {
        // Sinks (GPT-OSS): a logit per head that the merge adds to each softmax's
        // denominator, one far above the scores, one far below, the rest among them. Head
        // norms (Qwen3, Gemma 3): each query and key head RMS-normalised before RoPE.
        for (with_rope, gated, with_sinks, normed) in [
            (true, false, false, false),
            (false, false, false, false),
            (true, true, false, false),
            (true, false, true, false),
            (true, false, false, true),
            (false, true, false, true),
        ] {
            for &(heads, kv_heads, hd, pos0, capacity, rot) in &cases {
                // Gated queries (Qwen3.5): each query head followed by its gate head in the
                // row, the merged output scaled by sigmoid of the gate.
                let q_step = if gated { 2 } else { 1 };
                let c = AttentionCase {
                    heads,
                    kv_heads,
                    hd,
                    tokens: 1,
                    pos0,
                    capacity,
                };
                let mut inp = attention_inputs(&gpu, &mut rng, dtype, c);
                let hdu = hd as usize;
                // The token's QKV row; rotated copies are what the reference attends with.
                let slots = (q_step * heads + 2 * kv_heads) as usize;
                // Raw heads far from unit RMS, so that a missing norm shows.
                let qkv: Vec<f32> = rng.vec(slots * hdu, 1.0).iter().map(|v| v * 3.0).collect();
                let q_at = |h: usize| h * q_step as usize * hdu;
                let inv_freq = spec.inv_freq(rot);
                let eps = 1e-6f32;
                let (q_gain, k_gain) = (rng.vec(hdu, 1.0), rng.vec(hdu, 1.0));
                let norm = |v: &[f32], gain: &[f32]| -> Vec<f32> {
                    if !normed {
                        return v.to_vec();
                    }
                    let mean_sq = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / hdu as f64;
                    let inv = 1.0 / (mean_sq + f64::from(eps)).sqrt();
                    v.iter()
                        .zip(gain)
                        .map(|(x, g)| (f64::from(*x) * inv * f64::from(*g)) as f32)
                        .collect()
                };
                let rotate = |v: &[f32]| -> Vec<f32> {
                    if !with_rope {
                        return v.to_vec();
                    }
                    let h = rot as usize / 2;
                    let mut out = v.to_vec();
                    for i in 0..h {
                        let (s, co) = f64::from(pos0 as f32 * inv_freq[i]).sin_cos();
                        let (a, b) = (f64::from(v[i]), f64::from(v[i + h]));
                        out[i] = (a * co - b * s) as f32;
                        out[i + h] = (b * co + a * s) as f32;
                    }
                    out
                };
                inp.q = (0..heads as usize)
                    .flat_map(|h| rotate(&norm(&qkv[q_at(h)..q_at(h) + hdu], &q_gain)))
                    .collect();
                let heads_end = (q_step * heads) as usize;
                for g in 0..kv_heads as usize {
                    let k_src = (heads_end + g) * hdu;
                    let v_src = (heads_end + kv_heads as usize + g) * hdu;
                    let at = (g * capacity as usize + pos0 as usize) * hdu;
                    inp.k[at..at + hdu]
                        .copy_from_slice(&rotate(&norm(&qkv[k_src..k_src + hdu], &k_gain)));
                    inp.v[at..at + hdu].copy_from_slice(&qkv[v_src..v_src + hdu]);
                }
                let qkv_b = buf(&gpu, &qkv);
                let table = RopeTable::new(&gpu, &inv_freq, capacity).expect("table");
                let width = heads * hd;
                let partials = gpu
                    .storage("runs", u64::from(MAX_SPLITS * width) * 4)
                    .expect("runs");
                let stats = gpu
                    .storage("stats", u64::from(MAX_SPLITS * heads) * 8)
                    .expect("stats");
                let st = step(&gpu, pos0, 1);
                let mut shape = CacheShape::new(heads, kv_heads, hd, capacity, dtype);
                shape.gated_queries = gated;
                let (q_gain_b, k_gain_b) = (buf(&gpu, &q_gain), buf(&gpu, &k_gain));
                let gains = HeadNormGains {
                    q: &q_gain_b,
                    k: &k_gain_b,
                    eps,
                };
                let att = Attention::new_split(
                    &gpu,
                    shape,
                    &qkv_b,
                    with_rope.then_some(&table),
                    &inp.kb,
                    &inp.vb,
                    &partials,
                    &stats,
                    normed.then_some(gains),
                    &st,
                )
                .expect("split attention");
                assert_eq!(att.norms_heads(), normed);
                let rows = 37u32;
                // Block-format weights too (without RoPE): their product quantizes the merged
                // input to int8.
                let quant = match width {
                    _ if with_rope => None,
                    w if w % 256 == 0 => Some(GgmlType::Q4K),
                    w if w % 64 == 0 => Some(GgmlType::Q8_0),
                    w if w % 32 == 0 => Some(GgmlType::Q4_0),
                    _ => None,
                };
                let (w, wm) = match quant {
                    Some(ty) => {
                        let blocks = random_blocks(&mut rng, ty, rows as usize, width as usize);
                        let mut w = vec![0.0f32; (rows * width) as usize];
                        dequantize(ty, &blocks, &mut w);
                        let wm = Matrix::from_blocks(&gpu, "w", ty, &blocks, rows, width);
                        (w, wm.expect("w"))
                    }
                    None => {
                        let w = rng.vec((rows * width) as usize, 1.0);
                        let wm = Matrix::from_f32(&gpu, "w", &w, rows, width, WeightDType::F32);
                        (w, wm.expect("w"))
                    }
                };
                let unused_x = gpu.storage("x", u64::from(width) * 4).expect("x");
                let y = gpu.storage("y", u64::from(rows) * 4).expect("y");
                let sinks = sink_logits(&mut rng, heads);
                let sinks_b = buf(&gpu, &sinks);
                // The adapter's layout, and workgroups of 1,024 with 32 lanes and two rows a
                // lane group, as GPT-OSS's merging products take on an H200.
                let y_wide = gpu.storage("y", u64::from(rows) * 4).expect("y");
                let merges = [(&y, None), (&y_wide, Some(1024))].map(|(out, workgroup)| {
                    MatVec::new(
                        &gpu,
                        &wm,
                        &unused_x,
                        out,
                        &st,
                        MatVecOptions {
                            combine: Some(SplitAttention {
                                partials: &partials,
                                stats: &stats,
                                heads,
                                head_dim: hd,
                                window: None,
                                gate: gated.then_some(&qkv_b),
                                sinks: with_sinks.then_some(&sinks_b),
                            }),
                            layout: MatVecLayout {
                                int8: Some(true),
                                lanes: workgroup.map(|_| 32),
                                rows: workgroup.map(|_| 2),
                                workgroup,
                                ..Default::default()
                            },
                            ..Default::default()
                        },
                    )
                    .expect("merging product")
                });
                let mut rec = Recorder::new(&gpu);
                att.encode(&mut rec, pos0, 1);
                merges.iter().for_each(|m| m.encode(&mut rec));
                rec.submit();
                let merge = &merges[0];
                let got = read(&gpu, &y, rows as usize);
                let got_wide = read(&gpu, &y_wide, rows as usize);
                let mut attn = attention_ref_with_sinks(&inp, c, with_sinks.then_some(&sinks));
                if gated {
                    for (i, a) in attn.iter_mut().enumerate() {
                        let gate = qkv[q_at(i / hdu) + hdu + i % hdu];
                        *a /= 1.0 + (-gate).exp();
                    }
                }
                assert_eq!(merge.takes_int8(), quant.is_some(), "{quant:?}");
                let (want, mag) = if merge.takes_int8() {
                    matvec_ref_int8(&w, &attn, rows as usize, width as usize)
                } else {
                    matvec_ref(&w, &attn, rows as usize, width as usize)
                };
                let what = format!(
                    "split attention {dtype:?} rope={with_rope} gated={gated} sinks={with_sinks} normed={normed} {c:?} {quant:?} ({} runs)",
                    splits_for(pos0 + 1)
                );
                // The token's own k/v enter in f32 here but are stored rounded: allow f16 error.
                let rtol = if dtype == WeightDType::F16 {
                    2e-3
                } else {
                    1e-4
                };
                assert_close(&what, &got, &want, &mag, 1e-5, rtol);
                // (K-quant rows of few sub-blocks take a float input with 32 lanes a row.)
                let (want_wide, mag_wide) = if merges[1].takes_int8() {
                    matvec_ref_int8(&w, &attn, rows as usize, width as usize)
                } else {
                    matvec_ref(&w, &attn, rows as usize, width as usize)
                };
                assert_close(
                    &format!("{what}, workgroups of 1,024"),
                    &got_wide,
                    &want_wide,
                    &mag_wide,
                    1e-5,
                    rtol,
                );
                // The attention's last run of each head merging the head's runs itself, into
                // the int8 blocks the product reads (heads of whole 32-value blocks) or an f32
                // row; twice, since each step's last runs set the counters back.
                let counts = gpu
                    .storage("run counts", u64::from(heads) * 4)
                    .expect("counts");
                let merged_f32 = gpu.storage("merged", u64::from(width) * 4).expect("row");
                let merged_q =
                    (hd % 32 == 0).then(|| Int8Handoff::new(&gpu, width).expect("handoff"));
                let y_merged = gpu.storage("y", u64::from(rows) * 4).expect("y");
                let reads_merged = MatVec::new(
                    &gpu,
                    &wm,
                    &merged_f32,
                    &y_merged,
                    &st,
                    MatVecOptions {
                        handoff_in: merged_q.as_ref(),
                        layout: MatVecLayout {
                            int8: Some(true),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                )
                .expect("product of the merged row");
                let out = match &merged_q {
                    Some(h) if reads_merged.reads_handoff() => MergedRow::Int8(h),
                    _ => MergedRow::F32(&merged_f32),
                };
                merged_int8 += usize::from(reads_merged.reads_handoff());
                let merging = Attention::new_split_merging(
                    &gpu,
                    shape,
                    &qkv_b,
                    with_rope.then_some(&table),
                    (&inp.kb, &inp.vb),
                    (&partials, &stats),
                    normed.then_some(gains),
                    SplitMerge {
                        counts: &counts,
                        out,
                        sinks: with_sinks.then_some(&sinks_b),
                    },
                    &st,
                )
                .expect("merging split attention");
                let (want_merged, mag_merged) = if reads_merged.takes_int8() {
                    matvec_ref_int8(&w, &attn, rows as usize, width as usize)
                } else {
                    matvec_ref(&w, &attn, rows as usize, width as usize)
                };
                for round in 0..2 {
                    let mut rec = Recorder::new(&gpu);
                    merging.encode(&mut rec, pos0, 1);
                    reads_merged.encode(&mut rec);
                    rec.submit();
                    assert_close(
                        &format!(
                            "{what}, merged by the attention ({}, round {round})",
                            if reads_merged.reads_handoff() {
                                "int8"
                            } else {
                                "f32"
                            }
                        ),
                        &read(&gpu, &y_merged, rows as usize),
                        &want_merged,
                        &mag_merged,
                        1e-5,
                        rtol,
                    );
                }
                // The cache now holds the token's rotated key and its value.
                let cache_at = |b: &StorageBuffer, g: usize| -> Vec<f32> {
                    let at = ((g * capacity as usize + pos0 as usize) * hdu) as u64;
                    match dtype {
                        WeightDType::F32 => gpu.read(&b.buffer, at, hd as u64).expect("read"),
                        WeightDType::F16 => {
                            let halves: Vec<u16> =
                                gpu.read(&b.buffer, at, hd as u64).expect("read");
                            halves
                                .iter()
                                .map(|h| half::f16::from_bits(*h).to_f32())
                                .collect()
                        }
                    }
                };
                for g in 0..kv_heads as usize {
                    let at = (g * capacity as usize + pos0 as usize) * hdu;
                    let ones = vec![1.0; hdu];
                    let tol = if dtype == WeightDType::F16 {
                        2e-3
                    } else {
                        1e-6
                    };
                    assert_close(
                        &format!("{what}: k cache"),
                        &cache_at(&inp.kb, g),
                        &inp.k[at..at + hdu],
                        &ones,
                        tol,
                        0.0,
                    );
                    assert_close(
                        &format!("{what}: v cache"),
                        &cache_at(&inp.vb, g),
                        &inp.v[at..at + hdu],
                        &ones,
                        tol,
                        0.0,
                    );
                }
            }
        }
    }
    assert!(
        merged_int8 > 0,
        "no product read the merged row as int8 blocks"
    );
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

/// Runs the sampler once over `logits` with the given history and settings.
fn sample_once(gpu: &Gpu, logits: &[f32], history: &[u32], params: &SamplerParams) -> u32 {
    sample_with(gpu, logits, history, params, None)
}

fn sample_with(
    gpu: &Gpu,
    logits: &[f32],
    history: &[u32],
    params: &SamplerParams,
    width: Option<u32>,
) -> u32 {
    sample_masked(gpu, logits, history, params, width, None)
}

/// Sampler widths the tests cover: the adapter's choice (64 lanes on a CPU adapter, 1024 where
/// GPUs allow it) and the 256 that GPUs with smaller workgroups take.
const SAMPLER_WIDTHS: [Option<u32>; 2] = [None, Some(256)];

fn sample_masked(
    gpu: &Gpu,
    logits: &[f32],
    history: &[u32],
    params: &SamplerParams,
    width: Option<u32>,
    mask: Option<&[u32]>,
) -> u32 {
    let vocab = logits.len() as u32;
    // Pad to whole vec4 words with values that would win if the padding were read.
    let mut padded = logits.to_vec();
    padded.resize(logits.len().div_ceil(4) * 4, 1e30);
    let lb = buf(gpu, &padded);
    let mut hist = history.to_vec();
    hist.push(0);
    let hb = gpu.storage_from("history", &hist).expect("history");
    let mut bits = vec![0u32; vocab.div_ceil(32) as usize];
    for &id in history {
        bits[id as usize / 32] |= 1 << (id % 32);
    }
    let seen = gpu.storage_from("seen", &bits).expect("seen");
    let st = step(gpu, 0, history.len() as u32);
    let op = Sample::with_width(gpu, vocab, &lb, &hb, &seen, &st, width).expect("sample");
    op.set(gpu, params);
    op.set_mask(gpu, mask);
    let mut rec = Recorder::new(gpu);
    op.encode(&mut rec);
    rec.submit();
    let out: Vec<u32> = gpu.read(&hb.buffer, history.len() as u64, 1).expect("read");
    out[0]
}

/// A grammar's mask: greedy picks the best allowed token (after the repetition penalty) as a
/// CPU argmax over the allowed ones does, and draws with temperature, top-k and top-p only
/// ever land on allowed tokens; awkward vocabularies (not whole vec4 or mask words) and a mask
/// shorter than the vocabulary (the rest forbidden).
#[test]
fn masked_sampling_keeps_to_the_allowed_tokens() {
    let gpu = gpu();
    let mut rng = common::Rng::new(61);
    for vocab in [7usize, 1003, 4099] {
        let logits = rng.vec(vocab, 4.0);
        let words = vocab.div_ceil(32);
        let mut mask = vec![0u32; words];
        for id in 0..vocab {
            if rng.below(10) == 0 {
                mask[id / 32] |= 1 << (id % 32);
            }
        }
        mask[0] |= 1 << 3;
        // The last word left out: its tokens are forbidden.
        let given = if words > 1 {
            &mask[..words - 1]
        } else {
            &mask[..]
        };
        let allowed = |id: usize| id / 32 < given.len() && given[id / 32] & (1 << (id % 32)) != 0;
        let history = [1u32, (vocab as u32) / 2];
        for width in SAMPLER_WIDTHS {
            for penalty in [1.0f32, 1.3] {
                let params = SamplerParams {
                    repeat_penalty: penalty,
                    ..Default::default()
                };
                let penalized = |id: usize| {
                    let l = logits[id];
                    if history.contains(&(id as u32)) && penalty != 1.0 {
                        if l > 0.0 { l / penalty } else { l * penalty }
                    } else {
                        l
                    }
                };
                let want = (0..vocab)
                    .filter(|&id| allowed(id))
                    .fold(None, |best: Option<usize>, id| match best {
                        Some(b) if penalized(b) >= penalized(id) => Some(b),
                        _ => Some(id),
                    })
                    .expect("an allowed token");
                let got = sample_masked(&gpu, &logits, &history, &params, width, Some(given));
                assert_eq!(
                    got as usize, want,
                    "vocab {vocab}, width {width:?}, penalty {penalty}"
                );
            }
            for seed in 0..6u64 {
                let params = SamplerParams {
                    temperature: 1.2,
                    top_k: 5,
                    top_p: 0.9,
                    seed,
                    ..Default::default()
                };
                let got = sample_masked(&gpu, &logits, &history, &params, width, Some(given));
                assert!(allowed(got as usize), "vocab {vocab}: drew forbidden {got}");
                let plain = SamplerParams {
                    temperature: 1.0,
                    seed,
                    ..Default::default()
                };
                let got = sample_masked(&gpu, &logits, &history, &plain, width, Some(given));
                assert!(allowed(got as usize), "vocab {vocab}: drew forbidden {got}");
            }
        }
    }
}

#[test]
fn greedy_sampling_is_argmax_with_lowest_index_on_ties() {
    let gpu = gpu();
    let mut rng = Rng::new(8);
    for width in SAMPLER_WIDTHS {
        for &vocab in &[1usize, 7, 1000, 50_257] {
            let mut logits = rng.vec(vocab, 5.0);
            let top = rng.below(vocab as u32) as usize;
            logits[top] = 10.0;
            if vocab > 10 {
                // A tie later in the vocabulary must lose.
                logits[vocab - 1] = 10.0;
            }
            assert_eq!(
                sample_with(&gpu, &logits, &[0], &SamplerParams::default(), width),
                top as u32,
                "vocab {vocab}, width {width:?}"
            );
        }
    }
}

#[test]
fn repetition_penalty_follows_transformers() {
    let gpu = gpu();
    // Token 2 leads but was seen; with penalty 2 its logit 3.0 → 1.5 < 2.0 of token 1.
    // Token 0 is negative and seen: −1 → −2 (multiplied, not divided).
    let logits = [-1.0, 2.0, 3.0, 0.5];
    let params = SamplerParams {
        repeat_penalty: 2.0,
        ..Default::default()
    };
    assert_eq!(sample_once(&gpu, &logits, &[2, 0, 2], &params), 1);
    assert_eq!(sample_once(&gpu, &logits, &[3], &params), 2);
}

fn softmax(l: &[f32], t: f32) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = l.iter().map(|v| f64::from((v - m) / t).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|v| v / z).collect()
}

#[test]
fn sampling_follows_the_filtered_distribution() {
    let gpu = gpu();
    let logits = [1.0f32, 2.0, 0.5, 3.0, -1.0, 2.5, 0.0];
    let draws = 300u64;
    let count = |params: SamplerParams| -> Vec<u32> {
        let mut counts = vec![0u32; logits.len()];
        for s in 0..draws {
            let p = SamplerParams {
                seed: s * 7919 + 1,
                ..params
            };
            counts[sample_once(&gpu, &logits, &[6], &p) as usize] += 1;
        }
        counts
    };
    // Plain temperature sampling: frequencies within 5 standard errors of softmax(l / T).
    let t = 1.5;
    let counts = count(SamplerParams {
        temperature: t,
        ..Default::default()
    });
    let probs = softmax(&logits, t);
    for (i, (&c, &p)) in counts.iter().zip(&probs).enumerate() {
        let n = draws as f64;
        let sd = (n * p * (1.0 - p)).sqrt().max(1.0);
        assert!(
            (f64::from(c) - n * p).abs() <= 5.0 * sd,
            "token {i}: {c} draws, expected {:.1} ± {:.1}",
            n * p,
            sd
        );
    }
    // Top-k 3 keeps only tokens 3, 5, 1.
    let counts = count(SamplerParams {
        temperature: 1.0,
        top_k: 3,
        ..Default::default()
    });
    for (i, &c) in counts.iter().enumerate() {
        assert_eq!(c > 0, [1, 3, 5].contains(&i), "top-k token {i}: {c}");
    }
    // Top-p 0.5: at T=1 token 3 has 0.44 and token 5 0.27 of the mass: the nucleus is {3, 5}.
    let counts = count(SamplerParams {
        temperature: 1.0,
        top_p: 0.5,
        ..Default::default()
    });
    for (i, &c) in counts.iter().enumerate() {
        assert_eq!(c > 0, [3, 5].contains(&i), "top-p token {i}: {c}");
    }
    // Top-k 3 then top-p 0.6: the top three hold 0.51, 0.31, 0.19 of their mass: {3, 5}.
    let counts = count(SamplerParams {
        temperature: 1.0,
        top_k: 3,
        top_p: 0.6,
        ..Default::default()
    });
    for (i, &c) in counts.iter().enumerate() {
        assert_eq!(c > 0, [3, 5].contains(&i), "top-k + top-p token {i}: {c}");
    }
    // The same seed gives the same token.
    let p = SamplerParams {
        temperature: 1.0,
        seed: 99,
        ..Default::default()
    };
    let first = sample_once(&gpu, &logits, &[6], &p);
    assert!((0..5).all(|_| sample_once(&gpu, &logits, &[6], &p) == first));
}

/// Near-flat distributions put more tokens near the maximum than the sampler keeps in
/// workgroup memory; thresholds then come from bisection over the whole vocabulary.
#[test]
fn sampling_with_many_near_ties_uses_exact_thresholds() {
    let gpu = gpu();
    for width in SAMPLER_WIDTHS {
        near_ties_use_exact_thresholds(&gpu, width);
    }
}

fn near_ties_use_exact_thresholds(gpu: &Gpu, width: Option<u32>) {
    let vocab = 3001usize;
    // Slowly decreasing logits: every token is within a few logits of the best.
    let logits: Vec<f32> = (0..vocab).map(|i| -(i as f32) * 0.001).collect();
    // Top-k 5: only the first five tokens can come out.
    for seed in 0..40u64 {
        let p = SamplerParams {
            temperature: 1.0,
            top_k: 5,
            seed,
            ..Default::default()
        };
        let t = sample_with(gpu, &logits, &[0], &p, width);
        assert!(t < 5, "top-k 5 gave token {t} (width {width:?})");
    }
    // Top-p 0.3: the smallest prefix holding 30% of the mass.
    let probs = softmax(&logits, 1.0);
    let mut cum = 0.0;
    let mut last = 0;
    for (i, p) in probs.iter().enumerate() {
        if cum >= 0.3 {
            break;
        }
        cum += p;
        last = i;
    }
    let mut highest = 0;
    for seed in 0..60u64 {
        let p = SamplerParams {
            temperature: 1.0,
            top_p: 0.3,
            seed,
            ..Default::default()
        };
        let t = sample_with(gpu, &logits, &[0], &p, width) as usize;
        assert!(
            t <= last,
            "top-p 0.3 gave token {t}, nucleus ends at {last}"
        );
        highest = highest.max(t);
    }
    assert!(
        highest > last / 2,
        "draws spread over the nucleus (highest {highest} of {last})"
    );
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

/// A batched decode step's attention: each row is a token of the sequence in its own cache
/// slot, at its own position, seeing only that slot's keys up to it. Every slot and position
/// holds values of its own, so a wrong slot or a key past the row's position shows. Awkward
/// sizes: heads of 12 (a lane a key), three slots of 37 rows, a row at position 0; and heads of
/// 32 (lanes scoring each key together) over 300 rows, more keys than a workgroup's chunk.
#[test]
fn batched_attention_reads_each_rows_slot_and_matches_cpu() {
    batched_attention_case(12, 37, &[(5, 2), (33, 0), (0, 1), (17, 2), (36, 1)], false);
    let long = [(5, 2), (290, 0), (0, 1), (257, 2), (299, 1)];
    batched_attention_case(32, 300, &long, false);
    // With a sink logit per head (GPT-OSS), which the merge of the runs adds.
    batched_attention_case(32, 300, &long, true);
}

/// (position, slot) per row in `rows`; two rows may share a slot.
fn batched_attention_case(hd: u32, capacity: u32, rows: &[(u32, u32)], with_sinks: bool) {
    let gpu = gpu();
    let mut rng = Rng::new(41);
    let (heads, kv_heads, slots) = (4u32, 2u32, 3u32);
    let hdu = hd as usize;
    let cap = capacity as usize;
    for dtype in DTYPES {
        let n = (slots * kv_heads * capacity * hd) as usize;
        let (kb, k) = upload_cache(&gpu, dtype, &rng.vec(n, 1.0));
        let (vb, v) = upload_cache(&gpu, dtype, &rng.vec(n, 1.0));
        let q = rng.vec(rows.len() * (heads * hd) as usize, 1.0);
        let qb = buf(&gpu, &q);
        let out = gpu.storage("out", q.len() as u64 * 4).expect("out");
        let st = step(&gpu, 0, rows.len() as u32);
        let mut table = BatchRows {
            rows: [[0; 4]; MAX_BATCH_ROWS as usize],
        };
        for (t, &(pos, slot)) in rows.iter().enumerate() {
            table.rows[t] = [pos, slot, 0, 0];
        }
        let table = gpu.uniform("rows", &table);
        let mut shape = CacheShape::new(heads, kv_heads, hd, capacity, dtype);
        shape.slots = slots;
        let sinks: Vec<f32> = (0..heads).map(|h| 0.5 * h as f32 - 0.3).collect();
        let sinks_buffer = with_sinks.then(|| buf(&gpu, &sinks));
        let io = [&qb, &kb, &vb, &out];
        let op = Attention::batched(&gpu, shape, io, sinks_buffer.as_ref(), &st, &table)
            .expect("batched attention");
        // A workgroup per row and head, then (where the longest row's keys make more than
        // one run) runs of keys merged.
        let n = rows.len() as u32;
        let longest = rows.iter().map(|r| r.0 + 1).max().unwrap_or(1);
        let mut outputs = Vec::new();
        for runs in [false, true] {
            let mut rec = Recorder::new(&gpu);
            if runs {
                op.encode_batch(&mut rec, n, longest);
            } else {
                op.encode(&mut rec, 0, n);
            }
            rec.submit();
            outputs.push((runs, read(&gpu, &out, q.len())));
        }
        let scale = 1.0 / f64::from(hd).sqrt();
        let mut want = Vec::with_capacity(q.len());
        for (t, &(pos, slot)) in rows.iter().enumerate() {
            for h in 0..heads as usize {
                let g = h / (heads / kv_heads) as usize;
                let base = (slot as usize * kv_heads as usize + g) * cap;
                let qrow = &q[(t * heads as usize + h) * hdu..][..hdu];
                let keys = pos as usize + 1;
                let scores: Vec<f64> = (0..keys)
                    .map(|j| {
                        let krow = &k[(base + j) * hdu..][..hdu];
                        qrow.iter()
                            .zip(krow)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sink = if with_sinks {
                    (f64::from(sinks[h]) - m).exp()
                } else {
                    0.0
                };
                let z: f64 = e.iter().sum::<f64>() + sink;
                for d in 0..hdu {
                    let o: f64 = (0..keys)
                        .map(|j| e[j] * f64::from(v[(base + j) * hdu + d]))
                        .sum::<f64>();
                    want.push((o / z) as f32);
                }
            }
        }
        let ones = vec![1.0; want.len()];
        for (runs, got) in &outputs {
            assert_close(
                &format!(
                    "batched attention {dtype:?}, heads of {hd}, runs {runs}, sinks {with_sinks}"
                ),
                got,
                &want,
                &ones,
                2e-5,
                0.0,
            );
        }
    }
}
