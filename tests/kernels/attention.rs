//! Attention against a plain CPU reference: RoPE and the cache store, prompts (with sinks,
//! a climbing max, rolling windows), a decoded token's split attention merged by the output
//! product or by itself, and batched steps reading each row's slot.

use super::*;

#[path = "split_attention.rs"]
mod split_attention;

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
        // A verification's rows after a long context (its keys in runs: 13 of 64, the last
        // short).
        (4, 2, 64, 8, 800, 808),
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
        if kernel == AttentionKernel::KeyRuns && c.tokens > RUNS_MOST_ROWS {
            continue;
        }
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
