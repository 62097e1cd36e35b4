//! Gated DeltaNet's kernels (shaders/delta_net.wgsl) against a plain CPU reference that
//! follows transformers' `torch_recurrent_gated_delta_rule` (Qwen3.5): the causal convolution
//! with SiLU, L2-normalized q and k, the decayed delta rule, the gated RMSNorm. A sequence
//! runs in steps of awkward lengths (prompt chunks, then single decoded tokens), so the
//! convolution's and the recurrence's states carry across steps; value heads share key heads
//! in groups; head dims are not powers of two.

mod common;

use backpack_engine::gpu::{Gpu, Recorder, StorageBuffer};
use backpack_engine::ops::{
    DELTA_CHUNK, DELTA_CHUNKED_FROM, DeltaNet, DeltaNetIo, DeltaNetShape, DeltaNetState,
    DeltaNetWeights, DeltaRows, DeltaScratch, StepParams,
};
use common::{Rng, assert_close, gpu};

struct Layer {
    shape: DeltaNetShape,
    /// Value head h reads key head h mod key_heads (GGUF's order).
    tiled: bool,
    conv: Vec<f32>,
    decay_a: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
    eps: f32,
}

/// One token's inputs: the projected q/k/v row, b then a, and z.
struct Token {
    mixed: Vec<f32>,
    gates: Vec<f32>,
    z: Vec<f32>,
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// The layer's outputs for `tokens` from an empty state, and the final recurrent state.
fn reference(layer: &Layer, tokens: &[Token]) -> (Vec<f32>, Vec<f32>) {
    let s = &layer.shape;
    let (nk, nv, dk, dv, k) = (
        s.key_heads as usize,
        s.value_heads as usize,
        s.key_dim as usize,
        s.value_dim as usize,
        s.conv_kernel as usize,
    );
    let channels = s.channels() as usize;
    let group = nv / nk;
    let mut state = vec![0.0f32; nv * dk * dv];
    let mut out = Vec::new();
    for (t, token) in tokens.iter().enumerate() {
        // The convolution over this token and the k − 1 before it (zeros before the start).
        let conv: Vec<f32> = (0..channels)
            .map(|c| {
                let sum: f32 = (0..k)
                    .map(|j| {
                        let back = k - 1 - j;
                        let x = if t >= back {
                            tokens[t - back].mixed[c]
                        } else {
                            0.0
                        };
                        layer.conv[c * k + j] * x
                    })
                    .sum();
                silu(sum)
            })
            .collect();
        for h in 0..nv {
            let kh = if layer.tiled { h % nk } else { h / group };
            let norm = |v: &[f32]| -> Vec<f32> {
                let inv = 1.0 / (v.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt();
                v.iter().map(|x| x * inv).collect()
            };
            let q: Vec<f32> = norm(&conv[kh * dk..(kh + 1) * dk])
                .iter()
                .map(|x| x / (dk as f32).sqrt())
                .collect();
            let key = norm(&conv[nk * dk + kh * dk..nk * dk + (kh + 1) * dk]);
            let v = &conv[2 * nk * dk + h * dv..2 * nk * dk + (h + 1) * dv];
            let beta = 1.0 / (1.0 + (-token.gates[h]).exp());
            let g = layer.decay_a[h] * softplus(token.gates[nv + h] + layer.dt_bias[h]);
            let st = &mut state[h * dk * dv..(h + 1) * dk * dv];
            st.iter_mut().for_each(|x| *x *= g.exp());
            let o: Vec<f32> = (0..dv)
                .map(|c| {
                    let kv: f32 = (0..dk).map(|i| st[i * dv + c] * key[i]).sum();
                    let delta = beta * (v[c] - kv);
                    (0..dk).for_each(|i| st[i * dv + c] += key[i] * delta);
                    (0..dk).map(|i| st[i * dv + c] * q[i]).sum()
                })
                .collect();
            let rms = (o.iter().map(|x| x * x).sum::<f32>() / dv as f32 + layer.eps).sqrt();
            let z = &token.z[h * dv..(h + 1) * dv];
            for ((w, o), z) in layer.norm.iter().zip(&o).zip(z) {
                out.push(w * (o / rms) * silu(*z));
            }
        }
    }
    (out, state)
}

fn random_layer(rng: &mut Rng, shape: DeltaNetShape) -> Layer {
    let channels = shape.channels() as usize;
    let nv = shape.value_heads as usize;
    Layer {
        conv: rng.vec(channels * shape.conv_kernel as usize, 0.6),
        decay_a: (0..nv).map(|_| -(rng.uniform() * 2.0).exp()).collect(),
        dt_bias: rng.vec(nv, 1.0),
        norm: rng.vec(shape.value_dim as usize, 1.0),
        eps: 1e-6,
        shape,
        tiled: false,
    }
}

fn random_tokens(rng: &mut Rng, shape: &DeltaNetShape, n: usize) -> Vec<Token> {
    let width = (shape.value_heads * shape.value_dim) as usize;
    (0..n)
        .map(|_| Token {
            mixed: rng.vec(shape.channels() as usize, 1.5),
            gates: rng.vec(2 * shape.value_heads as usize, 2.0),
            z: rng.vec(width, 1.5),
        })
        .collect()
}

/// How the input products lay a token's values out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Inputs {
    /// One product: q/k/v, z, b, a in each row.
    Stacked,
    /// q/k/v and z in one product's rows, b and a in another's.
    GatesApart,
    /// q/k/v in one product's rows, z, b and a in another's.
    ZAndGatesApart,
}

/// Runs `tokens` through the kernels in steps of `steps` tokens; returns every output and the
/// final recurrent state.
fn run(gpu: &Gpu, layer: &Layer, tokens: &[Token], steps: &[usize]) -> (Vec<f32>, Vec<f32>) {
    run_with(gpu, layer, tokens, steps, Inputs::Stacked)
}

fn run_with(
    gpu: &Gpu,
    layer: &Layer,
    tokens: &[Token],
    steps: &[usize],
    inputs: Inputs,
) -> (Vec<f32>, Vec<f32>) {
    let shape = &layer.shape;
    let most = *steps.iter().max().expect("steps") as u64;
    let width = u64::from(shape.value_heads * shape.value_dim);
    let (channels, z_len) = (shape.channels(), shape.value_heads * shape.value_dim);
    // Values per row of the first product's rows and of the second's.
    let (first_width, second_width) = match inputs {
        Inputs::Stacked => (shape.projected_width(), 1),
        Inputs::GatesApart => (channels + z_len, 2 * shape.value_heads),
        Inputs::ZAndGatesApart => (channels, z_len + 2 * shape.value_heads),
    };
    let store = |v: &[f32]| gpu.storage_from("test", v).expect("buffer");
    let weights = DeltaNetWeights {
        conv: store(&layer.conv),
        decay_a: store(&layer.decay_a),
        dt_bias: store(&layer.dt_bias),
        norm: store(&layer.norm),
    };
    let state = DeltaNetState::new(gpu, shape).expect("state");
    let buffer =
        |values: u64| -> StorageBuffer { gpu.storage("test", 4 * values).expect("buffer") };
    let rows = buffer(most * u64::from(first_width));
    let second = buffer(most * u64::from(second_width));
    let out = buffer(most * width);
    let scratch = DeltaScratch::new(gpu, shape, most as u32).expect("scratch");
    let io = match inputs {
        Inputs::Stacked => DeltaNetIo::stacked(&rows, shape, &out, &scratch),
        Inputs::GatesApart | Inputs::ZAndGatesApart => {
            let z = match inputs {
                Inputs::GatesApart => DeltaRows {
                    buffer: &rows,
                    offset: channels,
                    stride: first_width,
                },
                _ => DeltaRows {
                    buffer: &second,
                    offset: 0,
                    stride: second_width,
                },
            };
            let gates = DeltaRows {
                buffer: &second,
                offset: second_width - 2 * shape.value_heads,
                stride: second_width,
            };
            DeltaNetIo {
                rows: &rows,
                rows_stride: first_width,
                z,
                gates,
                out: &out,
                scratch: &scratch,
            }
        }
    };
    let step = gpu.uniform("step", &StepParams::new(0, 1));
    let net = DeltaNet::new(
        gpu,
        shape,
        layer.tiled,
        &weights,
        &state,
        &io,
        &step,
        layer.eps,
    )
    .expect("kernels");
    // Steps this long are meant to test the chunked form: the adapter must take it.
    if steps.iter().any(|&n| n >= DELTA_CHUNKED_FROM as usize) {
        assert!(
            net.prompts_in_chunks(),
            "the adapter runs no chunked prompts"
        );
    }
    let mut got = Vec::new();
    let mut first = 0;
    for &n in steps {
        let chunk = &tokens[first..first + n];
        // Each token's values as the products write them.
        let (mut a, mut b): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
        for t in chunk {
            a.extend(&t.mixed);
            match inputs {
                Inputs::Stacked => a.extend(t.z.iter().chain(&t.gates)),
                Inputs::GatesApart => {
                    a.extend(&t.z);
                    b.extend(&t.gates);
                }
                Inputs::ZAndGatesApart => b.extend(t.z.iter().chain(&t.gates)),
            }
        }
        gpu.queue()
            .write_buffer(&rows.buffer, 0, bytemuck::cast_slice(&a));
        if !b.is_empty() {
            gpu.queue()
                .write_buffer(&second.buffer, 0, bytemuck::cast_slice(&b));
        }
        step.write(gpu, &StepParams::new(first as u32, n as u32));
        let mut rec = Recorder::new(gpu);
        if first == 0 {
            state.clear(&mut rec);
        }
        net.encode_prompt(&mut rec, n as u32);
        rec.submit();
        got.extend(
            gpu.read::<f32>(&out.buffer, 0, n as u64 * width)
                .expect("read"),
        );
        first += n;
    }
    let final_state = gpu
        .read::<f32>(&state.recurrent.buffer, 0, shape.state_values())
        .expect("state");
    (got, final_state)
}

fn check(shape: DeltaNetShape, steps: &[usize], seed: u64) {
    check_order(shape, false, steps, seed);
}

/// Runs the tokens through the kernels in `steps` and checks outputs and final state against
/// the CPU's token-by-token recurrence. Steps of [`DELTA_CHUNKED_FROM`] tokens or more take the
/// chunked form.
fn check_order(shape: DeltaNetShape, tiled: bool, steps: &[usize], seed: u64) {
    let gpu = gpu();
    let mut rng = Rng::new(seed);
    let layer = Layer {
        tiled,
        ..random_layer(&mut rng, shape)
    };
    let total = steps.iter().sum();
    let tokens = random_tokens(&mut rng, &shape, total);
    let (want, want_state) = reference(&layer, &tokens);
    let what = format!("{shape:?} in steps {steps:?}");
    let (got, got_state) = run(&gpu, &layer, &tokens, steps);
    let scale = vec![1.0; want.len()];
    assert_close(&what, &got, &want, &scale, 2e-4, 0.0);
    let scale = vec![1.0; want_state.len()];
    assert_close(
        &format!("{what}: state"),
        &got_state,
        &want_state,
        &scale,
        2e-4,
        0.0,
    );
    // A new sequence starts from a cleared state: the same tokens give the same outputs.
    let (again, _) = run(&gpu, &layer, &tokens, steps);
    assert_eq!(got, again, "{what}: a second sequence");
}

#[test]
fn grouped_heads_over_prompt_chunks_and_decoded_tokens_match_cpu() {
    let shape = DeltaNetShape {
        key_heads: 2,
        value_heads: 6,
        key_dim: 13,
        value_dim: 11,
        conv_kernel: 4,
    };
    check(shape, &[7, 1, 5, 1, 1], 1);
    // GGUF's order: value heads tiled over the key heads.
    check_order(shape, true, &[7, 1, 5, 1, 1], 5);
    // A prompt shorter than the convolution's reach, then decoding.
    check(shape, &[2, 1, 1, 1], 2);
}

#[test]
fn one_head_per_key_and_wide_heads_match_cpu() {
    check(
        DeltaNetShape {
            key_heads: 3,
            value_heads: 3,
            key_dim: 40,
            value_dim: 37,
            conv_kernel: 2,
        },
        &[9, 1, 3],
        3,
    );
    check(
        DeltaNetShape {
            key_heads: 1,
            value_heads: 2,
            key_dim: 70,
            value_dim: 130,
            conv_kernel: 4,
        },
        &[4, 1],
        4,
    );
}

#[test]
fn chunked_prompts_over_several_chunks_then_decoding_match_cpu() {
    let chunk = DELTA_CHUNK as usize;
    // Head dims past one invocation's stride in the preparation (64) and past one column
    // group of the walk (32); a partial last chunk; decoded tokens between prompt steps.
    let shape = DeltaNetShape {
        key_heads: 2,
        value_heads: 4,
        key_dim: 72,
        value_dim: 70,
        conv_kernel: 4,
    };
    check(shape, &[2 * chunk + 22, 1, chunk, 1, 1, 17], 11);
    check_order(shape, true, &[chunk + 1, 1], 12);
    // Small odd heads, a prompt step of exactly the threshold.
    let small = DeltaNetShape {
        key_heads: 1,
        value_heads: 3,
        key_dim: 13,
        value_dim: 11,
        conv_kernel: 3,
    };
    check(small, &[DELTA_CHUNKED_FROM as usize, 1, 3 * chunk - 1], 13);
    // Key heads over 128 wide (the walk then takes 16 state columns a workgroup), not a
    // multiple of the Gram products' 16-dim tiles.
    let wide_keys = DeltaNetShape {
        key_heads: 1,
        value_heads: 2,
        key_dim: 136,
        value_dim: 20,
        conv_kernel: 4,
    };
    check(wide_keys, &[chunk + 6, 1], 14);
}

/// Prefill of N tokens then one decoded token gives what N + 1 single tokens give: the chunked
/// and the recurrent forms leave the same state.
#[test]
fn chunked_prefill_then_decode_equals_decoding_every_token() {
    let shape = DeltaNetShape {
        key_heads: 2,
        value_heads: 4,
        key_dim: 24,
        value_dim: 20,
        conv_kernel: 4,
    };
    let gpu = gpu();
    let mut rng = Rng::new(21);
    let layer = random_layer(&mut rng, shape);
    let n = DELTA_CHUNK as usize + 9;
    let tokens = random_tokens(&mut rng, &shape, n + 1);
    let (chunked, chunked_state) = run(&gpu, &layer, &tokens, &[n, 1]);
    let (single, single_state) = run(&gpu, &layer, &tokens, &vec![1; n + 1]);
    let scale = vec![1.0; single.len()];
    assert_close("chunked then decoded", &chunked, &single, &scale, 2e-4, 0.0);
    let scale = vec![1.0; single_state.len()];
    assert_close(
        "state after the last token",
        &chunked_state,
        &single_state,
        &scale,
        2e-4,
        0.0,
    );
}

/// Input products apart (files that store the layer's projections in several formats): z and
/// the gates in rows of their own give what one stacked product gives, for the recurrent and
/// the chunked forms.
#[test]
fn inputs_in_rows_of_their_own_match_the_stacked_rows() {
    let shape = DeltaNetShape {
        key_heads: 2,
        value_heads: 4,
        key_dim: 16,
        value_dim: 12,
        conv_kernel: 4,
    };
    let gpu = gpu();
    let mut rng = Rng::new(31);
    let layer = random_layer(&mut rng, shape);
    let steps = [DELTA_CHUNK as usize + 3, 1, 5, 1];
    let tokens = random_tokens(&mut rng, &shape, steps.iter().sum());
    let (want, want_state) = run(&gpu, &layer, &tokens, &steps);
    for inputs in [Inputs::GatesApart, Inputs::ZAndGatesApart] {
        let (got, got_state) = run_with(&gpu, &layer, &tokens, &steps, inputs);
        assert_eq!(got, want, "{inputs:?}");
        assert_eq!(got_state, want_state, "{inputs:?}: state");
    }
}

#[test]
fn shapes_the_kernels_cannot_take_are_refused() {
    let shape = DeltaNetShape {
        key_heads: 4,
        value_heads: 6,
        key_dim: 16,
        value_dim: 16,
        conv_kernel: 4,
    };
    assert!(shape.check().is_err());
    let wide = DeltaNetShape {
        key_heads: 1,
        value_heads: 1,
        key_dim: 512,
        value_dim: 16,
        conv_kernel: 4,
    };
    assert!(wide.check().expect_err("too wide").contains("512"));
    let ok = DeltaNetShape {
        value_heads: 8,
        ..shape
    };
    assert!(ok.check().is_ok());
    let none = DeltaNetShape {
        value_heads: 0,
        ..shape
    };
    assert!(none.check().is_err());
    let huge = DeltaNetShape {
        key_heads: 1 << 20,
        value_heads: 1 << 20,
        ..shape
    };
    assert!(huge.check().expect_err("too many heads").contains("rows"));
}
