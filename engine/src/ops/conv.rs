use bytemuck::{Pod, Zeroable};

use super::{bind, flag, groups_of_64};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/conv.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    channels: u32,
    in_len: u32,
    out_len: u32,
    stride: u32,
    pad: u32,
    _pad: [u32; 3],
}

/// The shape of a 1-D convolution's input and taps.
#[derive(Clone, Copy, Debug)]
pub struct Conv1dShape {
    pub channels: u32,
    pub in_len: u32,
    pub taps: u32,
    pub stride: u32,
    pub pad: u32,
    /// The input is `[channel][position]` (else `[position][channel]`).
    pub channel_major: bool,
}

impl Conv1dShape {
    /// Output positions, as PyTorch's Conv1d computes them.
    pub fn out_len(&self) -> u32 {
        (self.in_len + 2 * self.pad).saturating_sub(self.taps) / self.stride.max(1) + 1
    }

    /// Columns of the unrolled input (the weight's row length).
    pub fn width(&self) -> u32 {
        self.channels * self.taps
    }
}

/// A 2-D convolution over a channel-last `[in_h·in_w][cin]` input, run by [`super::MatMul`]
/// as an implicit product with the `[out][ky·kx·cin]` weight. Mirrors `Conv` in matmul.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Conv2dShape {
    pub in_h: u32,
    pub in_w: u32,
    pub cin: u32,
    pub out_w: u32,
    pub ksize: u32,
    pub stride: u32,
    pub pad: u32,
    /// 1: the input is read as if upsampled 2× (nearest neighbour).
    pub upsample: u32,
}

impl Conv2dShape {
    /// A `ksize`×`ksize` convolution with PyTorch's output size for `stride` and `pad`,
    /// after an optional nearest 2× upsampling.
    pub fn new(
        in_h: u32,
        in_w: u32,
        cin: u32,
        ksize: u32,
        stride: u32,
        pad: u32,
        up: bool,
    ) -> Self {
        let w = in_w << u32::from(up);
        let out_w = (w + 2 * pad).saturating_sub(ksize) / stride.max(1) + 1;
        Self {
            in_h,
            in_w,
            cin,
            out_w,
            ksize,
            stride,
            pad,
            upsample: u32::from(up),
        }
    }

    pub fn out_h(&self) -> u32 {
        let h = self.in_h << self.upsample;
        (h + 2 * self.pad).saturating_sub(self.ksize) / self.stride.max(1) + 1
    }

    /// Output pixels (the product's rows).
    pub fn out_pixels(&self) -> u32 {
        self.out_h() * self.out_w
    }

    /// The weight's row length.
    pub fn width(&self) -> u32 {
        self.ksize * self.ksize * self.cin
    }
}

/// Unrolls a 1-D convolution's input into `[out_len][channels·taps]` rows (im2col), so the
/// convolution runs as a matrix product with the `[out][in·taps]` weight.
pub struct Im2Col {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    total: u32,
    _params: UniformBuffer,
}

impl Im2Col {
    pub fn new(
        gpu: &Gpu,
        shape: Conv1dShape,
        src: &StorageBuffer,
        cols: &StorageBuffer,
    ) -> Result<Self, GpuError> {
        let out_len = shape.out_len();
        let total = out_len * shape.width();
        if cols.size < u64::from(total) * 4 {
            return Err(GpuError::Device(format!(
                "im2col needs {} bytes of output; the buffer holds {}",
                u64::from(total) * 4,
                cols.size
            )));
        }
        let kernel = gpu.kernel(
            "conv",
            SOURCE,
            "main",
            &[
                flag("CHANNEL_MAJOR", shape.channel_major),
                ("TAPS", shape.taps.to_string()),
            ],
        )?;
        let params = gpu.uniform(
            "im2col params",
            &Params {
                channels: shape.channels,
                in_len: shape.in_len,
                out_len,
                stride: shape.stride.max(1),
                pad: shape.pad,
                _pad: [0; 3],
            },
        );
        let bind_group = bind(
            gpu,
            &kernel,
            &[(0, &params.buffer), (1, &src.buffer), (2, &cols.buffer)],
        );
        Ok(Self {
            kernel,
            bind_group,
            total,
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>) {
        rec.dispatch(&self.kernel, &self.bind_group, groups_of_64(self.total));
    }
}
