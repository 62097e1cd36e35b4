//! Whisper's audio encoder on the GPU: two convolutions with GELU (as im2col + the tiled
//! product), learned positions, pre-norm transformer layers with full self-attention, and a
//! final LayerNorm. One 30 s window (3000 mel frames) becomes 1500 positions of `d_model`.

use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use crate::models::weights::{Part, Uploader};
use crate::ops::{
    Conv1dShape, FullAttention, FullLayout, Gelu, Im2Col, MatMul, MatMulOptions, Matrix, Norm,
    NormForm, NormKind, StepParams,
};

use super::config::WhisperConfig;

pub(super) const LN_EPS: f32 = 1e-5;

struct EncoderLayer {
    attn_norm: Norm,
    qkv: MatMul,
    attention: FullAttention,
    out: MatMul,
    mlp_norm: Norm,
    fc1: MatMul,
    fc2: MatMul,
    _weights: Vec<Matrix>,
    _vectors: Vec<StorageBuffer>,
}

/// The encoder's weights and activations, resident between windows.
pub struct Encoder {
    /// Input: the window's log-mel spectrogram `[n_mels][frames]`.
    pub mel: StorageBuffer,
    /// Output: `[positions][d_model]`, read by the decoder's cross-attention products.
    pub output: StorageBuffer,
    /// Step uniform with n_tokens = positions (the products over encoder rows use it).
    pub positions_step: UniformBuffer,
    _frames_step: UniformBuffer,
    im2col1: Im2Col,
    conv1: MatMul,
    im2col2: Im2Col,
    conv2: MatMul,
    positions: StorageBuffer,
    x: StorageBuffer,
    layers: Vec<EncoderLayer>,
    final_norm: Norm,
    _stem: Vec<Matrix>,
    _vectors: Vec<StorageBuffer>,
    _scratch: Vec<StorageBuffer>,
    pub positions_len: u32,
}

/// A LayerNorm's weight and bias.
pub(super) fn norm_pair(
    up: &mut Uploader<'_>,
    label: &str,
    prefix: &str,
    d: u32,
) -> Result<(StorageBuffer, StorageBuffer), Error> {
    let w = up.vector(label, &[(&format!("{prefix}.weight"), d)], Some(1.0))?;
    let b = up.vector(label, &[(&format!("{prefix}.bias"), d)], None)?;
    Ok((w, b))
}

/// The shared activations of the encoder layers.
struct Buffers<'a> {
    x: &'a StorageBuffer,
    xn: &'a StorageBuffer,
    qkv: &'a StorageBuffer,
    attn: &'a StorageBuffer,
    h: &'a StorageBuffer,
    step: &'a UniformBuffer,
}

/// The fused self-attention projection of the layer at `prefix` (`model.….layers.N`): the
/// q, k and v rows and their bias, where Whisper's key projection has none.
pub(super) fn fused_qkv(
    up: &mut Uploader<'_>,
    label: &str,
    prefix: &str,
    d: u32,
) -> Result<(Matrix, StorageBuffer), Error> {
    let n = |s: &str| format!("{prefix}.self_attn.{s}");
    let names = [n("q_proj.weight"), n("k_proj.weight"), n("v_proj.weight")];
    let parts: Vec<Part<'_>> = names
        .iter()
        .map(|name| Part {
            name,
            rows: d,
            cols: d,
        })
        .collect();
    let weight = up.matrix(&format!("{label} qkv"), &parts, false)?;
    let bias = up.vector_with_zeros(
        label,
        &[
            (Some(&n("q_proj.bias")), d),
            (None, d),
            (Some(&n("v_proj.bias")), d),
        ],
    )?;
    Ok((weight, bias))
}

