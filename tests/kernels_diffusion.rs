//! The image-generation kernels against plain CPU references on random inputs of awkward
//! sizes: 2-D convolution as an implicit product (strides, padding, fused upsampling, bias,
//! residual), GroupNorm (+SiLU), GEGLU, CLIP's quick GELU, causal attention, the channel
//! plumbing (SiLU, concat, transpose, softmax, affine, slice, tanh clamp), the denoising
//! update and the preview.

mod common;

use backpack_engine::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use backpack_engine::ops::*;
use common::{Rng, assert_close, attention_atol, coop_tiles, gpu, product_gpus, round_f16};

fn step(gpu: &Gpu, n: u32) -> UniformBuffer {
    gpu.uniform("step", &StepParams::new(0, n))
}

fn buf(gpu: &Gpu, data: &[f32]) -> StorageBuffer {
    gpu.storage_from("test", data).expect("buffer")
}

fn zeros(gpu: &Gpu, n: usize) -> StorageBuffer {
    gpu.storage("test", (n.max(1) * 4) as u64).expect("buffer")
}

fn read(gpu: &Gpu, b: &StorageBuffer, n: usize) -> Vec<f32> {
    gpu.read(&b.buffer, 0, n as u64).expect("read back")
}

fn ones(n: usize) -> Vec<f32> {
    vec![1.0; n]
}

/// PyTorch's Conv2d on a channel-last input (after a nearest 2× upsampling when `up`), with
/// the output size `out_h`×`out_w` and zeros read past every edge.
#[allow(clippy::too_many_arguments)]
fn conv2d_ref(
    x: &[f32],
    (h, w, cin): (usize, usize, usize),
    weight: &[f32],
    bias: &[f32],
    (cout, k, stride, pad): (usize, usize, usize, usize),
    up: bool,
    (out_h, out_w): (usize, usize),
) -> Vec<f32> {
    let (uh, uw) = if up { (2 * h, 2 * w) } else { (h, w) };
    let mut y = vec![0.0; out_h * out_w * cout];
    for oy in 0..out_h {
        for ox in 0..out_w {
            for o in 0..cout {
                let mut s = f64::from(bias[o]);
                for ky in 0..k {
                    for kx in 0..k {
                        let iy = (oy * stride + ky) as isize - pad as isize;
                        let ix = (ox * stride + kx) as isize - pad as isize;
                        if iy < 0 || ix < 0 || iy >= uh as isize || ix >= uw as isize {
                            continue;
                        }
                        let (sy, sx) = if up {
                            (iy as usize / 2, ix as usize / 2)
                        } else {
                            (iy as usize, ix as usize)
                        };
                        for c in 0..cin {
                            s += f64::from(weight[((o * cin + c) * k + ky) * k + kx])
                                * f64::from(x[(sy * w + sx) * cin + c]);
                        }
                    }
                }
                y[(oy * out_w + ox) * cout + o] = s as f32;
            }
        }
    }
    y
}

/// A `[out][in][k][k]` convolution weight as the kernel's matrix: taps outermost, channels
/// innermost in each row.
fn conv_matrix(
    gpu: &Gpu,
    weight: &[f32],
    (cout, cin, k): (usize, usize, usize),
    dtype: WeightDType,
) -> Matrix {
    let taps = k * k;
    let permuted: Vec<f32> = (0..cout * taps * cin)
        .map(|i| {
            let (o, rest) = (i / (taps * cin), i % (taps * cin));
            let (t, c) = (rest / cin, rest % cin);
            weight[(o * cin + c) * taps + t]
        })
        .collect();
    Matrix::from_f32(gpu, "w", &permuted, cout as u32, (taps * cin) as u32, dtype).expect("matrix")
}

#[test]
fn convolution_matches_cpu() {
    for gpu in product_gpus() {
        convolution_parity(&gpu);
    }
}

