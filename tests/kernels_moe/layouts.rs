//! The decode products' layouts on an NVIDIA H200 (the device the speed figures come from),
//! pinned to the kernels those measurements ran: the layout heuristics for GPU adapters never
//! run on the CPU adapter the tests use, so a change to them would otherwise pass unseen.

use crate::common::gpu;
use backpack_engine::gpu::GpuCaps;
use backpack_engine::load::GgmlType;
use backpack_engine::ops::{
    ExpertSlots, Int8Handoff, MatVec, MatVecLayout, MatVecOptions, Matrix, NormKind,
    SplitAttention, TokenRouting, WeightDType,
};

/// What wgpu reports for an NVIDIA H200 under Vulkan (driver 580, see PLATFORM.md).
fn h200() -> GpuCaps {
    GpuCaps {
        shader_f16: true,
        subgroups: true,
        subgroup_min_size: 32,
        subgroup_max_size: 32,
        timestamps: true,
        max_storage_binding: (2 << 30) - 4,
        max_buffer: 4 << 30,
        max_workgroup_storage: 48 * 1024,
        max_workgroup_invocations: 1024,
        max_workgroup_size_x: 1024,
        runtime_checks: false,
        cooperative_matrix: true,
    }
}

fn label(defines: &[(&'static str, String)]) -> String {
    defines
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// GPT-OSS-20B's decode products as `backpack bench --profile` labelled them on an H200
/// (MXFP4 experts, Q8_0 attention; `bench_llamacpp.sh --config
/// tests/reference/configs/gpt-oss-20b.json --formats mxfp4`, the run in performance.md):
/// the expert gate/up product (biases, clamped SwiGLU, four slots; its input the router's
/// handoff, its hidden rows handed to the down product, both in two levels), the expert down
/// product (a row of the input a slot), the QKV product (fused RMSNorm, bias), the output
/// products merging split attention with sinks (full and sliding-window layers; workgroups of
/// 1,024, measured as `BACKPACK_MATVEC=wg=1024` forced them on the layout before) and the f32
/// router's product routing the token in one workgroup and handing off its normalised input
/// (the layout layer.rs asks for).
#[test]
fn gpt_oss_decode_products_keep_their_h200_layouts() {
    let gpu = gpu();
    let caps = h200();
    let matrix = |ty: GgmlType, rows: u32, cols: u32| {
        let bytes = rows as usize * (cols as usize / 32) * ty.block_bytes();
        Matrix::from_blocks(&gpu, "w", ty, &vec![0u8; bytes], rows, cols).expect("matrix")
    };
    let store = |n: usize| gpu.storage_from("test", &vec![0.0f32; n]).expect("buffer");
    let (ids, gains, bias) = (store(4), store(2880), store(5760));
    let (weights, partials, stats, sinks) = (store(4), store(4096), store(128), store(64));
    // One expert's rows: the layout goes by the rows of a slot, the slots and the row length.
    let gate_up = matrix(GgmlType::Mxfp4, 2 * 2880, 2880);
    let down = matrix(GgmlType::Mxfp4, 2880, 2880);
    let qkv = matrix(GgmlType::Q8_0, 5120, 2880);
    let out = matrix(GgmlType::Q8_0, 2880, 4096);
    let router = Matrix::from_f32(
        &gpu,
        "router",
        &vec![0.0; 32 * 2880],
        32,
        2880,
        WeightDType::F32,
    )
    .expect("router");
    let split = |window| SplitAttention {
        partials: &partials,
        stats: &stats,
        heads: 64,
        head_dim: 64,
        window,
        gate: None,
        sinks: Some(&sinks),
    };
    let output = |window| MatVecOptions {
        bias: Some(&bias),
        residual: true,
        combine: Some(split(window)),
        ..Default::default()
    };
    const OUTPUT: &str = "BIAS=1,CLAMPED=0,COMBINE=1,EPV=4,EXPERTS=0,F16=0,GAIN4=0,GATED=0,GELU=0,GELU_ERF=0,GLU=0,HANDS_OFF=0,HAND_INPUT=0,IN_PER_SLOT=0,KPAIR=0,KQ=0,LANE_UNITS=4,LEVELS=1,MAX_SPLITS=16,MIN_SPLIT=64,NORM=0,NORM_LAYER=0,NR=2,OUT_BLOCK=32,OUT_FINE=0,OUT_GAIN=0,OUT_LEVELS=1,PIPE=0,PIPE_NEXT=0,Q5=0,Q8_0=1,QDOT=1,QUANT=1,QUICK_GELU=0,RB=1,RESIDUAL=1,RMS_LATE=0,ROUTED=0,ROUTED_SG=0,ROUTES=0,ROUTING=0,ROW_VECS=1024,SGX=1,SINKS=1,SOFTMAX_ALL=0,SUBGROUP=1,SUBS=128,TOP_K=1,TPR=32,UNITS=128,UNIT_TAIL=0,UNROLL=4,WG=1024,WINDOW=";
    let (output_full, output_window) = (
        format!(
            "{OUTPUT}4294967295,XCACHE=1,XQ8=1,XQ8_FINE=0,XQ8_IN=0,XQ8_OUT=0,XQ8_VIEW=1,XVEC4=0"
        ),
        format!("{OUTPUT}128,XCACHE=1,XQ8=1,XQ8_FINE=0,XQ8_IN=0,XQ8_OUT=0,XQ8_VIEW=1,XVEC4=0"),
    );
    let slots = |rows, per_slot, clamp| ExpertSlots {
        ids: &ids,
        slots: 4,
        experts: 32,
        rows,
        expert_stride: 2 * 2880,
        row_step: 2,
        up_offset: 1,
        input_per_slot: per_slot,
        clamp,
        route: None,
    };
    // MXFP4 experts take two-level int8 inputs (see moe_decode.rs).
    let fine = MatVecLayout {
        int8_fine: Some(true),
        ..MatVecLayout::default()
    };
    let norm = Some((NormKind::Rms, &gains, None, 1e-5));
    // The router's product hands the normalised row to the gate/up product, which hands the
    // slots' hidden rows to the down product, in two levels.
    let input = Int8Handoff::with_rows(&gpu, 2880, 1, 2).expect("handoff");
    let hidden = Int8Handoff::with_rows(&gpu, 2880, 4, 2).expect("handoff");
    let cases = [
        (
            "gate/up",
            &gate_up,
            MatVecOptions {
                layout: fine,
                bias: Some(&bias),
                glu: true,
                experts: Some(slots(2880, false, Some((1.702, 7.0)))),
                handoff_in: Some(&input),
                handoff_out: Some((&hidden, None)),
                ..Default::default()
            },
            "BIAS=1,CLAMPED=1,COMBINE=0,EPV=4,EXPERTS=1,F16=0,GAIN4=0,GATED=0,GELU=0,GELU_ERF=0,GLU=1,HANDS_OFF=1,HAND_INPUT=0,IN_PER_SLOT=0,KPAIR=0,KQ=0,LANE_UNITS=3,LEVELS=2,MAX_SPLITS=16,MIN_SPLIT=64,MXFP4=1,NORM=0,NORM_LAYER=0,NR=1,OUT_BLOCK=32,OUT_FINE=1,OUT_GAIN=0,OUT_LEVELS=2,PIPE=0,PIPE_NEXT=0,Q5=0,QDOT=1,QUANT=1,QUICK_GELU=0,RB=4,RESIDUAL=0,RMS_LATE=0,ROUTED=0,ROUTED_SG=0,ROUTES=0,ROUTING=0,ROW_VECS=720,SGX=1,SINKS=0,SOFTMAX_ALL=0,SUBGROUP=1,SUBS=90,TOP_K=4,TPR=32,UNITS=90,UNIT_TAIL=1,UNROLL=1,WG=256,WINDOW=4294967295,XCACHE=0,XQ8=1,XQ8_FINE=1,XQ8_IN=1,XQ8_OUT=1,XQ8_VIEW=1,XVEC4=0",
        ),
        (
            "down",
            &down,
            MatVecOptions {
                layout: fine,
                experts: Some(slots(2880, true, None)),
                handoff_in: Some(&hidden),
                ..Default::default()
            },
            "BIAS=0,CLAMPED=0,COMBINE=0,EPV=4,EXPERTS=1,F16=0,GAIN4=0,GATED=0,GELU=0,GELU_ERF=0,GLU=0,HANDS_OFF=0,HAND_INPUT=0,IN_PER_SLOT=1,KPAIR=0,KQ=0,LANE_UNITS=3,LEVELS=2,MAX_SPLITS=16,MIN_SPLIT=64,MXFP4=1,NORM=0,NORM_LAYER=0,NR=1,OUT_BLOCK=16,OUT_FINE=0,OUT_GAIN=0,OUT_LEVELS=1,PIPE=0,PIPE_NEXT=0,Q5=0,QDOT=1,QUANT=1,QUICK_GELU=0,RB=2,RESIDUAL=0,RMS_LATE=0,ROUTED=0,ROUTED_SG=0,ROUTES=0,ROUTING=0,ROW_VECS=720,SGX=1,SINKS=0,SOFTMAX_ALL=0,SUBGROUP=1,SUBS=90,TOP_K=4,TPR=32,UNITS=90,UNIT_TAIL=1,UNROLL=1,WG=256,WINDOW=4294967295,XCACHE=0,XQ8=1,XQ8_FINE=1,XQ8_IN=1,XQ8_OUT=0,XQ8_VIEW=1,XVEC4=0",
        ),
        (
            "QKV",
            &qkv,
            MatVecOptions {
                norm,
                bias: Some(&bias),
                ..Default::default()
            },
            "BIAS=1,CLAMPED=0,COMBINE=0,EPV=4,EXPERTS=0,F16=0,GAIN4=1,GATED=0,GELU=0,GELU_ERF=0,GLU=0,HANDS_OFF=0,HAND_INPUT=0,IN_PER_SLOT=0,KPAIR=0,KQ=0,LANE_UNITS=3,LEVELS=1,MAX_SPLITS=16,MIN_SPLIT=64,NORM=1,NORM_LAYER=0,NR=1,OUT_BLOCK=16,OUT_FINE=0,OUT_GAIN=0,OUT_LEVELS=1,PIPE=1,PIPE_NEXT=0,Q5=0,Q8_0=1,QDOT=1,QUANT=1,QUICK_GELU=0,RB=1,RESIDUAL=0,RMS_LATE=1,ROUTED=0,ROUTED_SG=0,ROUTES=0,ROUTING=0,ROW_VECS=720,SGX=1,SINKS=0,SOFTMAX_ALL=0,SUBGROUP=1,SUBS=90,TOP_K=1,TPR=32,UNITS=90,UNIT_TAIL=1,UNROLL=3,WG=256,WINDOW=4294967295,XCACHE=0,XQ8=1,XQ8_FINE=0,XQ8_IN=0,XQ8_OUT=0,XQ8_VIEW=1,XVEC4=1",
        ),
    ];
    let router_opts = MatVecOptions {
        norm,
        bias: Some(&bias),
        routes: Some(TokenRouting {
            ids: &ids,
            weights: &weights,
            top_k: 4,
            softmax_all: false,
        }),
        handoff_input: Some(&input),
        layout: MatVecLayout {
            lanes: Some(32),
            rows: Some(1),
            workgroup: Some(1024),
            blocks: Some(1),
            ..MatVecLayout::for_dtype(WeightDType::F32)
        },
        ..Default::default()
    };
    let more = [
        ("output", &out, output(None), output_full.as_str()),
        (
            "sliding-window output",
            &out,
            output(Some(128)),
            output_window.as_str(),
        ),
        (
            "router",
            &router,
            router_opts,
            "BIAS=1,CLAMPED=0,COMBINE=0,EPV=4,EXPERTS=0,F16=0,GAIN4=1,GATED=0,GELU=0,GELU_ERF=0,GLU=0,HANDS_OFF=1,HAND_INPUT=1,IN_PER_SLOT=0,KPAIR=0,LANE_UNITS=0,LEVELS=1,MAX_SPLITS=16,MIN_SPLIT=64,NORM=1,NORM_LAYER=0,NR=1,OUT_BLOCK=32,OUT_FINE=1,OUT_GAIN=0,OUT_LEVELS=2,PIPE=0,PIPE_NEXT=0,QDOT=1,QUICK_GELU=0,RB=1,RESIDUAL=0,RMS_LATE=0,ROUTED=0,ROUTED_SG=0,ROUTES=1,ROUTING=1,ROW_VECS=720,SGX=1,SINKS=0,SOFTMAX_ALL=0,SUBGROUP=1,TOP_K=4,TPR=32,UNITS=720,UNIT_TAIL=0,UNROLL=0,WG=1024,WINDOW=4294967295,XCACHE=1,XQ8=0,XQ8_FINE=0,XQ8_IN=0,XQ8_OUT=0,XQ8_VIEW=0,XVEC4=1",
        ),
    ];
    for (name, w, opts, want) in cases.into_iter().chain(more) {
        let got = MatVec::layout_defines(&caps, w, &opts).expect("layout");
        assert_eq!(label(&got), want, "{name}: the H200 layout changed");
    }
}
