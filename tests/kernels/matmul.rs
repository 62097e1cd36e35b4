//! The prompt product (tiled, on tensor cores where the adapter has them) against a plain
//! CPU reference: f32 and f16 weights, f16 inputs and outputs, long prompts' own tile, and
//! the gates in its epilogue.

use super::*;

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