/// Inputs and weights are f16 values, so the reference holds for the tensor-core tiles (which
/// round them to f16) as well as the SIMT ones.
fn convolution_parity(gpu: &Gpu) {
    let gpu = gpu.clone();
    let mut rng = Rng::new(21);
    // (h, w, cin, cout, k, stride, pad, upsample, asymmetric stride-2 output)
    let cases = [
        (5, 7, 3, 10, 3, 1, 1, false, false),
        (9, 6, 13, 8, 3, 2, 1, false, false),
        (4, 5, 6, 7, 3, 1, 1, true, false),
        (8, 6, 5, 9, 3, 2, 0, false, true),
        (3, 11, 17, 70, 3, 1, 1, false, false),
        (6, 6, 4, 5, 1, 1, 0, true, false),
        (17, 13, 16, 140, 3, 1, 1, false, false),
        (12, 10, 24, 130, 3, 1, 1, true, false),
        // 640 outputs: the 128-wide tensor-core tile.
        (5, 6, 16, 640, 3, 1, 1, false, false),
        // Channels in eights read eight at a time on tensor cores: stride 2 with an
        // asymmetric output, and a 1×1 convolution.
        (9, 7, 32, 24, 3, 2, 1, false, true),
        (7, 5, 16, 12, 1, 1, 0, false, false),
    ];
    for (case, (h, w, cin, cout, k, stride, pad, up, asym)) in cases.into_iter().enumerate() {
        // Both tile sizes, f32 and f16 weights (the f16 reference uses the rounded weights).
        let big = case % 2 == 1;
        let dtype = if case % 3 == 0 {
            WeightDType::F16
        } else {
            WeightDType::F32
        };
        let x = round_f16(&rng.vec(h * w * cin, 1.0));
        let weight = round_f16(&rng.vec(cout * cin * k * k, 0.5));
        let bias = rng.vec(cout, 0.3);
        let mut shape = Conv2dShape::new(
            h as u32,
            w as u32,
            cin as u32,
            k as u32,
            stride as u32,
            pad as u32,
            up,
        );
        let (out_h, out_w) = if asym {
            shape.out_w = (w as u32).div_ceil(2);
            ((h as u32).div_ceil(2), shape.out_w)
        } else {
            (shape.out_h(), shape.out_w)
        };
        let want = conv2d_ref(
            &x,
            (h, w, cin),
            &weight,
            &bias,
            (cout, k, stride, pad),
            up,
            (out_h as usize, out_w as usize),
        );
        let m = conv_matrix(&gpu, &weight, (cout, cin, k), dtype);
        let rows = (out_h * out_w) as usize;
        let residual = rng.vec(rows * cout, 1.0);
        let want: Vec<f32> = want.iter().zip(&residual).map(|(a, b)| a + b).collect();
        // A CPU adapter's own tiles and the GPUs' SIMT ones, each forced there.
        // On tensor cores, every tile layout the adapter can take.
        let tile_modes: Vec<(Option<bool>, Option<CoopTile>)> = if gpu.is_software() {
            vec![(Some(true), None), (Some(false), None)]
        } else {
            coop_tiles(&gpu).into_iter().map(|t| (None, t)).collect()
        };
        for &(cpu_tiles, coop_tile) in &tile_modes {
            let xb = buf(&gpu, &x);
            let bb = buf(&gpu, &bias);
            let yb = buf(&gpu, &residual);
            let st = step(&gpu, rows as u32);
            let mm = MatMul::new(
                &gpu,
                &m,
                &xb,
                &yb,
                &st,
                MatMulOptions {
                    bias: Some(&bb),
                    residual: true,
                    conv: Some(shape),
                    big_tiles: Some(big),
                    cpu_tiles,
                    coop_tile,
                    ..Default::default()
                },
            )
            .expect("conv");
            let mut rec = Recorder::new(&gpu);
            mm.encode(&mut rec, rows as u32);
            rec.submit();
            let got = read(&gpu, &yb, rows * cout);
            let what = format!(
                "conv {h}×{w}×{cin}→{cout} k{k} s{stride} p{pad} up={up} big={big} cpu_tiles={cpu_tiles:?} coop_tile={coop_tile:?} {dtype:?} tensor_cores={}",
                mm.uses_tensor_cores()
            );
            assert_close(&what, &got, &want, &ones(want.len()), 1e-4, 1e-4);
        }
    }
}

