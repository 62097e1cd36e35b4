//! The routed experts' kernels (shaders/moe.wgsl) against a plain CPU reference: routing with
//! tied logits, an expert no token picks (its weights are NaN, so reading them shows), an
//! expert every token picks (more tokens than one pass takes), both weightings, both
//! activations, biases, and every weight layout (dense f32 and f16, block formats, MXFP4) in
//! the three row orders checkpoints use.

mod common;
#[path = "kernels_moe/handoff.rs"]
mod handoff;
#[path = "kernels_moe/layouts.rs"]
mod layouts;
#[path = "kernels_moe/router.rs"]
mod router;

use backpack_engine::gpu::{Gpu, Recorder, StorageBuffer};
use backpack_engine::load::quant::dequantize;
use backpack_engine::load::{ExpertActivation, GgmlType, MoeSpec, RouterWeights};
use backpack_engine::ops::{
    ExpertDecode, ExpertWeights, Experts, GateUpRows, MatVec, MatVecLayout, MatVecOptions, Matrix,
    MoeBuffers, NormKind, StepParams, WeightDType, int8_rounded_input,
};
use common::{Rng, assert_close, product_gpus, round_f16};

/// How the expert matrices are stored.
#[derive(Clone, Copy, Debug)]
enum Storage {
    Dense(WeightDType),
    Blocks(GgmlType),
}

/// Which tokens the router logits send where.
#[derive(Clone, Copy, Debug)]
enum Routing {
    /// Random logits.
    Random,
    /// Logits tied in pairs, so that a tie straddles the top-k boundary: the lower expert
    /// must win it.
    Ties,
    /// Expert 0 far ahead for every token, the last expert far behind (never chosen).
    OneForAll,
}

struct Case {
    experts: u32,
    top_k: u32,
    hidden: u32,
    width: u32,
    tokens: u32,
    storage: Storage,
    rows: fn(u32, u32) -> GateUpRows,
    weights: RouterWeights,
    activation: ExpertActivation,
    biases: bool,
    routing: Routing,
    /// The decode products' layout (f32 models turn int8 inputs off).
    layout: MatVecLayout,
}

fn per_expert(_experts: u32, width: u32) -> GateUpRows {
    GateUpRows::per_expert(width)
}

fn gates_then_ups(experts: u32, width: u32) -> GateUpRows {
    GateUpRows::gates_then_ups(experts, width)
}

fn interleaved(_experts: u32, width: u32) -> GateUpRows {
    GateUpRows::interleaved(width)
}

