//! One layer of Whisper's decoder on the GPU: its weights (self-attention, cross-attention
//! over the encoder, GELU MLP, three LayerNorms), the prompt path of tiled products and the
//! one-token path of mat-vec kernels, and the projection of the encoder output into the
//! layer's cross keys and values.

use crate::Error;
use crate::gpu::{Gpu, StorageBuffer, UniformBuffer};
use crate::models::weights::{Part, Uploader};
use crate::ops::{
    Attention, CacheShape, FullAttention, FullLayout, Gelu, MatMul, MatMulOptions, MatVec,
    MatVecLayout, MatVecOptions, Matrix, Norm, NormKind, RopeKv, SplitAttention, WeightDType,
};

use super::config::WhisperConfig;
use super::encoder::{LN_EPS, fused_qkv, norm_pair};

pub(super) type NormPair = (StorageBuffer, StorageBuffer);

pub(super) struct LayerWeights {
    pub(super) self_norm: NormPair,
    pub(super) qkv: Matrix,
    pub(super) qkv_b: StorageBuffer,
    pub(super) out: Matrix,
    pub(super) out_b: StorageBuffer,
    pub(super) cross_norm: NormPair,
    pub(super) cross_q: Matrix,
    pub(super) cross_q_b: StorageBuffer,
    pub(super) cross_kv: Matrix,
    pub(super) cross_kv_b: StorageBuffer,
    pub(super) cross_out: Matrix,
    pub(super) cross_out_b: StorageBuffer,
    pub(super) mlp_norm: NormPair,
    pub(super) fc1: Matrix,
    pub(super) fc1_b: StorageBuffer,
    pub(super) fc2: Matrix,
    pub(super) fc2_b: StorageBuffer,
}

pub(super) struct Layer {
    // Prompt path.
    pub(super) self_norm: Norm,
    pub(super) qkv_mm: MatMul,
    pub(super) store_kv: RopeKv,
    pub(super) self_attention: Attention,
    pub(super) out_mm: MatMul,
    pub(super) cross_norm: Norm,
    pub(super) cross_q_mm: MatMul,
    pub(super) cross_attention: FullAttention,
    pub(super) cross_out_mm: MatMul,
    pub(super) mlp_norm: Norm,
    pub(super) fc1_mm: MatMul,
    pub(super) fc2_mm: MatMul,
    // One-token path.
    pub(super) qkv_mv: MatVec,
    pub(super) split_attention: Attention,
    pub(super) out_mv: MatVec,
    pub(super) cross_q_mv: MatVec,
    pub(super) cross_out_mv: MatVec,
    pub(super) fc1_mv: MatVec,
    pub(super) fc2_mv: MatVec,
    /// The encoder output projected to this layer's cross keys and values `[positions][2d]`.
    pub(super) cross_kv_mm: MatMul,
    pub(super) _weights: LayerWeights,
    pub(super) _buffers: Vec<StorageBuffer>,
}

/// Activations for one prompt batch, shared by the layers.
pub(super) struct Acts {
    pub(super) x: StorageBuffer,
    pub(super) xn: StorageBuffer,
    pub(super) qkv: StorageBuffer,
    pub(super) q: StorageBuffer,
    pub(super) attn: StorageBuffer,
    pub(super) h: StorageBuffer,
    pub(super) logits: StorageBuffer,
    pub(super) history: StorageBuffer,
    pub(super) seen: StorageBuffer,
    pub(super) scores: StorageBuffer,
    pub(super) partials: StorageBuffer,
    pub(super) stats: StorageBuffer,
}

fn single(
    up: &mut Uploader<'_>,
    label: &str,
    name: &str,
    rows: u32,
    cols: u32,
) -> Result<Matrix, Error> {
    up.matrix(label, &[Part { name, rows, cols }], false)
}