/// (mean, 1/σ) of each group of a channel-last `[pixels][channels]` image.
fn group_stats(x: &[f32], channels: usize, groups: usize) -> Vec<(f64, f64)> {
    let cpg = channels / groups;
    let pixels = x.len() / channels;
    (0..groups)
        .map(|g| {
            let vals: Vec<f64> = (0..pixels)
                .flat_map(|p| (0..cpg).map(move |c| p * channels + g * cpg + c))
                .map(|i| f64::from(x[i]))
                .collect();
            let mean = vals.iter().sum::<f64>() / vals.len() as f64;
            let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64;
            (mean, 1.0 / (var + 1e-5).sqrt())
        })
        .collect()
}

/// A GroupNorm folded into each channel's affine map (every adapter), and, where the
/// convolution can take it, applied with SiLU as a 3×3 convolution loads its input.
#[test]
fn group_norm_folds_into_a_convolution() {
    let gpu = gpu();
    let mut rng = Rng::new(29);
    // (h, w, cin, groups, cout, upsample)
    for (h, w, cin, groups, cout, up) in [
        (9, 7, 16, 4, 24, false),
        (5, 6, 32, 8, 40, true),
        (12, 3, 24, 3, 8, false),
    ] {
        let x: Vec<f32> = rng.vec(h * w * cin, 2.0).iter().map(|v| v + 1.0).collect();
        let gamma = rng.vec(cin, 1.0);
        let beta = rng.vec(cin, 0.5);
        let stats = group_stats(&x, cin, groups);
        let want_maps: Vec<f32> = (0..2 * cin)
            .map(|i| {
                let c = i % cin;
                let (mean, rstd) = stats[c / (cin / groups)];
                let scale = rstd * f64::from(gamma[c]);
                let v = if i < cin {
                    scale
                } else {
                    f64::from(beta[c]) - mean * scale
                };
                v as f32
            })
            .collect();
        let (xb, gb, bb, folded) = (
            buf(&gpu, &x),
            buf(&gpu, &gamma),
            buf(&gpu, &beta),
            zeros(&gpu, 2 * cin),
        );
        let shape = GroupNormShape {
            pixels: (h * w) as u32,
            channels: cin as u32,
            groups: groups as u32,
            eps: 1e-5,
            activation: NormActivation::Silu,
        };
        let fold = GroupNorm::folded(&gpu, shape, &gb, &bb, &xb, &folded).expect("fold");
        let mut rec = Recorder::new(&gpu);
        fold.encode(&mut rec);
        rec.submit();
        let what = format!("group norm {h}×{w}×{cin}/{groups} folded");
        let got = read(&gpu, &folded, 2 * cin);
        assert_close(&what, &got, &want_maps, &ones(2 * cin), 1e-4, 1e-4);
        if !MatMul::folds_input_norm(&gpu, cin as u32) {
            continue;
        }
        // The convolution over SiLU(GroupNorm(x)), staged as f16 on tensor cores.
        let normed: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let c = i % cin;
                let a = f64::from(v) * f64::from(want_maps[c]) + f64::from(want_maps[cin + c]);
                (a / (1.0 + (-a).exp())) as f32
            })
            .collect();
        let weight = round_f16(&rng.vec(cout * cin * 9, 0.5));
        let bias = rng.vec(cout, 0.3);
        let want = conv2d_ref(
            &round_f16(&normed),
            (h, w, cin),
            &weight,
            &bias,
            (cout, 3, 1, 1),
            up,
            (h << usize::from(up), w << usize::from(up)),
        );
        let m = conv_matrix(&gpu, &weight, (cout, cin, 3), WeightDType::F16);
        let conv = Conv2dShape::new(h as u32, w as u32, cin as u32, 3, 1, 1, up);
        let rows = (conv.out_h() * conv.out_w) as usize;
        let (bb, yb) = (buf(&gpu, &bias), zeros(&gpu, rows * cout));
        let mm = MatMul::new(
            &gpu,
            &m,
            &xb,
            &yb,
            &step(&gpu, rows as u32),
            MatMulOptions {
                bias: Some(&bb),
                conv: Some(conv),
                input_norm: Some(&folded),
                ..Default::default()
            },
        )
        .expect("conv with a folded norm");
        let mut rec = Recorder::new(&gpu);
        mm.encode(&mut rec, rows as u32);
        rec.submit();
        // An input rounding to the other f16 neighbour moves an output by about 1e-3.
        let got = read(&gpu, &yb, rows * cout);
        assert_close(
            &format!("{what}, conv→{cout} up={up}"),
            &got,
            &want,
            &ones(want.len()),
            3e-3,
            1e-3,
        );
    }
}