/// A matrix of `rows`×`cols` in `storage` and the values the kernels see (for the reference);
/// rows listed in `poison` are NaN (dense) or carry NaN-making exponents (MXFP4 cannot hold
/// NaN; its poison is 2^127, which overflows anything it touches).
fn matrix(
    gpu: &Gpu,
    rng: &mut Rng,
    storage: Storage,
    rows: u32,
    cols: u32,
    poison: &[u32],
) -> (Matrix, Vec<f32>) {
    let (r, c) = (rows as usize, cols as usize);
    match storage {
        Storage::Dense(dtype) => {
            let mut w = rng.vec(r * c, 0.3);
            if dtype == WeightDType::F16 {
                w = round_f16(&w);
            }
            let mut stored = w.clone();
            for &p in poison {
                stored[p as usize * c..(p as usize + 1) * c].fill(f32::NAN);
            }
            let m = Matrix::from_f32(gpu, "w", &stored, rows, cols, dtype).expect("matrix");
            (m, w)
        }
        Storage::Blocks(ty) => {
            let per_row = c / ty.block_elems() * ty.block_bytes();
            let mut blocks: Vec<u8> = (0..r * per_row).map(|_| rng.below(256) as u8).collect();
            for block in blocks.chunks_mut(ty.block_bytes()) {
                let scale = half::f16::from_f32(0.002 + rng.uniform().abs() * 0.02).to_le_bytes();
                match ty {
                    GgmlType::Mxfp4 => block[0] = 120 + rng.below(4) as u8,
                    GgmlType::Q6K => block[208..210].copy_from_slice(&scale),
                    _ => {
                        block[..2].copy_from_slice(&scale);
                        if matches!(
                            ty,
                            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q4_1 | GgmlType::Q5_1
                        ) {
                            block[2..4].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
                        }
                    }
                }
            }
            let mut w = vec![0.0f32; r * c];
            dequantize(ty, &blocks, &mut w);
            for &p in poison {
                let row = &mut blocks[p as usize * per_row..(p as usize + 1) * per_row];
                match ty {
                    GgmlType::Mxfp4 => row.chunks_mut(17).for_each(|b| {
                        b[0] = 254;
                        b[1..].fill(0x77);
                    }),
                    GgmlType::Q6K => row
                        .chunks_mut(210)
                        .for_each(|b| b[208..210].copy_from_slice(&half::f16::NAN.to_le_bytes())),
                    _ => row
                        .chunks_mut(ty.block_bytes())
                        .for_each(|b| b[..2].copy_from_slice(&half::f16::NAN.to_le_bytes())),
                }
            }
            let m = Matrix::from_blocks(gpu, "w", ty, &blocks, rows, cols).expect("matrix");
            (m, w)
        }
    }
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

fn activate(act: ExpertActivation, gate: f32, up: f32) -> f32 {
    match act {
        ExpertActivation::SwiGlu => silu(gate) * up,
        ExpertActivation::ClampedSwiGlu { alpha, limit } => {
            let g = gate.min(limit);
            let u = up.clamp(-limit, limit);
            g / (1.0 + (-alpha * g).exp()) * (u + 1.0)
        }
    }
}

/// The chosen experts and their weights, ties to the lower expert.
fn route(logits: &[f32], top_k: usize, weights: RouterWeights) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let chosen = &order[..top_k];
    let top = logits[chosen[0]];
    let total: f32 = match weights {
        RouterWeights::SoftmaxOfChosen => chosen.iter().map(|&e| (logits[e] - top).exp()).sum(),
        RouterWeights::SoftmaxOfAll => logits.iter().map(|&l| (l - top).exp()).sum(),
    };
    chosen
        .iter()
        .map(|&e| (e, (logits[e] - top).exp() / total))
        .collect()
}

fn logits_for(rng: &mut Rng, routing: Routing, tokens: usize, experts: usize) -> Vec<f32> {
    (0..tokens * experts)
        .map(|i| {
            let e = i % experts;
            match routing {
                Routing::Random => rng.uniform() * 4.0,
                Routing::Ties => (e / 2) as f32 * -0.5 + (i / experts % 2) as f32,
                Routing::OneForAll if e == 0 => 10.0,
                Routing::OneForAll if e == experts - 1 => -1e4,
                Routing::OneForAll => rng.uniform(),
            }
        })
        .collect()
}

/// Runs `case` on every product path the device has (SIMT, and tensor cores where present).
fn run(case: &Case, seed: u64) {
    for gpu in product_gpus() {
        // A decoded token's block-format products route it themselves or after a dispatch
        // of its own.
        let decodes = case.tokens == 1 && matches!(case.storage, Storage::Blocks(_));
        let (routings, inputs) = if decodes {
            (vec![true, false], vec![false, true])
        } else {
            (vec![true], vec![false])
        };
        for route_in_product in routings {
            // Its gate/up product reads its input as the router's product hands it off, or
            // reads the f32 row itself.
            for &input_handoff in &inputs {
                run_on(&gpu, case, seed, route_in_product, input_handoff);
            }
        }
    }
}

