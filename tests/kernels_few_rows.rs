//! The few-row product (shaders/few_rows.wgsl) against a plain CPU reference: one to eight rows
//! of x and steps of several chunks of eight, output widths that are no multiple of the
//! workgroup's four weight rows, dense f32 and f16 weights and every block format, with a bias,
//! a residual, GELU, and a fused gate/up product's gating. The int8 form
//! (shaders/few_rows_int8.wgsl) is checked against the same reference on the rows as it
//! quantizes them, in one level and in two, over steps of more rows than one workgroup takes;
//! and fed by a norm that quantizes the rows itself (shaders/norm_int8.wgsl).

mod common;

use backpack_engine::gpu::{Gpu, Recorder, StorageBuffer};
use backpack_engine::load::GgmlType;
use backpack_engine::load::quant::{dequantize, random_blocks};
use backpack_engine::ops::{
    FEW_ROWS, FewRows, FewRowsInt8, Gelu, GluKind, Int8Rows, MatMulOptions, Matrix, NormInt8,
    NormKind, StepParams, WeightDType, int8_rounded_input,
};
use common::{Rng, assert_close, gpu, round_f16};

fn buf(gpu: &Gpu, data: &[f32]) -> StorageBuffer {
    gpu.storage_from("test", data).expect("buffer")
}