#[test]
fn big_tile_product_matches_cpu() {
    for gpu in product_gpus() {
        big_tile_parity(&gpu);
    }
}

fn big_tile_parity(gpu: &Gpu) {
    let gpu = gpu.clone();
    let mut rng = Rng::new(27);
    // Rows and outputs that leave partial 128-wide tiles; k not a multiple of the 16-wide step.
    for (rows, n, k, dtype) in [
        (300usize, 200usize, 52usize, WeightDType::F32),
        (131, 129, 40, WeightDType::F16),
    ] {
        let x = round_f16(&rng.vec(rows * k, 1.0));
        let w = round_f16(&rng.vec(n * k, 1.0));
        let bias = rng.vec(n, 0.5);
        let m = Matrix::from_f32(&gpu, "w", &w, n as u32, k as u32, dtype).expect("matrix");
        let (xb, bb, yb) = (buf(&gpu, &x), buf(&gpu, &bias), zeros(&gpu, rows * n));
        let st = step(&gpu, rows as u32);
        let mm = MatMul::new(
            &gpu,
            &m,
            &xb,
            &yb,
            &st,
            MatMulOptions {
                bias: Some(&bb),
                gelu: Some(Gelu::Erf),
                big_tiles: Some(true),
                cpu_tiles: Some(false),
                ..Default::default()
            },
        )
        .expect("matmul");
        let mut rec = Recorder::new(&gpu);
        mm.encode(&mut rec, rows as u32);
        rec.submit();
        let want: Vec<f32> = (0..rows * n)
            .map(|i| {
                let (r, o) = (i / n, i % n);
                let s: f64 = f64::from(bias[o])
                    + (0..k)
                        .map(|j| f64::from(x[r * k + j]) * f64::from(w[o * k + j]))
                        .sum::<f64>();
                (0.5 * s * (1.0 + erf(s / std::f64::consts::SQRT_2))) as f32
            })
            .collect();
        let what = format!("big-tile product {rows}×{n}×{k} {dtype:?}");
        assert_close(
            &what,
            &read(&gpu, &yb, rows * n),
            &want,
            &ones(want.len()),
            2e-4,
            2e-4,
        );
    }
}

#[test]
fn group_norm_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(22);
    for (pixels, channels, groups, activation) in [
        (37, 24, 8, NormActivation::Silu),
        (1000, 12, 3, NormActivation::None),
        (5000, 64, 32, NormActivation::Silu),
        (1, 6, 2, NormActivation::None),
        (293, 256, 4, NormActivation::Relu),
    ] {
        let x: Vec<f32> = rng
            .vec(pixels * channels, 2.0)
            .iter()
            .map(|v| v + 3.0)
            .collect();
        let gamma = rng.vec(channels, 1.0);
        let beta = rng.vec(channels, 0.5);
        let cpg = channels / groups;
        let mut want = vec![0.0; x.len()];
        for (g, (mean, rstd)) in group_stats(&x, channels, groups).into_iter().enumerate() {
            for p in 0..pixels {
                for c in g * cpg..(g + 1) * cpg {
                    let i = p * channels + c;
                    let mut v =
                        (f64::from(x[i]) - mean) * rstd * f64::from(gamma[c]) + f64::from(beta[c]);
                    match activation {
                        NormActivation::Silu => v /= 1.0 + (-v).exp(),
                        NormActivation::Relu => v = v.max(0.0),
                        NormActivation::None => {}
                    }
                    want[i] = v as f32;
                }
            }
        }
        let (xb, gb, bb, yb) = (
            buf(&gpu, &x),
            buf(&gpu, &gamma),
            buf(&gpu, &beta),
            zeros(&gpu, x.len()),
        );
        let shape = GroupNormShape {
            pixels: pixels as u32,
            channels: channels as u32,
            groups: groups as u32,
            eps: 1e-5,
            activation,
        };
        let norm = GroupNorm::new(&gpu, shape, &gb, &bb, &xb, &yb).expect("group norm");
        let mut rec = Recorder::new(&gpu);
        norm.encode(&mut rec);
        rec.submit();
        let got = read(&gpu, &yb, x.len());
        assert_close(
            &format!("group norm {pixels}×{channels}/{groups}"),
            &got,
            &want,
            &ones(want.len()),
            2e-4,
            2e-4,
        );
    }
    assert!(
        GroupNorm::new(
            &gpu,
            GroupNormShape {
                pixels: 4,
                channels: 10,
                groups: 4,
                eps: 1e-5,
                activation: NormActivation::None,
            },
            &zeros(&gpu, 10),
            &zeros(&gpu, 10),
            &zeros(&gpu, 40),
            &zeros(&gpu, 40)
        )
        .is_err()
    );
}