fn run_on(gpu: &Gpu, case: &Case, seed: u64, route_in_product: bool, input_handoff: bool) {
    let mut rng = Rng::new(seed);
    let (e, k, d, w, t) = (
        case.experts,
        case.top_k,
        case.hidden,
        case.width,
        case.tokens,
    );
    let moe = MoeSpec {
        experts: e,
        top_k: k,
        intermediate: w,
        weights: case.weights,
        activation: case.activation,
        biases: case.biases,
        sparse: vec![true],
        shared: false,
    };
    let rows = (case.rows)(e, w);
    let logits = logits_for(&mut rng, case.routing, t as usize, e as usize);
    let chosen: Vec<Vec<(usize, f32)>> = logits
        .chunks(e as usize)
        .map(|l| route(l, k as usize, case.weights))
        .collect();
    // The experts no token picks carry poison: reading them shows in the output.
    let unused: Vec<u32> = (0..e)
        .filter(|x| !chosen.iter().flatten().any(|(c, _)| *c == *x as usize))
        .collect();
    let gate_row = |x: u32, r: u32| x * rows.expert_stride + r * rows.row_step;
    let poison_up: Vec<u32> = unused
        .iter()
        .flat_map(|&x| (0..w).flat_map(move |r| [gate_row(x, r), gate_row(x, r) + rows.up_offset]))
        .collect();
    let poison_down: Vec<u32> = unused.iter().flat_map(|&x| x * d..(x + 1) * d).collect();
    let (gate_up, gu) = matrix(gpu, &mut rng, case.storage, 2 * e * w, d, &poison_up);
    let (down, dn) = matrix(gpu, &mut rng, case.storage, e * d, w, &poison_down);
    let gate_up_bias = rng.vec((2 * e * w) as usize, 0.5);
    let down_bias = rng.vec((e * d) as usize, 0.5);
    let xn = rng.vec((t * d) as usize, 1.0);
    let x0 = rng.vec((t * d) as usize, 1.0);
    let store = |v: &[f32]| gpu.storage_from("test", v).expect("buffer");
    let router = Matrix::from_f32(
        gpu,
        "router",
        &vec![0.0; (e * d) as usize],
        e,
        d,
        WeightDType::F32,
    )
    .expect("router");
    let weights = ExpertWeights {
        router,
        router_bias: None,
        gate_up,
        gate_up_rows: rows,
        gate_up_bias: case.biases.then(|| store(&gate_up_bias)),
        down,
        down_bias: case.biases.then(|| store(&down_bias)),
    };
    let bufs = MoeBuffers::new(gpu, &moe, d, t + 3).expect("buffers");
    gpu.queue()
        .write_buffer(&bufs.logits.buffer, 0, bytemuck::cast_slice(&logits));
    // A decoded token's block-format products normalise the residual stream themselves: the
    // normed row then holds NaN, which reading it would show.
    // (K-quant rows without int8 inputs go to the general kernel, which reads the normed row.)
    let offer_norm = t == 1 && matches!(case.storage, Storage::Blocks(_));
    let general = matches!(case.storage, Storage::Blocks(GgmlType::Q4K | GgmlType::Q5K))
        && case.layout.int8 == Some(false);
    let fused_norm = offer_norm && !general;
    let gains: Vec<f32> = (0..d).map(|_| 0.5 + rng.uniform()).collect();
    const EPS: f32 = 1e-5;
    let xn = if fused_norm {
        let raw = &x0[..d as usize];
        let inv = 1.0 / (raw.iter().map(|v| v * v).sum::<f32>() / d as f32 + EPS).sqrt();
        raw.iter().zip(&gains).map(|(v, g)| v * inv * g).collect()
    } else {
        xn
    };
    let xn_stored = if fused_norm {
        vec![f32::NAN; xn.len()]
    } else {
        xn.clone()
    };
    let (xn_buf, x_buf): (StorageBuffer, StorageBuffer) = (store(&xn_stored), store(&x0));
    let gain_buf = store(&gains);
    let step = gpu.uniform("step", &StepParams::new(0, t));
    let experts = Experts::new(
        gpu,
        &moe,
        &weights,
        &bufs,
        (&xn_buf, &x_buf),
        ExpertDecode {
            norm: offer_norm.then_some((NormKind::Rms, &gain_buf, None, EPS)),
            route_in_product: Some(route_in_product),
            layout: case.layout,
            input_handoff,
        },
        &step,
    )
    .expect("experts");
    assert_eq!(experts.decode_normed(), fused_norm, "the norm fused");
    // The router's decode product (its outputs unused: the logits are given) hands the
    // normalised row off where the gate/up product reads it so.
    let router_out = gpu.storage("router out", u64::from(e) * 4).expect("buffer");
    let router_mv = experts.input_handoff().map(|h| {
        MatVec::new(
            gpu,
            &weights.router,
            &x_buf,
            &router_out,
            &step,
            MatVecOptions {
                norm: Some((NormKind::Rms, &gain_buf, None, EPS)),
                handoff_input: Some(h),
                layout: MatVecLayout::for_dtype(WeightDType::F32),
                ..Default::default()
            },
        )
        .expect("router's product")
    });
    let mut rec = Recorder::new(gpu);
    match &router_mv {
        Some(router_mv) => {
            router_mv.encode(&mut rec);
            experts.encode_decode(&mut rec);
        }
        None => experts.encode(&mut rec, t),
    }
    rec.submit();
    let got: Vec<f32> = gpu.read(&x_buf.buffer, 0, u64::from(t * d)).expect("read");

    // Tensor-core tiles (prompts) take their inputs, weights and hidden rows as f16.
    let half = gpu.caps().cooperative_matrix && t > 1;
    // The tiles saturate at f16's largest finite value rather than overflow.
    let staged = |v: &[f32]| -> Vec<f32> {
        if half {
            let clamped: Vec<f32> = v.iter().map(|x| x.clamp(-65504.0, 65504.0)).collect();
            round_f16(&clamped)
        } else {
            v.to_vec()
        }
    };
    // A decoded token's products may take their inputs as int8 blocks (the decode product's
    // staging), which the reference then sees too.
    let levels = experts.decode_int8_levels().filter(|_| t == 1);
    if let (1, Storage::Blocks(ty)) = (t, case.storage) {
        // Formats with an integer form take the decode product's int8 path (MXFP4 in two
        // levels), the rest its float one; with int8 inputs off K-quant rows, which have no
        // float form there, go to the general expert kernel.
        let int8 = case.layout.int8 != Some(false);
        let want = match ty {
            GgmlType::Q4K | GgmlType::Q5K if !int8 => None,
            _ if !int8 => Some(0),
            GgmlType::Q5_0 | GgmlType::Q5_1 => Some(0),
            GgmlType::Mxfp4 => Some(2),
            _ => Some(1),
        };
        assert_eq!(
            levels,
            want.map(|w| (w, w)),
            "{ty:?}: decode products' int8 levels"
        );
        // Int8 readers take the router's handed-off input; the down product takes the hidden
        // rows so where the gate/up product's workgroups make whole blocks of 16 rows, as
        // lavapipe's layout does.
        let int8_both = want.is_some_and(|w| w > 0);
        let (reads_input, reads_hidden) = experts.decode_handoffs();
        assert_eq!(
            reads_input,
            int8_both && input_handoff,
            "{ty:?}: the router's input handed off"
        );
        if gpu.is_software() {
            assert_eq!(
                reads_hidden, int8_both,
                "{ty:?}: the hidden rows handed off"
            );
        }
    }
    // Two levels carry each value to about 1/64,000 of its block's largest: as f32 here.
    let (int8_up, int8_down) = levels.map_or((false, false), |(u, d)| (u == 1, d == 1));
    let int8_if = |on: bool, v: Vec<f32>| if on { int8_rounded_input(&v) } else { v };
    // The fused RMSNorm quantizes the gained row and scales the row sums by the norm's factor.
    let xn_seen = if fused_norm && int8_up {
        let raw: Vec<f32> = x0.iter().zip(&gains).map(|(v, g)| v * g).collect();
        let inv = xn[0] / raw[0];
        int8_rounded_input(&raw).iter().map(|v| v * inv).collect()
    } else {
        int8_if(int8_up, staged(&xn))
    };
    let (gu, dn) = (staged(&gu), staged(&dn));
    let (d, w) = (d as usize, w as usize);
    let mut want = x0.clone();
    let mut scale = vec![0.0f32; want.len()];
    for (tok, picks) in chosen.iter().enumerate() {
        let xrow = &xn_seen[tok * d..(tok + 1) * d];
        for &(x, weight) in picks {
            let hidden: Vec<f32> = (0..w)
                .map(|r| {
                    let g = gate_row(x as u32, r as u32) as usize;
                    let u = g + rows.up_offset as usize;
                    let dot = |row: usize| -> f32 {
                        gu[row * d..(row + 1) * d]
                            .iter()
                            .zip(xrow)
                            .map(|(a, b)| a * b)
                            .sum()
                    };
                    let bias = |row: usize| if case.biases { gate_up_bias[row] } else { 0.0 };
                    activate(case.activation, dot(g) + bias(g), dot(u) + bias(u))
                })
                .collect();
            // The int8 steps of the hidden row: where the GPU's hidden value and the
            // reference's straddle a rounding boundary, they round a step apart.
            let steps: Vec<f32> = hidden
                .chunks(32)
                .flat_map(|b| {
                    let step = b.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
                    std::iter::repeat_n(if int8_down { step } else { 0.0 }, b.len())
                })
                .collect();
            let hidden = int8_if(int8_down, staged(&hidden));
            for c in 0..d {
                let row = &dn[(x * d + c) * w..(x * d + c + 1) * w];
                let out: f32 = row.iter().zip(&hidden).map(|(a, b)| a * b).sum::<f32>()
                    + if case.biases {
                        down_bias[x * d + c]
                    } else {
                        0.0
                    };
                want[tok * d + c] += weight * out;
                // Two such steps a row, as a share of the relative tolerance.
                let flips = 2.0
                    * row
                        .iter()
                        .zip(&steps)
                        .fold(0.0f32, |m, (a, s)| m.max((a * s).abs()))
                    / 1e-4;
                scale[tok * d + c] += weight
                    * (row
                        .iter()
                        .zip(&hidden)
                        .map(|(a, b)| (a * b).abs())
                        .sum::<f32>()
                        + flips)
                    + 1.0;
            }
        }
    }
    assert_close(
        &format!(
            "{:?} {:?} {:?} tokens={t} routed in the product: {route_in_product} on {}",
            case.storage,
            case.routing,
            rows,
            if half { "tensor cores" } else { "f32 products" }
        ),
        &got,
        &want,
        &scale,
        1e-4,
        // A hidden value's f32 sum may round to the f16 neighbour of the reference's.
        if half { 1e-3 } else { 1e-4 },
    );
}

