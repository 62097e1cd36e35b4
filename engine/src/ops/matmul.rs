use bytemuck::{Pod, Zeroable};

use super::{Matrix, bind, flag};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/matmul.wgsl");
const TILE: u32 = 64;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    k: u32,
    row_vecs: u32,
    _pad: u32,
}

#[derive(Default)]
pub struct MatMulOptions<'a> {
    pub bias: Option<&'a StorageBuffer>,
    pub gelu: bool,
    pub residual: bool,
}

/// `Y = X · Wᵀ` over all tokens of a step (prompt processing).
pub struct MatMul {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    n: u32,
    _params: UniformBuffer,
}

impl MatMul {
    pub fn new(
        gpu: &Gpu,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        opts: MatMulOptions<'_>,
    ) -> Result<Self, GpuError> {
        let mut defines = w.dtype.defines();
        defines.extend([
            flag("BIAS", opts.bias.is_some()),
            flag("GELU", opts.gelu),
            flag("RESIDUAL", opts.residual),
        ]);
        let kernel = gpu.kernel("matmul", SOURCE, "main", &defines)?;
        let params = gpu.uniform(
            "matmul params",
            &Params {
                n: w.rows,
                k: w.cols,
                row_vecs: w.row_vecs(),
                _pad: 0,
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
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Self {
            kernel,
            bind_group,
            n: w.rows,
            _params: params,
        })
    }

    /// Records the product for `n_tokens` rows (which must match the step uniform).
    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        rec.dispatch_xyz(
            &self.kernel,
            &self.bind_group,
            [self.n.div_ceil(TILE), n_tokens.div_ceil(TILE), 1],
        );
    }
}