#[test]
fn geglu_and_quick_gelu_match_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(23);
    let (rows, width) = (19usize, 45usize);
    let x = rng.vec(rows * 2 * width, 3.0);
    let want: Vec<f32> = (0..rows * width)
        .map(|i| {
            let (t, j) = (i / width, i % width);
            let u = f64::from(x[t * 2 * width + j]);
            let g = f64::from(x[t * 2 * width + width + j]);
            let gelu = 0.5 * g * (1.0 + erf(g / std::f64::consts::SQRT_2));
            (u * gelu) as f32
        })
        .collect();
    let (xb, yb) = (buf(&gpu, &x), zeros(&gpu, rows * width));
    let st = step(&gpu, rows as u32);
    let glu = Glu::new(&gpu, GluKind::GeluErf, width as u32, &xb, &yb, &st).expect("geglu");
    let mut rec = Recorder::new(&gpu);
    glu.encode(&mut rec, rows as u32);
    rec.submit();
    assert_close(
        "geglu",
        &read(&gpu, &yb, rows * width),
        &want,
        &ones(want.len()),
        1e-4,
        1e-4,
    );

    // quick_gelu in the product's epilogue.
    let (n, k) = (13usize, 21usize);
    // f16 values: the same reference holds on the tensor-core tiles.
    let xin = round_f16(&rng.vec(rows * k, 1.0));
    let w = round_f16(&rng.vec(n * k, 1.0));
    let m = Matrix::from_f32(&gpu, "w", &w, n as u32, k as u32, WeightDType::F32).expect("matrix");
    let (xb, yb) = (buf(&gpu, &xin), zeros(&gpu, rows * n));
    let mm = MatMul::new(
        &gpu,
        &m,
        &xb,
        &yb,
        &st,
        MatMulOptions {
            gelu: Some(Gelu::Quick),
            ..Default::default()
        },
    )
    .expect("matmul");
    let mut rec = Recorder::new(&gpu);
    mm.encode(&mut rec, rows as u32);
    rec.submit();
    let want: Vec<f32> = (0..rows * n)
        .map(|i| {
            let (r, o) = (i / n, i % n);
            let s: f64 = (0..k)
                .map(|j| f64::from(xin[r * k + j]) * f64::from(w[o * k + j]))
                .sum();
            (s / (1.0 + (-1.702 * s).exp())) as f32
        })
        .collect();
    assert_close(
        "quick gelu",
        &read(&gpu, &yb, rows * n),
        &want,
        &ones(want.len()),
        1e-4,
        1e-4,
    );
}

/// erf by its series / continued fraction is overkill here: Abramowitz–Stegun 7.1.26 in f64
/// is within 1.5e-7, far inside the tolerance.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
        + 0.254829592)
        * t;
    let y = 1.0 - poly * (-x * x).exp();
    if x >= 0.0 { y } else { -y }
}

