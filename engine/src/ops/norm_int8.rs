//! A norm that also quantizes its rows to int8 for the few-row int8 product after it
//! (norm_int8.wgsl): one dispatch where the norm and the product's own quantize pass were two.

use bytemuck::{Pod, Zeroable};

use super::{FewRowsInt8, Int8Rows, NormKind, bind, flag};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/norm_int8.wgsl");

/// Lanes of a workgroup (one row each): whole 32-value blocks a lane, so rows of 2,048 values
/// (64 blocks) keep every lane busy.
const LANES: u32 = 64;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    eps: f32,
    _pad: [u32; 3],
}

/// `y = norm(x)` over the step's rows, as [`super::Norm`] computes it, and the rows quantized
/// into `rows` as the int8 product `product` quantizes its input, so that it can skip that
/// pass ([`FewRowsInt8::encode_quantized`]).
pub struct NormInt8 {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    _params: UniformBuffer,
}

impl NormInt8 {
    /// None where `product` reads its rows in two levels (LM heads), of another width than
    /// the norm's, or beyond the rows' buffer.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        kind: NormKind,
        (width, eps): (u32, f32),
        (weight, bias): (&StorageBuffer, Option<&StorageBuffer>),
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        rows: &Int8Rows,
        product: &FewRowsInt8,
    ) -> Result<Option<Self>, GpuError> {
        let input = product.input();
        if input.levels != 1 || input.cols != width || width > rows.cols {
            return Ok(None);
        }
        let layer = kind == NormKind::Layer;
        let kernel = gpu.kernel(
            "norm_int8",
            SOURCE,
            "main",
            &[
                ("K", width.to_string()),
                ("UNIT_WORDS", input.unit_words.to_string()),
                ("WG", LANES.to_string()),
                flag("SUBGROUP", gpu.caps().subgroups),
                flag("LAYER", layer),
            ],
        )?;
        let params = gpu.uniform("norm int8 params", &Params { eps, _pad: [0; 3] });
        let mut entries = vec![
            (0, &params.buffer),
            (1, &step.buffer),
            (2, &x.buffer),
            (3, &y.buffer),
            (4, &weight.buffer),
            (7, &rows.words.buffer),
            (9, &rows.scales.buffer),
        ];
        if layer {
            let bias = bias.ok_or_else(|| GpuError::Device("LayerNorm needs a bias".into()))?;
            entries.push((5, &bias.buffer));
        }
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Some(Self {
            kernel,
            bind_group,
            _params: params,
        }))
    }

    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        rec.dispatch_xyz(&self.kernel, &self.bind_group, [n_tokens, 1, 1]);
    }
}
