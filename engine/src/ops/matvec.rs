use bytemuck::{Pod, Zeroable};

use super::{Matrix, NormKind, bind, flag};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/matvec.wgsl");
const WG: u32 = 256;
const XCACHE_MAX_BYTES: u64 = 16 * 1024;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    k: u32,
    row_vecs: u32,
    glu_offset: u32,
    eps: f32,
    _pad: [u32; 3],
}

/// Options of the decode product. A fused norm normalises the input row in each workgroup.
#[derive(Default)]
pub struct MatVecOptions<'a> {
    pub norm: Option<(NormKind, &'a StorageBuffer, Option<&'a StorageBuffer>, f32)>,
    pub bias: Option<&'a StorageBuffer>,
    /// The matrix holds the gate rows then the up rows; the output is silu(gate) * up.
    pub glu: bool,
    pub gelu: bool,
    /// Add into the output instead of overwriting it (the residual stream).
    pub residual: bool,
}

/// `y = W · x̂` for the last token of the step (decoding, and the LM head after a prompt).
pub struct MatVec {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    workgroups: u32,
    _params: UniformBuffer,
}

impl MatVec {
    pub fn new(
        gpu: &Gpu,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        opts: MatVecOptions<'_>,
    ) -> Result<Self, GpuError> {
        let n = if opts.glu { w.rows / 2 } else { w.rows };
        // More lanes per row for long rows keeps enough loads in flight per row.
        let tpr: u32 = if w.cols >= 4096 { 64 } else { 32 };
        let caps = gpu.caps();
        let subgroups = caps.subgroups && caps.subgroup_max_size <= tpr;
        // Short rows: stage x̂ once in workgroup memory. Long rows: stream x alongside the
        // weights instead, since a large staging prologue delays every weight load (measured
        // on an H100: K = 8960 ran at 0.7 TB/s staged against 1.2 TB/s streamed).
        let x_bytes = u64::from(w.row_stride()) * 4;
        let xcache = x_bytes <= XCACHE_MAX_BYTES
            && x_bytes + u64::from(WG) * 4 + 64 <= u64::from(caps.max_workgroup_storage);
        let xvec4 = w.cols.is_multiple_of(4);
        let mut defines = w.dtype.defines();
        defines.extend([
            ("WG", WG.to_string()),
            ("ROW_VECS", w.row_vecs().to_string()),
            flag("XCACHE", xcache),
            flag("XVEC4", xvec4 && !xcache),
            ("TPR", tpr.to_string()),
            flag("SUBGROUP", subgroups),
            flag("NORM", opts.norm.is_some()),
            flag(
                "NORM_LAYER",
                matches!(opts.norm, Some((NormKind::Layer, ..))),
            ),
            flag("BIAS", opts.bias.is_some()),
            flag("GLU", opts.glu),
            flag("GELU", opts.gelu),
            flag("RESIDUAL", opts.residual),
        ]);
        let kernel = gpu.kernel("matvec", SOURCE, "main", &defines)?;
        let params = gpu.uniform(
            "matvec params",
            &Params {
                n,
                k: w.cols,
                row_vecs: w.row_vecs(),
                glu_offset: n * w.row_vecs(),
                eps: opts.norm.map_or(0.0, |n| n.3),
                _pad: [0; 3],
            },
        );
        let mut entries = vec![
            (0, &params.buffer),
            (1, &step.buffer),
            (2, &x.buffer),
            (3, &w.buffer.buffer),
            (4, &y.buffer),
        ];
        if let Some(b) = opts.bias {
            entries.push((5, &b.buffer));
        }
        if xvec4 && !xcache {
            entries.push((8, &x.buffer));
        }
        if let Some((kind, weight, bias, _)) = opts.norm {
            entries.push((6, &weight.buffer));
            if kind == NormKind::Layer {
                let bias = bias.ok_or_else(|| {
                    GpuError::Device("LayerNorm fused into a product needs its bias".into())
                })?;
                entries.push((7, &bias.buffer));
            }
        }
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Self {
            kernel,
            bind_group,
            workgroups: n.div_ceil(WG / tpr),
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>) {
        rec.dispatch(&self.kernel, &self.bind_group, self.workgroups);
    }
}