fn case(storage: Storage, hidden: u32, width: u32) -> Case {
    Case {
        experts: 6,
        top_k: 2,
        hidden,
        width,
        tokens: 1,
        storage,
        rows: per_expert,
        weights: RouterWeights::SoftmaxOfChosen,
        activation: ExpertActivation::SwiGlu,
        biases: false,
        routing: Routing::Random,
        layout: MatVecLayout::default(),
    }
}

/// Decode (one token) and prompts (tokens in several passes per expert) for dense rows of
/// awkward sizes, each routing, weighting and row order.
#[test]
fn dense_experts_match_the_cpu_reference() {
    let mut seed = 1;
    for dtype in [WeightDType::F32, WeightDType::F16] {
        for (tokens, routing) in [
            (1, Routing::Random),
            (37, Routing::Random),
            (13, Routing::Ties),
            (41, Routing::OneForAll),
            // More assignments than one tensor-core tile takes (64), rows past one tile (128).
            (70, Routing::OneForAll),
        ] {
            for (rows, weights, activation, biases) in [
                (
                    per_expert as fn(u32, u32) -> GateUpRows,
                    RouterWeights::SoftmaxOfChosen,
                    ExpertActivation::SwiGlu,
                    false,
                ),
                (
                    gates_then_ups,
                    RouterWeights::SoftmaxOfAll,
                    ExpertActivation::SwiGlu,
                    false,
                ),
                (
                    interleaved,
                    RouterWeights::SoftmaxOfChosen,
                    ExpertActivation::ClampedSwiGlu {
                        alpha: 1.702,
                        limit: 0.8,
                    },
                    true,
                ),
            ] {
                seed += 1;
                run(
                    &Case {
                        tokens,
                        routing,
                        rows,
                        weights,
                        activation,
                        biases,
                        top_k: 3,
                        experts: 7,
                        ..if tokens == 70 {
                            case(Storage::Dense(dtype), 150, 133)
                        } else {
                            case(Storage::Dense(dtype), 45, 21)
                        }
                    },
                    seed,
                );
            }
        }
    }
}

/// Block-quantized experts: every format the expert products decode, decode and prompt.
#[test]
fn block_quantized_experts_match_the_cpu_reference() {
    let mut seed = 100;
    for ty in [
        GgmlType::Mxfp4,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ] {
        let block = ty.block_elems() as u32;
        for (tokens, routing) in [
            (1, Routing::Random),
            (1, Routing::Ties),
            (35, Routing::OneForAll),
        ] {
            seed += 1;
            run(
                &Case {
                    tokens,
                    routing,
                    rows: if ty == GgmlType::Mxfp4 {
                        interleaved
                    } else {
                        gates_then_ups
                    },
                    biases: ty == GgmlType::Mxfp4,
                    ..case(Storage::Blocks(ty), block.max(64), block.max(32))
                },
                seed,
            );
        }
        // An f32 model's layout: float inputs.
        seed += 1;
        run(
            &Case {
                layout: MatVecLayout::for_dtype(WeightDType::F32),
                ..case(Storage::Blocks(ty), block.max(64), block.max(32))
            },
            seed,
        );
    }
}