/// W as the GPU holds it, with its values on the host.
fn weights(gpu: &Gpu, rng: &mut Rng, form: Form, n: usize, k: usize) -> (Matrix, Vec<f32>) {
    match form {
        Form::Dense(dtype) => {
            let w = rng.vec(n * k, 1.0);
            let m = Matrix::from_f32(gpu, "w", &w, n as u32, k as u32, dtype).expect("w");
            let host = match dtype {
                WeightDType::F16 => round_f16(&w),
                WeightDType::F32 => w,
            };
            (m, host)
        }
        Form::Blocks(ty) => {
            let blocks = random_blocks(ty, n * k / ty.block_elems(), rng.below(1000));
            let mut host = vec![0.0; n * k];
            dequantize(ty, &blocks, &mut host);
            let m = Matrix::from_blocks(gpu, "w", ty, &blocks, n as u32, k as u32).expect("w");
            (m, host)
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Form {
    Dense(WeightDType),
    Blocks(GgmlType),
}

fn gelu_tanh(v: f32) -> f32 {
    let c = 0.797_884_6_f32;
    0.5 * v * (1.0 + (c * (v + 0.044_715 * v * v * v)).clamp(-15.0, 15.0).tanh())
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// Which kernel a check runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    Float,
    /// The int8 form, with the rounding remainders' second level or without.
    Int8 {
        fine: bool,
    },
}

/// A row as the int8 form with two levels sees it: each value's rounding remainder quantized
/// again at a 254th of its block's scale (quant_rows.wgsl).
fn int8_two_levels(x: &[f32]) -> Vec<f32> {
    x.chunks(32)
        .flat_map(|block| {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let (inv, inv2) = if amax > 0.0 {
                (127.0 / amax, 254.0 / d)
            } else {
                (0.0, 0.0)
            };
            block.iter().map(move |v| {
                let q = (v * inv).round_ties_even();
                let q2 = ((v - q * d) * inv2).round_ties_even().clamp(-127.0, 127.0);
                q * d + q2 * (d / 254.0)
            })
        })
        .collect()
}

/// Runs the product for `m` rows and checks it: plain (with bias, residual and GELU as
/// `variant` says) or gated.
fn check(gpu: &Gpu, rng: &mut Rng, form: Form, m: usize, n: usize, k: usize, variant: usize) {
    check_kernel(gpu, rng, Kernel::Float, form, (m, n, k), variant);
}

fn check_kernel(
    gpu: &Gpu,
    rng: &mut Rng,
    kernel: Kernel,
    form: Form,
    (m, n, k): (usize, usize, usize),
    variant: usize,
) {
    let glu = variant == 3;
    // A gated product's weights are its gate rows, then as many up rows.
    let n = if glu { 2 * n } else { n };
    let (w, host) = weights(gpu, rng, form, n, k);
    let x = rng.vec(m * k, 1.0);
    let bias = rng.vec(n, 1.0);
    let width = if glu { n / 2 } else { n };
    let before = rng.vec(m * width, 1.0);
    let (xb, bb, yb) = (buf(gpu, &x), buf(gpu, &bias), buf(gpu, &before));
    let step = gpu.uniform("step", &StepParams::new(0, m as u32));
    let opts = MatMulOptions {
        bias: (variant != 0).then_some(&bb),
        residual: variant == 1,
        gelu: (variant == 2).then_some(Gelu::Tanh),
        glu: glu.then_some(GluKind::Silu),
        ..Default::default()
    };
    let mut rec = Recorder::new(gpu);
    // The rows as the kernel multiplies them.
    let x = match kernel {
        Kernel::Float => {
            let op = FewRows::new(gpu, &w, &xb, &yb, &step, &opts)
                .expect("kernel")
                .expect("a shape the kernel takes");
            if m <= FEW_ROWS as usize {
                op.encode(&mut rec);
            } else {
                op.encode_rows(&mut rec, m as u32);
            }
            x
        }
        Kernel::Int8 { fine } => {
            let rows = Int8Rows::new(gpu, m as u32, k as u32).expect("rows");
            let op = FewRowsInt8::new(gpu, &w, &xb, &yb, &step, &opts, &rows, fine)
                .expect("kernel")
                .expect("a shape the kernel takes");
            assert!(op.takes(m as u32) && !op.takes(m as u32 + 1));
            op.encode(&mut rec, m as u32);
            if fine {
                int8_two_levels(&x)
            } else {
                int8_rounded_input(&x)
            }
        }
    };
    rec.submit();
    let got: Vec<f32> = gpu.read(&yb.buffer, 0, (m * width) as u64).expect("read");
    let dot = |r: usize, c: usize| -> (f32, f32) {
        let (mut s, mut mag) = (0.0f64, 0.0f64);
        for j in 0..k {
            let p = f64::from(host[c * k + j]) * f64::from(x[r * k + j]);
            s += p;
            mag += p.abs();
        }
        (s as f32, mag as f32)
    };
    let (mut want, mut scale) = (Vec::new(), Vec::new());
    for r in 0..m {
        for c in 0..width {
            let b = |i: usize| if variant != 0 { bias[i] } else { 0.0 };
            if glu {
                let ((g, gm), (u, um)) = (dot(r, c), dot(r, width + c));
                let (g, u) = (g + b(c), u + b(width + c));
                want.push(silu(g) * u);
                scale.push(u.abs() * gm + silu(g).abs() * um + 1.0);
            } else {
                let (mut v, mag) = dot(r, c);
                v += b(c);
                if variant == 2 {
                    v = gelu_tanh(v);
                }
                if variant == 1 {
                    v += before[r * width + c];
                }
                want.push(v);
                scale.push(mag + 1.0);
            }
        }
    }
    assert_close(
        &format!("few rows {kernel:?} {form:?} m={m} n={n} k={k} variant={variant}"),
        &got,
        &want,
        &scale,
        1e-5,
        2e-5,
    );
}

#[test]
fn few_row_products_match_cpu_for_dense_weights() {
    let gpu = gpu();
    let mut rng = Rng::new(41);
    for dtype in [WeightDType::F32, WeightDType::F16] {
        for (i, &(m, n, k)) in [
            (1, 37, 200),
            (3, 18, 64),
            (FEW_ROWS as usize, 130, 520),
            (5, 40, 8),
            // Two chunks of rows and part of a third.
            (19, 21, 96),
        ]
        .iter()
        .enumerate()
        {
            for variant in 0..4 {
                check(
                    &gpu,
                    &mut rng,
                    Form::Dense(dtype),
                    m,
                    n,
                    k,
                    (variant + i) % 4,
                );
            }
        }
    }
}

#[test]
fn few_row_products_match_cpu_for_block_formats() {
    let gpu = gpu();
    let mut rng = Rng::new(42);
    for (i, ty) in [
        GgmlType::Mxfp4,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ]
    .into_iter()
    .enumerate()
    {
        for (j, &(m, n, k)) in [(2, 37, 256), (FEW_ROWS as usize, 22, 512)]
            .iter()
            .enumerate()
        {
            check(&gpu, &mut rng, Form::Blocks(ty), m, n, k, (i + j) % 4);
        }
    }
}

#[test]
fn int8_few_row_products_match_cpu_on_the_rows_as_quantized() {
    let gpu = gpu();
    // Lane groups side by side reduce through subgroups, or through workgroup memory without.
    let plain = gpu.without_subgroups();
    let mut rng = Rng::new(44);
    for (i, ty) in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ]
    .into_iter()
    .enumerate()
    {
        // One row; a chunk and a part of the next (eight rows a workgroup); rows of 1,024
        // values, whose 16 pairs or 32 sub-blocks leave most of 64 lanes idle; rows of 4,096
        // values over few weight rows, which take 64 lanes a weight group.
        for (j, &(m, n, k)) in [(1, 37, 256), (11, 22, 512), (3, 9, 1024), (2, 5, 4096)]
            .iter()
            .enumerate()
        {
            let fine = (i + j) % 3 == 0;
            let kernel = Kernel::Int8 { fine };
            check_kernel(
                if (i + j) % 2 == 0 { &gpu } else { &plain },
                &mut rng,
                kernel,
                Form::Blocks(ty),
                (m, n, k),
                (i + j) % 4,
            );
        }
    }
}

#[test]
fn formats_without_int8_products_are_left_to_the_float_kernel() {
    let gpu = gpu();
    let mut rng = Rng::new(45);
    let rows = Int8Rows::new(&gpu, 4, 256).expect("rows");
    let (x, y) = (buf(&gpu, &[0.0; 4 * 256]), buf(&gpu, &[0.0; 4 * 8]));
    let step = gpu.uniform("step", &StepParams::new(0, 4));
    for (ty, cols, takes) in [
        (GgmlType::Q5_0, 256, false),
        (GgmlType::Mxfp4, 256, false),
        (GgmlType::Q8_0, 512, false),
        (GgmlType::Q8_0, 256, true),
    ] {
        let (w, _) = weights(&gpu, &mut rng, Form::Blocks(ty), 8, cols);
        let op = FewRowsInt8::new(
            &gpu,
            &w,
            &x,
            &y,
            &step,
            &MatMulOptions::default(),
            &rows,
            false,
        )
        .expect("kernel");
        assert_eq!(op.is_some(), takes, "{ty:?} with {cols} columns");
    }
}

#[test]
fn shapes_the_kernel_does_not_take_are_left_to_the_tiles() {
    let gpu = gpu();
    let mut rng = Rng::new(43);
    let w = Matrix::from_f32(&gpu, "w", &rng.vec(4 * 12, 1.0), 4, 12, WeightDType::F32).expect("w");
    let (x, y) = (buf(&gpu, &[0.0; 12]), buf(&gpu, &[0.0; 4]));
    let step = gpu.uniform("step", &StepParams::new(0, 1));
    let none = FewRows::new(&gpu, &w, &x, &y, &step, &MatMulOptions::default()).expect("kernel");
    assert!(none.is_none(), "k = 12 is no multiple of 8");
}

/// The norm that quantizes its rows for the int8 product after it (shaders/norm_int8.wgsl):
/// its float rows against a CPU RMSNorm / LayerNorm, and the product it feeds, with the
/// quantize pass skipped, against the reference on those rows as quantized. Widths of one to
/// three blocks a lane, rows past one product workgroup's eight, sub-block pairs and single
/// sub-blocks, with subgroups and without.
#[test]
fn norms_that_quantize_their_rows_feed_the_int8_products() {
    let gpu = gpu();
    let plain = gpu.without_subgroups();
    let mut rng = Rng::new(46);
    for (i, &(ty, m, k, n, layer)) in [
        (GgmlType::Q4K, 3, 512, 9, false),
        (GgmlType::Q8_0, 11, 2112, 6, true),
        (GgmlType::Q6K, 1, 4352, 5, false),
        (GgmlType::Q4_0, 5, 96, 7, true),
    ]
    .iter()
    .enumerate()
    {
        let gpu = if i % 2 == 0 { &gpu } else { &plain };
        let what = format!("{ty:?} m={m} k={k} layer={layer}");
        let (w, host) = weights(gpu, &mut rng, Form::Blocks(ty), n, k);
        // Rows of varied size (a norm's input is no unit vector).
        let x: Vec<f32> = rng.vec(m * k, 1.0).iter().map(|v| v * 3.0 + 0.5).collect();
        let gain: Vec<f32> = rng.vec(k, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect();
        let bias = rng.vec(k, 0.2);
        let eps = 1e-5;
        let (xb, xnb, yb) = (
            buf(gpu, &x),
            buf(gpu, &vec![0.0; m * k]),
            buf(gpu, &vec![0.0; m * n]),
        );
        let (gb, bb) = (buf(gpu, &gain), buf(gpu, &bias));
        let step = gpu.uniform("step", &StepParams::new(0, m as u32));
        let rows = Int8Rows::new(gpu, m as u32, k as u32).expect("rows");
        let product = FewRowsInt8::new(
            gpu,
            &w,
            &xnb,
            &yb,
            &step,
            &MatMulOptions::default(),
            &rows,
            false,
        )
        .expect("kernel")
        .expect("a shape the kernel takes");
        let kind = if layer {
            NormKind::Layer
        } else {
            NormKind::Rms
        };
        let norm = NormInt8::new(
            gpu,
            kind,
            (k as u32, eps),
            (&gb, layer.then_some(&bb)),
            &xb,
            &xnb,
            &step,
            &rows,
            &product,
        )
        .expect("kernel")
        .expect("a norm for this product");
        let mut rec = Recorder::new(gpu);
        norm.encode(&mut rec, m as u32);
        product.encode_quantized(&mut rec, m as u32);
        rec.submit();

        let normed: Vec<f32> = gpu.read(&xnb.buffer, 0, (m * k) as u64).expect("read");
        let want: Vec<f32> = x
            .chunks(k)
            .flat_map(|row| {
                let mean = if layer {
                    row.iter().map(|&v| f64::from(v)).sum::<f64>() / k as f64
                } else {
                    0.0
                };
                let var = row
                    .iter()
                    .map(|&v| (f64::from(v) - mean).powi(2))
                    .sum::<f64>()
                    / k as f64;
                let inv = 1.0 / (var + f64::from(eps)).sqrt();
                row.iter()
                    .enumerate()
                    .map(|(j, &v)| {
                        let b = if layer { f64::from(bias[j]) } else { 0.0 };
                        ((f64::from(v) - mean) * inv * f64::from(gain[j]) + b) as f32
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let ones = vec![1.0; want.len()];
        assert_close(
            &format!("{what}: normed rows"),
            &normed,
            &want,
            &ones,
            1e-5,
            1e-5,
        );

        let got: Vec<f32> = gpu.read(&yb.buffer, 0, (m * n) as u64).expect("read");
        let quantized = int8_rounded_input(&normed);
        let (mut want, mut scale) = (Vec::new(), Vec::new());
        for r in 0..m {
            for c in 0..n {
                let (mut s, mut mag) = (0.0f64, 0.0f64);
                for j in 0..k {
                    let p = f64::from(host[c * k + j]) * f64::from(quantized[r * k + j]);
                    s += p;
                    mag += p.abs();
                }
                want.push(s as f32);
                scale.push(mag as f32 + 1.0);
            }
        }
        assert_close(&format!("{what}: product"), &got, &want, &scale, 1e-5, 2e-5);
    }
    // A product reading two levels (an LM head) quantizes its rows itself.
    let (w, _) = weights(&gpu, &mut rng, Form::Blocks(GgmlType::Q8_0), 4, 64);
    let (x, y) = (buf(&gpu, &[0.0; 64]), buf(&gpu, &[0.0; 4]));
    let step = gpu.uniform("step", &StepParams::new(0, 1));
    let rows = Int8Rows::new(&gpu, 1, 64).expect("rows");
    let opts = MatMulOptions::default();
    let head = FewRowsInt8::new(&gpu, &w, &x, &y, &step, &opts, &rows, true)
        .expect("kernel")
        .expect("a shape the kernel takes");
    let gain = buf(&gpu, &[1.0; 64]);
    let fused = NormInt8::new(
        &gpu,
        NormKind::Rms,
        (64, 1e-5),
        (&gain, None),
        &x,
        &x,
        &step,
        &rows,
        &head,
    )
    .expect("kernel");
    assert!(fused.is_none(), "two levels");
}
