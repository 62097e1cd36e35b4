//! The speech kernels against plain CPU references on random inputs of awkward sizes: the
//! convolution stem (im2col + the tiled product), non-causal attention in both its per-query
//! and tiled forms, and Whisper's logit rules with the score of the sampled token.

mod common;

use backpack_engine::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use backpack_engine::ops::*;
use common::{Rng, assert_close, attention_atol, gpu, product_gpus, round_f16};

fn step(gpu: &Gpu, pos0: u32, n: u32) -> UniformBuffer {
    gpu.uniform("step", &StepParams::new(pos0, n))
}

fn buf(gpu: &Gpu, data: &[f32]) -> StorageBuffer {
    gpu.storage_from("test", data).expect("buffer")
}

fn read(gpu: &Gpu, b: &StorageBuffer, n: usize) -> Vec<f32> {
    gpu.read(&b.buffer, 0, n as u64).expect("read back")
}

/// PyTorch's Conv1d (`[out][in][taps]` weight, zero padding) on `[in][len]` input.
#[allow(clippy::too_many_arguments)]
fn conv1d_ref(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    c_in: usize,
    c_out: usize,
    len: usize,
    stride: usize,
    pad: usize,
) -> Vec<f32> {
    let taps = 3;
    let out_len = (len + 2 * pad - taps) / stride + 1;
    let mut y = vec![0.0; out_len * c_out];
    for t in 0..out_len {
        for o in 0..c_out {
            let mut s = f64::from(b[o]);
            for c in 0..c_in {
                for k in 0..taps {
                    let pos = (t * stride + k) as isize - pad as isize;
                    if pos >= 0 && (pos as usize) < len {
                        s += f64::from(w[(o * c_in + c) * taps + k])
                            * f64::from(x[c * len + pos as usize]);
                    }
                }
            }
            y[t * c_out + o] = s as f32;
        }
    }
    y
}

#[test]
fn convolution_stem_matches_cpu() {
    for gpu in product_gpus() {
        convolution_stem_parity(&gpu);
    }
}

/// f16 inputs and weights: the reference holds on the tensor-core tiles too.
fn convolution_stem_parity(gpu: &Gpu) {
    let gpu = gpu.clone();
    let mut rng = Rng::new(11);
    // (in channels, out channels, length, stride, input layout channel-major)
    for (c_in, c_out, len, stride, channel_major) in [
        (7, 13, 29, 1, true),
        (13, 5, 30, 2, false),
        (3, 9, 1, 2, true),
        (80, 24, 61, 1, true),
    ] {
        let x_cm = round_f16(&rng.vec(c_in * len, 1.0));
        let w = round_f16(&rng.vec(c_out * c_in * 3, 0.5));
        let b = rng.vec(c_out, 0.2);
        let want = conv1d_ref(&x_cm, &w, &b, c_in, c_out, len, stride, 1);
        // The same input, laid out as the kernel is told.
        let x: Vec<f32> = if channel_major {
            x_cm.clone()
        } else {
            (0..len * c_in)
                .map(|i| x_cm[(i % c_in) * len + i / c_in])
                .collect()
        };
        let shape = Conv1dShape {
            channels: c_in as u32,
            in_len: len as u32,
            taps: 3,
            stride: stride as u32,
            pad: 1,
            channel_major,
        };
        let out_len = shape.out_len() as usize;
        assert_eq!(out_len * c_out, want.len());
        let src = buf(&gpu, &x);
        let cols = gpu
            .storage("cols", (out_len * c_in * 3 * 4) as u64)
            .expect("cols");
        let y = gpu.storage("y", (out_len * c_out * 4) as u64).expect("y");
        let weight = Matrix::from_f32(
            &gpu,
            "w",
            &w,
            c_out as u32,
            (c_in * 3) as u32,
            WeightDType::F32,
        )
        .expect("weight");
        let bias = buf(&gpu, &b);
        let st = step(&gpu, 0, out_len as u32);
        let im2col = Im2Col::new(&gpu, shape, &src, &cols).expect("im2col");
        let product = MatMul::new(
            &gpu,
            &weight,
            &cols,
            &y,
            &st,
            MatMulOptions {
                bias: Some(&bias),
                ..Default::default()
            },
        )
        .expect("matmul");
        let mut rec = Recorder::new(&gpu);
        im2col.encode(&mut rec);
        product.encode(&mut rec, out_len as u32);
        rec.submit();
        let got = read(&gpu, &y, want.len());
        let ones = vec![1.0; want.len()];
        assert_close(
            &format!("conv {c_in}->{c_out} over {len} stride {stride}"),
            &got,
            &want,
            &ones,
            1e-4,
            0.0,
        );
    }
}

