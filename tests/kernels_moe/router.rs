//! A router's decode product computed in one workgroup, which then routes the token from its
//! own outputs (shaders/matvec.wgsl ROUTES), against the CPU reference's choice.

use super::route;
use crate::common::{Rng, assert_close, gpu, round_f16};
use backpack_engine::gpu::Recorder;
use backpack_engine::load::{ExpertActivation, MoeSpec, RouterWeights};
use backpack_engine::ops::{
    MatVec, MatVecLayout, MatVecOptions, Matrix, MoeBuffers, NormKind, StepParams, WeightDType,
};

/// A router's decode product in one workgroup that routes the token from its own outputs
/// (`MatVecOptions::routes`, GPT-OSS-20B's 32 experts): with and without the fused RMSNorm, a
/// bias, f32 and f16 rows, both weightings, rows tied in pairs so that a tie straddles the top-k
/// boundary, more rows than one block of 32.
#[test]
fn a_router_product_in_one_workgroup_routes_the_token() {
    let gpu = gpu();
    let mut rng = Rng::new(41);
    // (experts, top_k, hidden, rows' dtype, weighting, tied pairs, the RMSNorm fused)
    let cases = [
        (
            32u32,
            4u32,
            2880u32,
            WeightDType::F32,
            RouterWeights::SoftmaxOfChosen,
            false,
            true,
        ),
        (
            32,
            3,
            200,
            WeightDType::F16,
            RouterWeights::SoftmaxOfChosen,
            true,
            true,
        ),
        (
            6,
            2,
            96,
            WeightDType::F32,
            RouterWeights::SoftmaxOfAll,
            false,
            true,
        ),
        (
            4,
            2,
            64,
            WeightDType::F32,
            RouterWeights::SoftmaxOfChosen,
            false,
            false,
        ),
        (
            64,
            5,
            136,
            WeightDType::F32,
            RouterWeights::SoftmaxOfAll,
            true,
            true,
        ),
    ];
    for (e, k, d, dtype, weighting, tied, normed) in cases {
        let mut w = rng.vec((e * d) as usize, 0.2);
        let mut bias = rng.vec(e as usize, 0.5);
        if tied {
            // Pairs (2i, 2i + 1) alike, each pair well behind the one before.
            for x in (1..e as usize).step_by(2) {
                let (lo, hi) = w.split_at_mut(x * d as usize);
                hi[..d as usize].copy_from_slice(&lo[(x - 1) * d as usize..]);
            }
            for (x, b) in bias.iter_mut().enumerate() {
                *b = -20.0 * (x / 2) as f32;
            }
        }
        let x: Vec<f32> = rng.vec(d as usize, 3.0);
        let gains: Vec<f32> = (0..d).map(|_| 0.5 + rng.uniform()).collect();
        const EPS: f32 = 1e-5;
        let store = |v: &[f32]| gpu.storage_from("test", v).expect("buffer");
        let (x_buf, gain_buf, bias_buf) = (store(&x), store(&gains), store(&bias));
        let router = Matrix::from_f32(&gpu, "router", &w, e, d, dtype).expect("router");
        let moe = MoeSpec {
            experts: e,
            top_k: k,
            intermediate: 32,
            weights: weighting,
            activation: ExpertActivation::SwiGlu,
            biases: false,
            sparse: vec![true],
            shared: false,
        };
        let bufs = MoeBuffers::new(&gpu, &moe, d, 1).expect("buffers");
        let step = gpu.uniform("step", &StepParams::new(0, 1));
        let routing = bufs.token_routing(&moe);
        let mv = MatVec::new(
            &gpu,
            &router,
            &x_buf,
            &bufs.logits,
            &step,
            MatVecOptions {
                norm: normed.then_some((NormKind::Rms, &gain_buf, None, EPS)),
                bias: Some(&bias_buf),
                routes: Some(routing),
                layout: MatVecLayout {
                    lanes: Some(32),
                    rows: Some(1),
                    workgroup: Some(1024),
                    blocks: Some(e.div_ceil(32)),
                    ..MatVecLayout::for_dtype(WeightDType::F32)
                },
                ..Default::default()
            },
        );
        // Routing takes subgroups; adapters without them refuse it.
        let Ok(mv) = mv.map_err(|e| assert!(!gpu.caps().subgroups, "{e}")) else {
            continue;
        };
        let mut rec = Recorder::new(&gpu);
        mv.encode(&mut rec);
        rec.submit();
        let logits: Vec<f32> = gpu
            .read(&bufs.logits.buffer, 0, u64::from(e))
            .expect("read");
        let ids: Vec<u32> = gpu
            .read(&routing.ids.buffer, 0, u64::from(k))
            .expect("read");
        let chosen: Vec<f32> = gpu
            .read(&routing.weights.buffer, 0, u64::from(k))
            .expect("read");

        let what = format!(
            "router of {e}×{d} {dtype:?} top-{k} {weighting:?} tied={tied} normed={normed}"
        );
        let rows = match dtype {
            WeightDType::F16 => round_f16(&w),
            _ => w.clone(),
        };
        let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / d as f32 + EPS).sqrt();
        let xn: Vec<f32> = if normed {
            x.iter().zip(&gains).map(|(v, g)| v * inv * g).collect()
        } else {
            x.clone()
        };
        let want: Vec<f32> = rows
            .chunks(d as usize)
            .zip(&bias)
            .map(|(r, b)| r.iter().zip(&xn).map(|(a, b)| a * b).sum::<f32>() + b)
            .collect();
        let scale: Vec<f32> = rows
            .chunks(d as usize)
            .map(|r| r.iter().zip(&xn).map(|(a, b)| (a * b).abs()).sum::<f32>())
            .collect();
        assert_close(&what, &logits, &want, &scale, 1e-5, 1e-4);
        // The route of the logits the product wrote: the same experts, in the order of choice
        // (ties to the lower expert), and their weights.
        let route_want = route(&logits, k as usize, weighting);
        let ids_want: Vec<u32> = route_want.iter().map(|&(x, _)| x as u32).collect();
        assert_eq!(ids, ids_want, "{what}: chosen experts");
        let weights_want: Vec<f32> = route_want.iter().map(|&(_, v)| v).collect();
        assert_close(
            &what,
            &chosen,
            &weights_want,
            &[1.0; 8][..k as usize],
            1e-6,
            1e-5,
        );
    }
}

