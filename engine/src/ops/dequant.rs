use bytemuck::{Pod, Zeroable};

use super::{Matrix, WeightDType, bind};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};
use crate::load::GgmlType;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    q_scales: u32,
    _pad: [u32; 2],
}

/// Expands a block-quantized matrix into a dense f16 matrix in `scratch`, so prompt products
/// run at dense speed (the scratch is reused for every matrix, one after another).
pub struct Dequantize {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    invocations: u32,
    _params: UniformBuffer,
}

/// 16-byte words a K-quant expansion invocation writes (dequant.wgsl's WORDS).
const K_WORDS_PER_INVOCATION: u32 = 4;

impl Dequantize {
    /// Bytes of scratch that `w` expands to.
    pub fn scratch_bytes(w: &Matrix) -> u64 {
        Matrix::byte_size(w.rows, w.cols, WeightDType::F16)
    }

    /// The op, and the dense view of `scratch` its products read.
    pub fn new(gpu: &Gpu, w: &Matrix, scratch: &StorageBuffer) -> Result<(Self, Matrix), GpuError> {
        if w.quant.is_none() {
            return Err(GpuError::Device(
                "only block-quantized matrices are expanded".into(),
            ));
        }
        if scratch.size < Self::scratch_bytes(w) {
            return Err(GpuError::Device("dequantization scratch too small".into()));
        }
        let k_quant = matches!(w.quant, Some((GgmlType::Q4K | GgmlType::Q5K, _)));
        let mut defines = w.defines();
        defines.push(("QSTORE", "1".into()));
        defines.push(("WORDS", K_WORDS_PER_INVOCATION.to_string()));
        let kernel = gpu.kernel(
            "dequant",
            super::quant_source::QUANT_DEQUANT.as_str(),
            "main",
            &defines,
        )?;
        let params = gpu.uniform(
            "dequant params",
            &Params {
                rows: w.rows,
                q_scales: w.q_scales(),
                _pad: [0; 2],
            },
        );
        let bind_group = bind(
            gpu,
            &kernel,
            &[
                (0, &params.buffer),
                // K-quant blocks are read through their vec4 view (q_word).
                (if k_quant { 11 } else { 3 }, &w.buffer.buffer),
                (4, &scratch.buffer),
            ],
        );
        let view = Matrix {
            buffer: StorageBuffer {
                buffer: scratch.buffer.clone(),
                size: scratch.size,
            },
            rows: w.rows,
            cols: w.cols,
            dtype: WeightDType::F16,
            quant: None,
        };
        Ok((
            Self {
                kernel,
                bind_group,
                // K-quants: eight words per sub-block pair, WORDS an invocation; others: one
                // sub-block an invocation.
                invocations: if k_quant {
                    (w.rows * (w.cols / 32) * 4).div_ceil(K_WORDS_PER_INVOCATION)
                } else {
                    w.rows * (w.cols / 32)
                },
                _params: params,
            },
            view,
        ))
    }

    pub fn encode(&self, rec: &mut Recorder<'_>) {
        rec.dispatch(
            &self.kernel,
            &self.bind_group,
            self.invocations.div_ceil(256),
        );
    }
}