fn encoder_layer(
    gpu: &Gpu,
    up: &mut Uploader<'_>,
    cfg: &WhisperConfig,
    i: u32,
    b: &Buffers<'_>,
) -> Result<EncoderLayer, Error> {
    let p = format!("model.encoder.layers.{i}");
    let n = |s: &str| format!("{p}.{s}");
    let (d, ffn) = (cfg.d_model, cfg.encoder_ffn);
    let label = format!("encoder layer {i}");
    let (qkv_w, qkv_b) = fused_qkv(up, &label, &p, d)?;
    let out_name = n("self_attn.out_proj.weight");
    let out_w = up.matrix(
        &format!("{label} out"),
        &[Part {
            name: &out_name,
            rows: d,
            cols: d,
        }],
        false,
    )?;
    let out_b = up.vector(&label, &[(&n("self_attn.out_proj.bias"), d)], None)?;
    let (fc1_name, fc2_name) = (n("fc1.weight"), n("fc2.weight"));
    let fc1_w = up.matrix(
        &format!("{label} fc1"),
        &[Part {
            name: &fc1_name,
            rows: ffn,
            cols: d,
        }],
        false,
    )?;
    let fc1_b = up.vector(&label, &[(&n("fc1.bias"), ffn)], None)?;
    let fc2_w = up.matrix(
        &format!("{label} fc2"),
        &[Part {
            name: &fc2_name,
            rows: d,
            cols: ffn,
        }],
        false,
    )?;
    let fc2_b = up.vector(&label, &[(&n("fc2.bias"), d)], None)?;
    let (an_w, an_b) = norm_pair(up, &label, &n("self_attn_layer_norm"), d)?;
    let (mn_w, mn_b) = norm_pair(up, &label, &n("final_layer_norm"), d)?;
    let heads = cfg.encoder_heads;
    let half = half_activations(gpu, cfg);
    let layer_norm = |w, bias| {
        let form = NormForm {
            half_out: half,
            ..Default::default()
        };
        let (x, y, step) = (b.x, b.xn, b.step);
        Norm::with_form(gpu, NormKind::Layer, d, LN_EPS, w, bias, x, y, step, form)
    };
    let layer = EncoderLayer {
        attn_norm: layer_norm(&an_w, Some(&an_b))?,
        qkv: MatMul::new(
            gpu,
            &qkv_w,
            b.xn,
            b.qkv,
            b.step,
            window_rows(
                cfg.max_source_positions,
                MatMulOptions {
                    bias: Some(&qkv_b),
                    half_in: half,
                    half_out: half,
                    ..Default::default()
                },
            ),
        )?,
        attention: FullAttention::new(
            gpu,
            FullLayout {
                heads,
                kv_heads: heads,
                head_dim: d / heads,
                keys: cfg.max_source_positions,
                q_stride: 3 * d,
                kv_stride: 3 * d,
                k_off: d,
                f16: half,
            },
            b.qkv,
            b.qkv,
            b.attn,
            b.step,
        )?,
        out: MatMul::new(
            gpu,
            &out_w,
            b.attn,
            b.x,
            b.step,
            window_rows(
                cfg.max_source_positions,
                MatMulOptions {
                    bias: Some(&out_b),
                    residual: true,
                    half_in: half,
                    ..Default::default()
                },
            ),
        )?,
        mlp_norm: layer_norm(&mn_w, Some(&mn_b))?,
        fc1: MatMul::new(
            gpu,
            &fc1_w,
            b.xn,
            b.h,
            b.step,
            window_rows(
                cfg.max_source_positions,
                MatMulOptions {
                    bias: Some(&fc1_b),
                    gelu: Some(Gelu::Erf),
                    half_in: half,
                    half_out: half,
                    ..Default::default()
                },
            ),
        )?,
        fc2: MatMul::new(
            gpu,
            &fc2_w,
            b.h,
            b.x,
            b.step,
            window_rows(
                cfg.max_source_positions,
                MatMulOptions {
                    bias: Some(&fc2_b),
                    residual: true,
                    half_in: half,
                    ..Default::default()
                },
            ),
        )?,
        _weights: vec![qkv_w, out_w, fc1_w, fc2_w],
        _vectors: vec![qkv_b, out_b, fc1_b, fc2_b, an_w, an_b, mn_w, mn_b],
    };
    Ok(layer)
}

/// Whether a layer's normalised rows, QKV rows, attention outputs and MLP activations pass
/// between its kernels as f16: on tensor cores, whose products and attention round them to
/// f16 anyway. That halves the bytes written and read back, and the kernels stage them as
/// loaded. On an H200 (`bench-speech`, encoder per 30 s window), large-v3-turbo went from
/// 30.8 to 28.6 ms with the QKV rows alone as f16 (attention 7.7 → 5.7 ms), and to 22.6–23.8
/// ms with everything here and the window's tiles (`ProductRows::Unsplit`).
fn half_activations(gpu: &Gpu, cfg: &WhisperConfig) -> bool {
    gpu.caps().cooperative_matrix
        && cfg.d_model.is_multiple_of(8)
        && cfg.encoder_ffn.is_multiple_of(8)
}