#[test]
fn causal_attention_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(24);
    let (tokens, heads, hd) = (11usize, 3usize, 12usize);
    let d = heads * hd;
    let qkv = rng.vec(tokens * 3 * d, 1.0);
    let mut want = vec![0.0f32; tokens * d];
    for h in 0..heads {
        for t in 0..tokens {
            let q = &qkv[t * 3 * d + h * hd..][..hd];
            let scores: Vec<f64> = (0..=t)
                .map(|j| {
                    let k = &qkv[j * 3 * d + d + h * hd..][..hd];
                    q.iter()
                        .zip(k)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..hd {
                let v: f64 = (0..=t)
                    .map(|j| e[j] / z * f64::from(qkv[j * 3 * d + 2 * d + h * hd + i]))
                    .sum();
                want[t * d + h * hd + i] = v as f32;
            }
        }
    }
    let (qb, ob) = (buf(&gpu, &qkv), zeros(&gpu, tokens * d));
    let st = step(&gpu, tokens as u32);
    let layout = FullLayout {
        heads: heads as u32,
        kv_heads: heads as u32,
        head_dim: hd as u32,
        keys: tokens as u32,
        q_stride: 3 * d as u32,
        kv_stride: 3 * d as u32,
        k_off: d as u32,
        f16: false,
    };
    let att = FullAttention::with_mask(&gpu, layout, &qb, &qb, &ob, &st, true).expect("attention");
    for kernel in att.kernels() {
        let mut rec = Recorder::new(&gpu);
        rec.clear(&ob.buffer);
        att.encode_with(&mut rec, tokens as u32, kernel);
        rec.submit();
        assert_close(
            &format!("causal attention, {kernel:?}"),
            &read(&gpu, &ob, tokens * d),
            &want,
            &ones(want.len()),
            attention_atol(kernel, 1e-4),
            1e-4,
        );
    }
}

#[test]
fn channel_plumbing_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(25);
    let (rows, ca, cb) = (23usize, 5usize, 9usize);
    let a = rng.vec(rows * ca, 1.0);
    let b = rng.vec(rows * cb, 1.0);
    let (ab, bb) = (buf(&gpu, &a), buf(&gpu, &b));
    let cat = zeros(&gpu, rows * (ca + cb));
    let t_out = zeros(&gpu, ca * 24);
    let aff = zeros(&gpu, rows * ca);
    let sl = zeros(&gpu, rows * 3);
    let soft_data = rng.vec(rows * 300, 4.0);
    let soft = buf(&gpu, &soft_data);
    // Wide values for the activations: SiLU's tails and the clamp's saturation.
    let wide = rng.vec(97, 40.0);
    let wb = buf(&gpu, &wide);
    let (si, th) = (zeros(&gpu, wide.len()), zeros(&gpu, wide.len()));
    let passes = [
        silu(&gpu, wide.len() as u32, &wb, &si).expect("silu"),
        tanh_clamp(&gpu, wide.len() as u32, 3.0, &wb, &th).expect("tanh clamp"),
        concat(&gpu, rows as u32, (&ab, ca as u32), (&bb, cb as u32), &cat).expect("concat"),
        transpose(&gpu, rows as u32, ca as u32, 24, &ab, &t_out).expect("transpose"),
        affine(&gpu, (rows * ca) as u32, -2.5, 0.75, &ab, &aff).expect("affine"),
        slice_channels(&gpu, rows as u32, (1, 3), ca as u32, &ab, &sl).expect("slice"),
        softmax_rows(&gpu, rows as u32, 300, 0.5, &soft).expect("softmax"),
    ];
    let mut rec = Recorder::new(&gpu);
    for p in &passes {
        p.encode(&mut rec);
    }
    rec.submit();
    let want_cat: Vec<f32> = (0..rows)
        .flat_map(|r| {
            a[r * ca..(r + 1) * ca]
                .iter()
                .chain(&b[r * cb..(r + 1) * cb])
                .copied()
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(read(&gpu, &cat, want_cat.len()), want_cat, "concat");
    let got_t = read(&gpu, &t_out, ca * 24);
    for r in 0..rows {
        for c in 0..ca {
            assert_eq!(got_t[c * 24 + r], a[r * ca + c], "transpose ({r}, {c})");
        }
    }
    let want_aff: Vec<f32> = a.iter().map(|v| v * -2.5 + 0.75).collect();
    assert_close(
        "affine",
        &read(&gpu, &aff, a.len()),
        &want_aff,
        &ones(a.len()),
        1e-6,
        1e-6,
    );
    let want_sl: Vec<f32> = (0..rows)
        .flat_map(|r| a[r * ca + 1..r * ca + 4].to_vec())
        .collect();
    assert_eq!(read(&gpu, &sl, rows * 3), want_sl, "slice");
    let want_si: Vec<f32> = wide.iter().map(|v| v / (1.0 + (-v).exp())).collect();
    let want_th: Vec<f32> = wide.iter().map(|v| (v / 3.0).tanh() * 3.0).collect();
    let n = wide.len();
    assert_close("silu", &read(&gpu, &si, n), &want_si, &ones(n), 1e-5, 1e-5);
    assert_close(
        "tanh clamp",
        &read(&gpu, &th, n),
        &want_th,
        &ones(n),
        1e-5,
        1e-5,
    );
    let got_soft = read(&gpu, &soft, rows * 300);
    let mut want_soft = Vec::new();
    for r in 0..rows {
        let row = &soft_data[r * 300..(r + 1) * 300];
        let m = row
            .iter()
            .map(|v| f64::from(*v) * 0.5)
            .fold(f64::MIN, f64::max);
        let e: Vec<f64> = row
            .iter()
            .map(|v| (f64::from(*v) * 0.5 - m).exp())
            .collect();
        let z: f64 = e.iter().sum();
        want_soft.extend(e.iter().map(|v| (v / z) as f32));
    }
    assert_close(
        "softmax",
        &got_soft,
        &want_soft,
        &ones(want_soft.len()),
        1e-6,
        1e-4,
    );
}

#[test]
fn denoise_step_and_preview_match_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(26);
    let (w, h) = (9usize, 5usize);
    let n = w * h * 4;
    let x = rng.vec(n, 1.0);
    let cond = rng.vec(n, 1.0);
    let uncond = rng.vec(n, 1.0);
    let prev = rng.vec(n, 1.0);
    let noise = rng.vec(n, 1.0);
    let [xb, ob, ub, mib, db, pb, nb] = [
        &x,
        &cond,
        &uncond,
        &vec![0.0; n],
        &vec![0.0; n],
        &prev,
        &noise,
    ]
    .map(|v| buf(&gpu, v));
    let denoise = Denoise::new(
        &gpu,
        n as u32,
        &DenoiseBuffers {
            latents: &xb,
            model_out: &ob,
            uncond: &ub,
            model_in: &mib,
            denoised: &db,
            prev_denoised: &pb,
            noise: &nb,
        },
    )
    .expect("denoise");
    let p = DenoiseParams {
        n: n as u32,
        c_in: 0.3,
        guidance: 4.5,
        p: 1.1,
        q: -0.7,
        a: 0.2,
        b: 0.6,
        c: -0.25,
        d: 0.05,
        ..Default::default()
    };
    denoise.set(&gpu, &p);
    let texture = rgba_target(&gpu, w as u32, h as u32);
    let view = texture.create_view(&Default::default());
    let columns = [
        [0.5, -0.2, 0.1],
        [0.3, 0.4, -0.6],
        [-0.1, 0.2, 0.3],
        [0.25, -0.5, 0.7],
    ];
    let bias = [0.1, -0.05, 0.02];
    let preview = Preview::new(
        &gpu,
        &PreviewSource::Latent {
            rows: &columns,
            bias,
        },
        &db,
        &view,
        w as u32,
        h as u32,
    )
    .expect("preview");
    let mut rec = Recorder::new(&gpu);
    denoise.scale.encode(&mut rec);
    denoise.guide.encode(&mut rec);
    denoise.step.encode(&mut rec);
    preview.encode(&mut rec);
    rec.submit();
    let guided: Vec<f32> = (0..n)
        .map(|i| uncond[i] + 4.5 * (cond[i] - uncond[i]))
        .collect();
    let den: Vec<f32> = (0..n).map(|i| 1.1 * x[i] - 0.7 * guided[i]).collect();
    let new_x: Vec<f32> = (0..n)
        .map(|i| 0.2 * x[i] + 0.6 * den[i] - 0.25 * prev[i] + 0.05 * noise[i])
        .collect();
    let model_in: Vec<f32> = x.iter().map(|v| 0.3 * v).collect();
    let tol = |what: &str, got: Vec<f32>, want: &[f32]| {
        assert_close(what, &got, want, &ones(want.len()), 1e-5, 1e-5)
    };
    tol("model input", read(&gpu, &mib, n), &model_in);
    tol("guidance", read(&gpu, &ob, n), &guided);
    tol("denoised", read(&gpu, &db, n), &den);
    tol("previous denoised", read(&gpu, &pb, n), &den);
    tol("latents", read(&gpu, &xb, n), &new_x);

    // The texture, row by row (rows padded to 256 bytes for the copy).
    let staging = gpu.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256 * h as u64,
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
        mapped_at_creation: false,
    });
    let mut enc = gpu.device().create_command_encoder(&Default::default());
    enc.copy_texture_to_buffer(
        texture.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &staging,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(256),
                rows_per_image: None,
            },
        },
        wgpu::Extent3d {
            width: w as u32,
            height: h as u32,
            depth_or_array_layers: 1,
        },
    );
    gpu.queue().submit([enc.finish()]);
    let bytes: Vec<u8> = gpu.map_read(&staging, 256 * h as u64).expect("map");
    for y in 0..h {
        for xx in 0..w {
            let i = y * w + xx;
            for ch in 0..3 {
                let v: f32 =
                    (0..4).map(|k| den[i * 4 + k] * columns[k][ch]).sum::<f32>() + bias[ch];
                let want = ((v * 0.5 + 0.5).clamp(0.0, 1.0) * 255.0).round();
                let got = f32::from(bytes[y * 256 + xx * 4 + ch]);
                assert!(
                    (got - want).abs() <= 1.0,
                    "preview ({xx}, {y}) channel {ch}: {got} vs {want}"
                );
            }
            assert_eq!(bytes[y * 256 + xx * 4 + 3], 255);
        }
    }
}