struct AttnCase {
    heads: usize,
    kv_heads: usize,
    hd: usize,
    queries: usize,
    keys: usize,
    /// Extra floats around the operands in their rows.
    q_extra: usize,
    k_off: usize,
    kv_extra: usize,
    /// Query rows the query buffer holds (at least `queries`): what a CPU adapter sizes its
    /// scores buffer for.
    q_rows: usize,
}

#[test]
fn full_attention_matches_cpu_in_every_form() {
    let gpu = gpu();
    let mut rng = Rng::new(5);
    let cases = [
        AttnCase {
            heads: 3,
            kv_heads: 3,
            hd: 24,
            queries: 45,
            keys: 77,
            q_extra: 8,
            k_off: 4,
            kv_extra: 12,
            q_rows: 0,
        },
        AttnCase {
            heads: 4,
            kv_heads: 2,
            hd: 64,
            queries: 33,
            keys: 130,
            q_extra: 0,
            k_off: 64,
            kv_extra: 0,
            q_rows: 0,
        },
        AttnCase {
            heads: 2,
            kv_heads: 2,
            hd: 128,
            queries: 17,
            keys: 19,
            q_extra: 4,
            k_off: 0,
            kv_extra: 4,
            q_rows: 0,
        },
        // Wide heads over more keys than a block and more queries than a block, grouped:
        // f16 rows read straight as fragments, the last partial block of keys included.
        AttnCase {
            heads: 4,
            kv_heads: 2,
            hd: 128,
            queries: 70,
            keys: 150,
            q_extra: 8,
            k_off: 0,
            kv_extra: 16,
            q_rows: 0,
        },
        // The wide form of the tensor-core kernel (128 queries a block, the last one
        // overlapping the one before): heads of 64 grouped, and of 128.
        AttnCase {
            heads: 4,
            kv_heads: 2,
            hd: 64,
            queries: 200,
            keys: 90,
            q_extra: 4,
            k_off: 0,
            kv_extra: 8,
            q_rows: 0,
        },
        AttnCase {
            heads: 2,
            kv_heads: 2,
            hd: 128,
            queries: 140,
            keys: 45,
            q_extra: 0,
            k_off: 0,
            kv_extra: 0,
            q_rows: 0,
        },
        // The UNet's head sizes (SD 1.x: 40 and 160), over more queries than a block holds.
        AttnCase {
            heads: 2,
            kv_heads: 2,
            hd: 40,
            queries: 133,
            keys: 77,
            q_extra: 0,
            k_off: 0,
            kv_extra: 0,
            q_rows: 0,
        },
        AttnCase {
            heads: 1,
            kv_heads: 1,
            hd: 160,
            queries: 70,
            keys: 101,
            q_extra: 0,
            k_off: 160,
            kv_extra: 0,
            q_rows: 0,
        },
        AttnCase {
            heads: 1,
            kv_heads: 1,
            hd: 8,
            queries: 1,
            keys: 1,
            q_extra: 0,
            k_off: 0,
            kv_extra: 0,
            q_rows: 0,
        },
        // Several blocks of 64 queries and of 64 keys for the tensor-core kernel, each last
        // one partly empty.
        AttnCase {
            heads: 3,
            kv_heads: 1,
            hd: 48,
            queries: 150,
            keys: 70,
            q_extra: 4,
            k_off: 0,
            kv_extra: 0,
            q_rows: 0,
        },
        // Scores for 2048 query rows × 4100 keys take 34 MB a head: a CPU adapter runs the two
        // heads in two rounds of its three passes.
        AttnCase {
            heads: 2,
            kv_heads: 1,
            hd: 8,
            queries: 40,
            keys: 4100,
            q_extra: 0,
            k_off: 0,
            kv_extra: 0,
            q_rows: 2048,
        },
    ];
    // Each case with f32 operands, then with f16 ones (as an encoder's QKV product writes them
    // on tensor cores), checked against the reference on the same rounded inputs.
    for (c, halves) in cases.iter().flat_map(|c| [(c, false), (c, true)]) {
        let q_stride = c.heads * c.hd + c.q_extra;
        let kv_width = c.kv_heads * c.hd;
        let kv_stride = c.k_off + 2 * kv_width + c.kv_extra;
        let mut q = rng.vec(c.queries.max(c.q_rows) * q_stride, 1.0);
        let mut kv = rng.vec(c.keys * kv_stride, 1.0);
        if halves {
            q = round_f16(&q);
            kv = round_f16(&kv);
        }
        let scale = 1.0 / (c.hd as f32).sqrt();
        let mut want = vec![0.0f32; c.queries * c.heads * c.hd];
        for t in 0..c.queries {
            for h in 0..c.heads {
                let g = h / (c.heads / c.kv_heads);
                let qv = &q[t * q_stride + h * c.hd..][..c.hd];
                let scores: Vec<f64> = (0..c.keys)
                    .map(|j| {
                        let k = &kv[j * kv_stride + c.k_off + g * c.hd..][..c.hd];
                        qv.iter().zip(k).map(|(a, b)| f64::from(a * b)).sum::<f64>()
                            * f64::from(scale)
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::MIN, f64::max);
                let total: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for d in 0..c.hd {
                    let v: f64 = (0..c.keys)
                        .map(|j| {
                            (scores[j] - m).exp() / total
                                * f64::from(kv[j * kv_stride + c.k_off + kv_width + g * c.hd + d])
                        })
                        .sum();
                    want[(t * c.heads + h) * c.hd + d] = v as f32;
                }
            }
        }
        let operands = |v: &[f32]| {
            if halves {
                let words: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
                gpu.storage_from("test", &words).expect("buffer")
            } else {
                buf(&gpu, v)
            }
        };
        let qb = operands(&q);
        let kvb = operands(&kv);
        let out = gpu.storage("out", (want.len() * 4) as u64).expect("out");
        // f16 outputs keep 11 significant bits of values below 1.
        let rounding = if halves { 1e-3 } else { 0.0 };
        let st = step(&gpu, 0, c.queries as u32);
        let attention = FullAttention::new(
            &gpu,
            FullLayout {
                heads: c.heads as u32,
                kv_heads: c.kv_heads as u32,
                head_dim: c.hd as u32,
                keys: c.keys as u32,
                q_stride: q_stride as u32,
                kv_stride: kv_stride as u32,
                k_off: c.k_off as u32,
                f16: halves,
            },
            &qb,
            &kvb,
            &out,
            &st,
        )
        .expect("attention");
        for kernel in attention.kernels() {
            let mut rec = Recorder::new(&gpu);
            rec.clear(&out.buffer);
            attention.encode_with(&mut rec, c.queries as u32, kernel);
            rec.submit();
            let got = if halves {
                let words: Vec<half::f16> =
                    gpu.read(&out.buffer, 0, want.len() as u64).expect("out");
                words.iter().map(|h| h.to_f32()).collect()
            } else {
                read(&gpu, &out, want.len())
            };
            let ones = vec![1.0; want.len()];
            assert_close(
                &format!(
                    "{} heads ({} kv) of {} dims, {} queries over {} keys, f16 operands {halves}, {kernel:?}",
                    c.heads, c.kv_heads, c.hd, c.queries, c.keys
                ),
                &got,
                &want,
                &ones,
                attention_atol(kernel, 2e-5) + rounding,
                0.0,
            );
        }
    }
}

const NEG: f32 = -3.0e38;

/// transformers' suppress, begin-suppress and timestamp processors on one row of logits.
fn rules_ref(logits: &mut [f32], seq: &[u32], ids: &SpeechTokenIds, rules: &SpeechRules) {
    for &s in &rules.suppress {
        logits[s as usize] = NEG;
    }
    if seq.is_empty() {
        for &s in &rules.begin_suppress {
            logits[s as usize] = NEG;
        }
    }
    if !rules.timestamps {
        return;
    }
    let tb = ids.timestamp_begin as usize;
    logits[ids.no_timestamps as usize] = NEG;
    let is_ts = |t: u32| t >= ids.timestamp_begin;
    let last = seq.last().is_some_and(|&t| is_ts(t));
    let penultimate = seq.len() < 2 || is_ts(seq[seq.len() - 2]);
    if last {
        if penultimate {
            logits[tb..].fill(NEG);
        } else {
            logits[..ids.eot as usize].fill(NEG);
        }
    }
    if let Some(&last_ts) = seq.iter().rev().find(|&&t| is_ts(t)) {
        let upto = if last && !penultimate {
            last_ts
        } else {
            last_ts + 1
        } as usize;
        let n = logits.len();
        logits[tb..upto.min(n)].fill(NEG);
    }
    if seq.is_empty() {
        logits[..tb].fill(NEG);
        if let Some(m) = rules.max_initial_timestamp {
            let n = logits.len();
            let from = (tb + m as usize + 1).min(n);
            logits[from..].fill(NEG);
        }
    }
    let lse = |s: &[f32]| {
        let m = s.iter().copied().fold(f32::MIN, f32::max);
        f64::from(m) + s.iter().map(|&v| f64::from(v - m).exp()).sum::<f64>().ln()
    };
    let ts_mass = lse(&logits[tb..]);
    let best_text = logits[..tb].iter().copied().fold(f32::MIN, f32::max);
    if ts_mass > f64::from(best_text) && ts_mass > f64::from(NEG) * 0.5 {
        logits[..tb].fill(NEG);
    }
}

#[test]
fn speech_logit_rules_match_transformers_order() {
    let gpu = gpu();
    let mut rng = Rng::new(23);
    let vocab = 301u32;
    let ids = SpeechTokenIds {
        vocab,
        eot: 200,
        no_timestamps: 249,
        timestamp_begin: 250,
    };
    let prompt = [201u32, 202, 203];
    // Generated so far: nothing, text, a lone timestamp, a pair, text after a pair, a
    // timestamp opening a segment, and a timestamp closing one.
    let histories: [&[u32]; 7] = [
        &[],
        &[5, 9],
        &[260],
        &[255, 17, 262, 262],
        &[250, 17, 262, 262, 40],
        &[270],
        &[251, 30, 31, 275],
    ];
    let logits_buf = gpu
        .storage("logits", u64::from(vocab.div_ceil(4) * 4) * 4)
        .expect("logits");
    let history = gpu.storage("history", 64 * 4).expect("history");
    let seen = gpu.storage("seen", 64).expect("seen");
    let scores = gpu.storage("scores", 64 * 4).expect("scores");
    let st = step(&gpu, 0, 1);
    let rules_op =
        SpeechLogits::new(&gpu, ids, &logits_buf, &history, &scores, &st).expect("rules");
    let sample = Sample::new(&gpu, vocab, &logits_buf, &history, &seen, &st).expect("sampler");
    for (case, generated) in histories.iter().enumerate() {
        for timestamps in [false, true] {
            // Timestamps win the mass test in some cases and lose it in others.
            let ts_bias = if case % 2 == 0 { 2.5 } else { -1.0 };
            let logits: Vec<f32> = (0..vocab)
                .map(|v| {
                    rng.uniform() * 3.0
                        + if v >= ids.timestamp_begin {
                            ts_bias
                        } else {
                            0.0
                        }
                })
                .collect();
            let rules = SpeechRules {
                timestamps,
                begin_index: prompt.len() as u32,
                max_initial_timestamp: Some(7),
                suppress: vec![3, 11, 201, 202],
                begin_suppress: vec![220 - 100, ids.eot],
                temperature: 0.0,
            };
            let seq: Vec<u32> = prompt.iter().chain(generated.iter()).copied().collect();
            let seq_len = seq.len() as u32;
            gpu.queue()
                .write_buffer(&history.buffer, 0, bytemuck::cast_slice(&seq));
            gpu.queue()
                .write_buffer(&logits_buf.buffer, 0, bytemuck::cast_slice(&logits));
            st.write(&gpu, &StepParams::new(seq_len - 1, 1));
            rules_op.set(&gpu, &rules);
            let mut rec = Recorder::new(&gpu);
            rules_op.encode_rules(&mut rec);
            rec.submit();
            let got = read(&gpu, &logits_buf, vocab as usize);
            let mut want = logits.clone();
            rules_ref(&mut want, generated, &ids, &rules);
            let what = format!("history {generated:?}, timestamps {timestamps}");
            for v in 0..vocab as usize {
                let (g, w) = (got[v], want[v]);
                assert!(
                    (g <= -1e38 && w <= -1e38) || (g - w).abs() < 1e-6,
                    "{what}: token {v} is {g}, want {w}"
                );
            }
            // Then the sampler (greedy) and the score of its token.
            gpu.queue()
                .write_buffer(&logits_buf.buffer, 0, bytemuck::cast_slice(&logits));
            let mut rec = Recorder::new(&gpu);
            rules_op.encode_rules(&mut rec);
            sample.encode(&mut rec);
            rules_op.encode_score(&mut rec);
            rec.submit();
            let token: Vec<u32> = gpu
                .read(&history.buffer, u64::from(seq_len), 1)
                .expect("token");
            let token = token[0] as usize;
            let best = (0..vocab as usize)
                .max_by(|&a, &b| want[a].total_cmp(&want[b]))
                .expect("a token");
            assert_eq!(token, best, "{what}: greedy pick");
            let m = want.iter().copied().fold(f32::MIN, f32::max);
            let lse = f64::from(m)
                + want
                    .iter()
                    .map(|&v| f64::from(v - m).exp())
                    .sum::<f64>()
                    .ln();
            let score: Vec<f32> = gpu
                .read(&scores.buffer, u64::from(seq_len), 1)
                .expect("score");
            assert!(
                (f64::from(score[0]) - (f64::from(want[token]) - lse)).abs() < 1e-4,
                "{what}: score {} want {}",
                score[0],
                f64::from(want[token]) - lse
            );
        }
    }
}