impl Encoder {
    pub fn build(gpu: &Gpu, up: &mut Uploader<'_>, cfg: &WhisperConfig) -> Result<Self, Error> {
        let (d, mels) = (cfg.d_model, cfg.n_mels);
        let frames = cfg.window_frames();
        let positions_len = cfg.max_source_positions;
        let f = |n: u32| u64::from(n) * 4;
        let conv1_shape = Conv1dShape {
            channels: mels,
            in_len: frames,
            taps: 3,
            stride: 1,
            pad: 1,
            channel_major: true,
        };
        let conv2_shape = Conv1dShape {
            channels: d,
            in_len: frames,
            taps: 3,
            stride: 2,
            pad: 1,
            channel_major: false,
        };
        if conv2_shape.out_len() != positions_len {
            return Err(Error::Invalid(format!(
                "{frames} mel frames give {} encoder positions, not max_source_positions {positions_len}",
                conv2_shape.out_len()
            )));
        }
        let conv1_w = up.reshaped_matrix(
            "conv1",
            "model.encoder.conv1.weight",
            &[d as usize, mels as usize, 3],
            d,
            mels * 3,
        )?;
        let conv1_b = up.vector("conv1", &[("model.encoder.conv1.bias", d)], None)?;
        let conv2_w = up.reshaped_matrix(
            "conv2",
            "model.encoder.conv2.weight",
            &[d as usize, d as usize, 3],
            d,
            d * 3,
        )?;
        let conv2_b = up.vector("conv2", &[("model.encoder.conv2.bias", d)], None)?;
        let positions = up.dense(
            "encoder positions",
            "model.encoder.embed_positions.weight",
            positions_len,
            d,
        )?;
        let frames_step = gpu.uniform("encoder frames", &StepParams::new(0, frames));
        let positions_step = gpu.uniform("encoder positions", &StepParams::new(0, positions_len));
        let mel = gpu.storage("mel window", f(mels * frames))?;
        let t = positions_len;
        let cols = gpu.storage("im2col", f((frames * mels * 3).max(t * d * 3)))?;
        // The first convolution's output [frames][d] shares room with the fused QKV rows.
        let qkv = gpu.storage("encoder qkv", f((t * 3 * d).max(frames * d)))?;
        let x = gpu.storage("encoder x", f(t * d))?;
        let xn = gpu.storage("encoder x normed", f(t * d))?;
        let attn = gpu.storage("encoder attention", f(t * d))?;
        let h = gpu.storage("encoder mlp", f(t * cfg.encoder_ffn))?;
        let output = gpu.storage("encoder output", f(t * d))?;
        let im2col1 = Im2Col::new(gpu, conv1_shape, &mel, &cols)?;
        let conv1 = MatMul::new(
            gpu,
            &conv1_w,
            &cols,
            &qkv,
            &frames_step,
            window_rows(
                frames,
                MatMulOptions {
                    bias: Some(&conv1_b),
                    gelu: Some(Gelu::Erf),
                    ..Default::default()
                },
            ),
        )?;
        let im2col2 = Im2Col::new(gpu, conv2_shape, &qkv, &cols)?;
        // x holds the positions when this runs: x = positions + gelu(conv2).
        let conv2 = MatMul::new(
            gpu,
            &conv2_w,
            &cols,
            &x,
            &positions_step,
            window_rows(
                positions_len,
                MatMulOptions {
                    bias: Some(&conv2_b),
                    gelu: Some(Gelu::Erf),
                    residual: true,
                    ..Default::default()
                },
            ),
        )?;
        let buffers = Buffers {
            x: &x,
            xn: &xn,
            qkv: &qkv,
            attn: &attn,
            h: &h,
            step: &positions_step,
        };
        let mut layers = Vec::with_capacity(cfg.encoder_layers as usize);
        for i in 0..cfg.encoder_layers {
            layers.push(encoder_layer(gpu, up, cfg, i, &buffers)?);
        }
        let (fw, fb) = norm_pair(up, "encoder norm", "model.encoder.layer_norm", d)?;
        let final_norm = Norm::new(
            gpu,
            NormKind::Layer,
            d,
            LN_EPS,
            &fw,
            Some(&fb),
            &x,
            &output,
            &positions_step,
        )?;
        Ok(Self {
            mel,
            output,
            positions_step,
            _frames_step: frames_step,
            im2col1,
            conv1,
            im2col2,
            conv2,
            positions,
            x,
            layers,
            final_norm,
            _stem: vec![conv1_w, conv2_w],
            _vectors: vec![conv1_b, conv2_b, fw, fb],
            _scratch: vec![cols, qkv, xn, attn, h],
            positions_len,
        })
    }

    /// Records the encoder over the window already written to `mel`.
    pub fn encode(&self, rec: &mut Recorder<'_>) {
        let t = self.positions_len;
        self.im2col1.encode(rec);
        self.conv1.encode(rec, t * 2);
        self.im2col2.encode(rec);
        rec.copy(
            &self.positions.buffer,
            0,
            &self.x.buffer,
            0,
            self.positions.size,
        );
        self.conv2.encode(rec, t);
        for l in &self.layers {
            l.attn_norm.encode(rec, t);
            l.qkv.encode(rec, t);
            l.attention.encode(rec, t);
            l.out.encode(rec, t);
            l.mlp_norm.encode(rec, t);
            l.fc1.encode(rec, t);
            l.fc2.encode(rec, t);
        }
        self.final_norm.encode(rec, t);
    }
}

/// The encoder's products always run a whole window of `rows` (1500, or 3000 for the first
/// convolution): the tensor-core tiles size themselves to it, and a CPU adapter's own tiles
/// win at any width there: lavapipe (`bench-gemm`) runs 1500×96×96 in 3.9 ms on them and in
/// 49 ms on the SIMT tiles, which the engine keeps for products of fewer weights since an
/// LLM's prompt may be a few rows.
pub(super) fn window_rows(rows: u32, opts: MatMulOptions<'_>) -> MatMulOptions<'_> {
    MatMulOptions {
        cpu_tiles: Some(true),
        rows: Some(rows),
        ..opts
    }
}