/// A router's product that routes the token must fit one workgroup: more rows are refused.
#[test]
fn a_router_product_too_wide_for_one_workgroup_is_refused() {
    let gpu = gpu();
    let (e, d) = (80u32, 64u32);
    let router = Matrix::from_f32(
        &gpu,
        "router",
        &vec![0.0; (e * d) as usize],
        e,
        d,
        WeightDType::F32,
    )
    .expect("router");
    let moe = MoeSpec {
        experts: e,
        top_k: 2,
        intermediate: 32,
        weights: RouterWeights::SoftmaxOfChosen,
        activation: ExpertActivation::SwiGlu,
        biases: false,
        sparse: vec![true],
        shared: false,
    };
    let bufs = MoeBuffers::new(&gpu, &moe, d, 1).expect("buffers");
    let x = gpu.storage_from("x", &vec![1.0f32; d as usize]).expect("x");
    let step = gpu.uniform("step", &StepParams::new(0, 1));
    let refused = MatVec::new(
        &gpu,
        &router,
        &x,
        &bufs.logits,
        &step,
        MatVecOptions {
            routes: Some(bufs.token_routing(&moe)),
            layout: MatVecLayout {
                lanes: Some(32),
                rows: Some(1),
                workgroup: Some(1024),
                blocks: Some(2),
                ..MatVecLayout::for_dtype(WeightDType::F32)
            },
            ..Default::default()
        },
    );
    let Err(e) = refused else {
        panic!("80 rows routed in one workgroup of 64");
    };
    assert!(
        e.to_string().contains("one plain workgroup") || !gpu.caps().subgroups,
        "{e}"
    );
}