pub(super) fn layer_weights(
    up: &mut Uploader<'_>,
    cfg: &WhisperConfig,
    i: u32,
) -> Result<LayerWeights, Error> {
    let n = |s: &str| format!("model.decoder.layers.{i}.{s}");
    let (d, ffn) = (cfg.d_model, cfg.decoder_ffn);
    let label = format!("decoder layer {i}");
    let (qkv, qkv_b) = fused_qkv(up, &label, &format!("model.decoder.layers.{i}"), d)?;
    let (ck, cv) = (
        n("encoder_attn.k_proj.weight"),
        n("encoder_attn.v_proj.weight"),
    );
    let cross_kv = up.matrix(
        &format!("{label} cross kv"),
        &[
            Part {
                name: &ck,
                rows: d,
                cols: d,
            },
            Part {
                name: &cv,
                rows: d,
                cols: d,
            },
        ],
        false,
    )?;
    let cross_kv_b = up.vector_with_zeros(
        &label,
        &[(None, d), (Some(&n("encoder_attn.v_proj.bias")), d)],
    )?;
    Ok(LayerWeights {
        self_norm: norm_pair(up, &label, &n("self_attn_layer_norm"), d)?,
        qkv,
        qkv_b,
        out: single(
            up,
            &format!("{label} out"),
            &n("self_attn.out_proj.weight"),
            d,
            d,
        )?,
        out_b: up.vector(&label, &[(&n("self_attn.out_proj.bias"), d)], None)?,
        cross_norm: norm_pair(up, &label, &n("encoder_attn_layer_norm"), d)?,
        cross_q: single(
            up,
            &format!("{label} cross q"),
            &n("encoder_attn.q_proj.weight"),
            d,
            d,
        )?,
        cross_q_b: up.vector(&label, &[(&n("encoder_attn.q_proj.bias"), d)], None)?,
        cross_kv,
        cross_kv_b,
        cross_out: single(
            up,
            &format!("{label} cross out"),
            &n("encoder_attn.out_proj.weight"),
            d,
            d,
        )?,
        cross_out_b: up.vector(&label, &[(&n("encoder_attn.out_proj.bias"), d)], None)?,
        mlp_norm: norm_pair(up, &label, &n("final_layer_norm"), d)?,
        fc1: single(up, &format!("{label} fc1"), &n("fc1.weight"), ffn, d)?,
        fc1_b: up.vector(&label, &[(&n("fc1.bias"), ffn)], None)?,
        fc2: single(up, &format!("{label} fc2"), &n("fc2.weight"), d, ffn)?,
        fc2_b: up.vector(&label, &[(&n("fc2.bias"), d)], None)?,
    })
}

type FusedNorm<'a> = Option<(NormKind, &'a StorageBuffer, Option<&'a StorageBuffer>, f32)>;

fn fused(n: &NormPair) -> FusedNorm<'_> {
    Some((NormKind::Layer, &n.0, Some(&n.1), LN_EPS))
}

fn bias(v: &StorageBuffer) -> MatMulOptions<'_> {
    MatMulOptions {
        bias: Some(v),
        ..Default::default()
    }
}

fn bias_res(v: &StorageBuffer) -> MatMulOptions<'_> {
    MatMulOptions {
        bias: Some(v),
        residual: true,
        ..Default::default()
    }
}

/// What the layers bind: activations, step uniforms and the encoder.
pub(super) struct Binding<'a> {
    pub(super) acts: &'a Acts,
    pub(super) step: &'a UniformBuffer,
    pub(super) encoder_out: &'a StorageBuffer,
    pub(super) encoder_step: &'a UniformBuffer,
    pub(super) positions: u32,
    pub(super) capacity: u32,
    pub(super) dtype: WeightDType,
}

