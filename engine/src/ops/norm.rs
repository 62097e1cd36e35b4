use bytemuck::{Pod, Zeroable};

use super::{bind, flag, groups_of_64};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/norm.wgsl");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    Rms,
    Layer,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    k: u32,
    eps: f32,
    heads: u32,
    kv_heads: u32,
    q_step: u32,
    _pad: [u32; 3],
}

/// How a [`Norm`] runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct NormForm {
    /// Add the normalised row into y (RMSNorm only).
    pub residual: bool,
    /// A row per invocation rather than per workgroup of 256: `None` takes it on CPU
    /// adapters, where workgroup barriers cost more than reading a row lane by lane.
    pub lane_rows: Option<bool>,
    /// y takes f16 values, two to a word (for a product with `half_in`): not with `residual`,
    /// and over an even width.
    pub half_out: bool,
}

/// Row-wise RMSNorm / LayerNorm of the step's tokens into a separate buffer.
pub struct Norm {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    /// A row per invocation (CPU adapters) rather than per workgroup.
    lane_rows: bool,
    _params: UniformBuffer,
}

impl Norm {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        kind: NormKind,
        width: u32,
        eps: f32,
        weight: &StorageBuffer,
        bias: Option<&StorageBuffer>,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let form = NormForm::default();
        Self::with_form(gpu, kind, width, eps, weight, bias, x, y, step, form)
    }

    /// RMSNorm of the step's rows of `x` added into `y` (`y += norm(x)`).
    #[allow(clippy::too_many_arguments)]
    pub fn add_into(
        gpu: &Gpu,
        width: u32,
        eps: f32,
        weight: &StorageBuffer,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let form = NormForm {
            residual: true,
            ..Default::default()
        };
        Self::with_form(
            gpu,
            NormKind::Rms,
            width,
            eps,
            weight,
            None,
            x,
            y,
            step,
            form,
        )
    }

    /// As [`Norm::new`] in the given form.
    #[allow(clippy::too_many_arguments)]
    pub fn with_form(
        gpu: &Gpu,
        kind: NormKind,
        width: u32,
        eps: f32,
        weight: &StorageBuffer,
        bias: Option<&StorageBuffer>,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        form: NormForm,
    ) -> Result<Self, GpuError> {
        let NormForm {
            residual,
            lane_rows,
            half_out,
        } = form;
        if half_out && (residual || !width.is_multiple_of(2)) {
            return Err(GpuError::Device(format!(
                "a norm of width {width} cannot write f16 outputs{}",
                if residual { " into a residual" } else { "" }
            )));
        }
        let layer = kind == NormKind::Layer;
        let lane_rows = lane_rows.unwrap_or_else(|| gpu.is_software());
        let kernel = gpu.kernel(
            "norm",
            SOURCE,
            "main",
            &[
                flag("LAYER", layer),
                flag("HEADS", false),
                flag("RESIDUAL", residual),
                flag("LANE_ROWS", lane_rows),
                flag("HALF_OUT", half_out),
            ],
        )?;
        let params = gpu.uniform(
            "norm params",
            &Params {
                k: width,
                eps,
                heads: 0,
                kv_heads: 0,
                q_step: 1,
                _pad: [0; 3],
            },
        );
        let mut entries = vec![
            (0, &params.buffer),
            (1, &step.buffer),
            (2, &x.buffer),
            (3, &y.buffer),
            (4, &weight.buffer),
        ];
        if layer {
            let bias = bias.ok_or_else(|| GpuError::Device("LayerNorm needs a bias".into()))?;
            entries.push((5, &bias.buffer));
        }
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Self {
            kernel,
            bind_group,
            lane_rows,
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        let groups = if self.lane_rows {
            groups_of_64(n_tokens)
        } else {
            n_tokens
        };
        rec.dispatch_xyz(&self.kernel, &self.bind_group, [groups, 1, 1]);
    }
}

/// RMSNorm in place over each query and key head of the step's fused QKV rows (Qwen3's
/// q_norm / k_norm), value heads (and with `gated_queries` the gate head after each query
/// head) untouched.
pub struct HeadNorm {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    heads: u32,
    kv_heads: u32,
    _params: UniformBuffer,
}

impl HeadNorm {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        gated_queries: bool,
        eps: f32,
        q_weight: &StorageBuffer,
        k_weight: &StorageBuffer,
        qkv: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let kernel = gpu.kernel(
            "norm",
            SOURCE,
            "main",
            &[
                flag("LAYER", false),
                flag("HEADS", true),
                flag("LANE_ROWS", false),
            ],
        )?;
        let params = gpu.uniform(
            "head norm params",
            &Params {
                k: head_dim,
                eps,
                heads,
                kv_heads,
                q_step: if gated_queries { 2 } else { 1 },
                _pad: [0; 3],
            },
        );
        let bind_group = bind(
            gpu,
            &kernel,
            &[
                (0, &params.buffer),
                (1, &step.buffer),
                (3, &qkv.buffer),
                (4, &q_weight.buffer),
                (6, &k_weight.buffer),
            ],
        );
        Ok(Self {
            kernel,
            bind_group,
            heads,
            kv_heads,
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        rec.dispatch_xyz(
            &self.kernel,
            &self.bind_group,
            [self.heads + self.kv_heads, n_tokens, 1],
        );
    }
}
