//! A decoded token's split attention (runs of keys across workgroups, q/k/v from the fused
//! QKV row), merged by the output product.

use super::*;

/// Decoding splits the keys over workgroups, takes the token's q/k/v from the fused QKV row
/// (rotating q and k itself, and storing k and v in the cache), and the output product merges
/// the runs while it stages its input. Checked end to end: y = W · attention, and the cache.
#[test]
fn split_attention_merged_by_the_output_product_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng::new(15);
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
}