/// The linear preview over latents of many channels (FLUX.2's 32): each pixel's RGB is the
/// channels through the map's rows plus its bias, mapped from −1..1 to bytes.
#[test]
fn linear_preview_of_many_channels_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(21);
    let (w, h, c) = (5usize, 3usize, 32usize);
    let latent = rng.vec(w * h * c, 1.5);
    let rows: Vec<[f32; 3]> = (0..c)
        .map(|_| {
            let r = rng.vec(3, 0.3);
            [r[0], r[1], r[2]]
        })
        .collect();
    let bias = [0.05, -0.1, 0.2];
    let texture = rgba_target(&gpu, w as u32, h as u32);
    let view = texture.create_view(&Default::default());
    let x = gpu.storage_from("latent", &latent).expect("buffer");
    let source = PreviewSource::Latent { rows: &rows, bias };
    let preview = Preview::new(&gpu, &source, &x, &view, w as u32, h as u32).expect("preview");
    let mut rec = Recorder::new(&gpu);
    preview.encode(&mut rec);
    rec.submit();
    let rgba = common::texture_rgba(&texture);
    for i in 0..w * h {
        for ch in 0..3 {
            let v: f32 = (0..c).map(|k| latent[i * c + k] * rows[k][ch]).sum::<f32>() + bias[ch];
            let want = ((v * 0.5 + 0.5).clamp(0.0, 1.0) * 255.0).round();
            let got = f32::from(rgba[i * 4 + ch]);
            assert!(
                (got - want).abs() <= 1.0,
                "pixel {i} channel {ch}: {got} vs {want}"
            );
        }
    }
}

/// An RGBA texture a preview pass can draw into and a test read back.
fn rgba_target(gpu: &Gpu, width: u32, height: u32) -> wgpu::Texture {
    gpu.device().create_texture(&wgpu::TextureDescriptor {
        label: None,
        size: wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba8Unorm,
        usage: wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::COPY_SRC,
        view_formats: &[],
    })
}
