use std::sync::LazyLock;

use bytemuck::{Pod, Zeroable};

use super::{Matrix, bind, flag, groups_of_64};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const EMBED_SOURCE: &str = include_str!("../../../shaders/embed.wgsl");
/// The gated forms, shared with the prompt products that gate in their epilogue.
pub(super) const GLU_FORMS: &str = include_str!("../../../shaders/glu_forms.wgsl");

static GLU_SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{GLU_FORMS}\n{}", include_str!("../../../shaders/glu.wgsl")));

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct EmbedParams {
    dim: u32,
    row_stride: u32,
    vocab: u32,
    scale: f32,
}

/// Gathers embedding rows for the step's tokens from the history buffer (plus learned
/// positions when given, times `scale`) and marks the tokens as seen.
pub struct Embed {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    per_token: u32,
    _params: UniformBuffer,
}

impl Embed {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        table: &Matrix,
        positions: Option<&StorageBuffer>,
        history: &StorageBuffer,
        seen: &StorageBuffer,
        x: &StorageBuffer,
        step: &UniformBuffer,
        scale: f32,
    ) -> Result<Self, GpuError> {
        Self::build(gpu, table, positions, [history, seen, x], step, scale, None)
    }

    /// As [`Embed::new`] for a batched decode step: row t embeds the token at position
    /// `rows[t].x` of the history starting at `rows[t].z`, and marks it in the seen set at
    /// `rows[t].w` (`rows`: the step's [`super::BatchRows`]).
    #[allow(clippy::too_many_arguments)]
    pub fn batched(
        gpu: &Gpu,
        table: &Matrix,
        positions: Option<&StorageBuffer>,
        [history, seen, x]: [&StorageBuffer; 3],
        step: &UniformBuffer,
        rows: &UniformBuffer,
        scale: f32,
    ) -> Result<Self, GpuError> {
        Self::build(
            gpu,
            table,
            positions,
            [history, seen, x],
            step,
            scale,
            Some(rows),
        )
    }

    fn build(
        gpu: &Gpu,
        table: &Matrix,
        positions: Option<&StorageBuffer>,
        [history, seen, x]: [&StorageBuffer; 3],
        step: &UniformBuffer,
        scale: f32,
        batch: Option<&UniformBuffer>,
    ) -> Result<Self, GpuError> {
        let quantized = table.quant.is_some();
        if quantized && positions.is_some() {
            return Err(GpuError::Device(
                "learned positions with a block-quantized embedding are not supported".into(),
            ));
        }
        let mut defines = table.defines();
        defines.push(flag("POSITIONS", positions.is_some()));
        defines.push(flag("BATCH", batch.is_some()));
        let kernel = if quantized {
            defines.push(("QGATHER", "1".into()));
            gpu.kernel(
                "embed_q",
                super::quant_source::QUANT_EMBED.as_str(),
                "main",
                &defines,
            )?
        } else {
            gpu.kernel("embed", EMBED_SOURCE, "main", &defines)?
        };
        let params = gpu.uniform(
            "embed params",
            &EmbedParams {
                dim: table.cols,
                // Quantized: this field carries the word offset of the block scales.
                row_stride: if quantized {
                    table.q_scales()
                } else {
                    table.row_stride()
                },
                vocab: table.rows,
                scale,
            },
        );
        let mut entries = vec![
            (0, &params.buffer),
            (1, &step.buffer),
            (2, &history.buffer),
            (3, &table.buffer.buffer),
            (4, &x.buffer),
            (5, &seen.buffer),
        ];
        if let Some(p) = positions {
            entries.push((6, &p.buffer));
        }
        if let Some(rows) = batch {
            entries.push((super::BATCH_ROWS_BINDING, &rows.buffer));
        }
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Self {
            kernel,
            bind_group,
            // Invocations per token: one per element, or one per 32-weight sub-block.
            per_token: if quantized {
                table.cols / 32
            } else {
                table.cols
            },
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        rec.dispatch(
            &self.kernel,
            &self.bind_group,
            groups_of_64(n_tokens * self.per_token),
        );
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GluParams {
    width: u32,
    _pad: [u32; 3],
}

/// How a fused gate/up product's two blocks of outputs combine (glu.wgsl, and the tensor-core
/// products that gate in their epilogue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GluKind {
    /// SwiGLU: silu(gate) · up, the gate block first.
    Silu,
    /// Gemma's GeGLU: gelu_tanh(gate) · up, the gate block first.
    GeluTanh,
    /// diffusers' GEGLU: value · gelu(gate) (exact GELU), the value block first.
    GeluErf,
}

impl GluKind {
    /// The shader define that selects the form (none for SwiGLU).
    pub(crate) fn defines(self) -> [(&'static str, String); 2] {
        [
            flag("GEGLU", self == Self::GeluErf),
            flag("GATE_TANH", self == Self::GeluTanh),
        ]
    }
}

/// silu(gate) * up (or a GELU-gated form) over the fused gate/up product of a prompt.
pub struct Glu {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    width: u32,
    _params: UniformBuffer,
}

impl Glu {
    pub fn new(
        gpu: &Gpu,
        kind: GluKind,
        width: u32,
        gate_up: &StorageBuffer,
        h: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let mut defines = kind.defines().to_vec();
        defines.push(flag("GLU", true));
        defines.push(flag("V4", width.is_multiple_of(4)));
        let kernel = gpu.kernel("glu", GLU_SOURCE.as_str(), "main", &defines)?;
        let params = gpu.uniform(
            "glu params",
            &GluParams {
                width,
                _pad: [0; 3],
            },
        );
        let bind_group = bind(
            gpu,
            &kernel,
            &[
                (0, &params.buffer),
                (1, &step.buffer),
                (2, &gate_up.buffer),
                (3, &h.buffer),
            ],
        );
        Ok(Self {
            kernel,
            bind_group,
            width,
            _params: params,
        })
    }

    /// Values per invocation (glu.wgsl's V4).
    fn lanes(&self) -> u32 {
        if self.width.is_multiple_of(4) { 4 } else { 1 }
    }

    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        rec.dispatch(
            &self.kernel,
            &self.bind_group,
            (n_tokens * self.width / self.lanes()).div_ceil(256),
        );
    }
}

const OUT_GATE_SOURCE: &str = include_str!("../../../shaders/out_gate.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct OutGateParams {
    heads: u32,
    head_dim: u32,
    row_slots: u32,
    _pad: u32,
}

/// Gated attention's output gate (Qwen3.5), in place on the attention output: each value
/// times sigmoid of its gate, read from the gate head after its query head in the QKV rows.
pub struct OutputGate {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    width: u32,
    _params: UniformBuffer,
}

impl OutputGate {
    pub fn new(
        gpu: &Gpu,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        qkv: &StorageBuffer,
        attn: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        Self::with(
            gpu,
            false,
            heads,
            head_dim,
            2 * heads + 2 * kv_heads,
            qkv,
            attn,
            step,
        )
    }

    /// Rows of `width` values of `values`, each scaled in place by sigmoid of its own gate
    /// `gates[t]` (Qwen3.5-MoE's shared expert).
    pub fn rows(
        gpu: &Gpu,
        width: u32,
        gates: &StorageBuffer,
        values: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        Self::with(gpu, true, 1, width, 0, gates, values, step)
    }

    #[allow(clippy::too_many_arguments)]
    fn with(
        gpu: &Gpu,
        rows: bool,
        heads: u32,
        head_dim: u32,
        row_slots: u32,
        qkv: &StorageBuffer,
        attn: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let kernel = gpu.kernel("out_gate", OUT_GATE_SOURCE, "main", &[flag("ROWS", rows)])?;
        let params = gpu.uniform(
            "output gate params",
            &OutGateParams {
                heads,
                head_dim,
                row_slots,
                _pad: 0,
            },
        );
        let bind_group = bind(
            gpu,
            &kernel,
            &[
                (0, &params.buffer),
                (1, &step.buffer),
                (2, &qkv.buffer),
                (3, &attn.buffer),
            ],
        );
        Ok(Self {
            kernel,
            bind_group,
            width: heads * head_dim,
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        rec.dispatch(
            &self.kernel,
            &self.bind_group,
            (n_tokens * self.width).div_ceil(256),
        );
    }
}