pub(super) fn build_layer(
    gpu: &Gpu,
    cfg: &WhisperConfig,
    w: LayerWeights,
    b: &Binding<'_>,
) -> Result<Layer, Error> {
    let (d, heads) = (cfg.d_model, cfg.decoder_heads);
    let hd = d / heads;
    let a = b.acts;
    let step = b.step;
    let cache_len = u64::from(heads) * u64::from(b.capacity) * u64::from(hd) * b.dtype.bytes();
    let k_cache = gpu.storage("decoder k cache", cache_len)?;
    let v_cache = gpu.storage("decoder v cache", cache_len)?;
    let cross_kv = gpu.storage("cross kv", u64::from(b.positions) * u64::from(2 * d) * 4)?;
    let ln = |n: &NormPair, x: &StorageBuffer, y: &StorageBuffer| {
        Norm::new(
            gpu,
            NormKind::Layer,
            d,
            LN_EPS,
            &n.0,
            Some(&n.1),
            x,
            y,
            step,
        )
    };
    let mm = |m: &Matrix, x: &StorageBuffer, y: &StorageBuffer, opts: MatMulOptions<'_>| {
        MatMul::new(gpu, m, x, y, step, opts)
    };
    let cross_layout = FullLayout {
        heads,
        kv_heads: heads,
        head_dim: hd,
        keys: b.positions,
        q_stride: d,
        kv_stride: 2 * d,
        k_off: 0,
        f16: false,
    };
    let cache = CacheShape::new(heads, heads, hd, b.capacity, b.dtype);
    Ok(Layer {
        self_norm: ln(&w.self_norm, &a.x, &a.xn)?,
        qkv_mm: mm(&w.qkv, &a.xn, &a.qkv, bias(&w.qkv_b))?,
        store_kv: RopeKv::new(gpu, cache, None, &a.qkv, &a.q, &k_cache, &v_cache, step)?,
        self_attention: Attention::new(gpu, cache, &a.q, &k_cache, &v_cache, &a.attn, step)?,
        out_mm: mm(&w.out, &a.attn, &a.x, bias_res(&w.out_b))?,
        cross_norm: ln(&w.cross_norm, &a.x, &a.xn)?,
        cross_q_mm: mm(&w.cross_q, &a.xn, &a.q, bias(&w.cross_q_b))?,
        cross_attention: FullAttention::new(gpu, cross_layout, &a.q, &cross_kv, &a.attn, step)?,
        cross_out_mm: mm(&w.cross_out, &a.attn, &a.x, bias_res(&w.cross_out_b))?,
        mlp_norm: ln(&w.mlp_norm, &a.x, &a.xn)?,
        fc1_mm: mm(
            &w.fc1,
            &a.xn,
            &a.h,
            MatMulOptions {
                bias: Some(&w.fc1_b),
                gelu: Some(Gelu::Erf),
                ..Default::default()
            },
        )?,
        fc2_mm: mm(&w.fc2, &a.h, &a.x, bias_res(&w.fc2_b))?,
        qkv_mv: MatVec::new(
            gpu,
            &w.qkv,
            &a.x,
            &a.qkv,
            step,
            MatVecOptions {
                norm: fused(&w.self_norm),
                bias: Some(&w.qkv_b),
                layout: MatVecLayout::for_dtype(b.dtype),
                ..Default::default()
            },
        )?,
        split_attention: Attention::new_split(
            gpu,
            cache,
            &a.qkv,
            None,
            &k_cache,
            &v_cache,
            &a.partials,
            &a.stats,
            None,
            step,
        )?,
        out_mv: MatVec::new(
            gpu,
            &w.out,
            &a.attn,
            &a.x,
            step,
            MatVecOptions {
                bias: Some(&w.out_b),
                residual: true,
                combine: Some(SplitAttention {
                    partials: &a.partials,
                    stats: &a.stats,
                    heads,
                    head_dim: hd,
                    window: None,
                    gate: None,
                    sinks: None,
                }),
                layout: MatVecLayout::for_dtype(b.dtype),
                ..Default::default()
            },
        )?,
        cross_q_mv: MatVec::new(
            gpu,
            &w.cross_q,
            &a.x,
            &a.q,
            step,
            MatVecOptions {
                norm: fused(&w.cross_norm),
                bias: Some(&w.cross_q_b),
                layout: MatVecLayout::for_dtype(b.dtype),
                ..Default::default()
            },
        )?,
        cross_out_mv: MatVec::new(
            gpu,
            &w.cross_out,
            &a.attn,
            &a.x,
            step,
            MatVecOptions {
                bias: Some(&w.cross_out_b),
                residual: true,
                layout: MatVecLayout::for_dtype(b.dtype),
                ..Default::default()
            },
        )?,
        fc1_mv: MatVec::new(
            gpu,
            &w.fc1,
            &a.x,
            &a.h,
            step,
            MatVecOptions {
                norm: fused(&w.mlp_norm),
                bias: Some(&w.fc1_b),
                gelu: Some(Gelu::Erf),
                layout: MatVecLayout::for_dtype(b.dtype),
                ..Default::default()
            },
        )?,
        fc2_mv: MatVec::new(
            gpu,
            &w.fc2,
            &a.h,
            &a.x,
            step,
            MatVecOptions {
                bias: Some(&w.fc2_b),
                residual: true,
                layout: MatVecLayout::for_dtype(b.dtype),
                ..Default::default()
            },
        )?,
        cross_kv_mm: MatMul::new(
            gpu,
            &w.cross_kv,
            b.encoder_out,
            &cross_kv,
            b.encoder_step,
            // The keys and values of the encoder's whole window.
            super::encoder::window_rows(cfg.max_source_positions, bias(&w.cross_kv_b)),
        )?,
        _weights: w,
        _buffers: vec![k_cache, v_cache, cross_kv],
    })
}
