//! The sampler against its host formulas: masks, greedy ties, the repetition penalty, the
//! filtered distribution and near ties.

use super::*;

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
