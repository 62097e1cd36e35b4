//! Channel-last image plumbing (shaders/pixels.wgsl): SiLU, skip-connection concatenation,
//! transposition, row softmax, affine maps, channel slices and a soft clamp.

use bytemuck::{Pod, Zeroable};

use super::pass::{KernelSpec, Pass};
use crate::gpu::{Gpu, GpuError, StorageBuffer};

const SOURCE: &str = include_str!("../../../shaders/pixels.wgsl");

/// Mirrors `Params` in pixels.wgsl; what `extra` and `offset` mean depends on the entry.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    extra: u32,
    scale: f32,
    offset: u32,
    _pad: [u32; 3],
}

/// `entry` over `rows`·`cols` invocations of 64-wide workgroups, `a` at binding 1 (and `b`
/// at 2), `y` at 3.
fn elementwise(
    gpu: &Gpu,
    entry: &'static str,
    params: Params,
    inputs: &[&StorageBuffer],
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let spec = KernelSpec {
        family: "pixels",
        source: SOURCE,
        entry,
        defines: &[],
    };
    let mut buffers: Vec<(u32, &StorageBuffer)> = (1..).zip(inputs.iter().copied()).collect();
    buffers.push((3, y));
    let grid = Pass::grid_of_64(params.rows * params.cols);
    Pass::new(gpu, spec, &params, &buffers, grid)
}

/// `n` values in one row.
fn flat(n: u32, scale: f32) -> Params {
    Params {
        rows: 1,
        cols: n,
        scale,
        ..Default::default()
    }
}

/// `y = x·σ(x)` over `n` values.
pub fn silu(gpu: &Gpu, n: u32, x: &StorageBuffer, y: &StorageBuffer) -> Result<Pass, GpuError> {
    elementwise(gpu, "silu", flat(n, 1.0), &[x], y)
}

/// `y[r] = a[r] ++ b[r]` for `rows` rows of `a_cols` and `b_cols` channels.
pub fn concat(
    gpu: &Gpu,
    rows: u32,
    (a, a_cols): (&StorageBuffer, u32),
    (b, b_cols): (&StorageBuffer, u32),
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = Params {
        rows,
        cols: a_cols + b_cols,
        extra: a_cols,
        ..Default::default()
    };
    elementwise(gpu, "concat", params, &[a, b], y)
}

/// `y[c][r] = x[r][c]` with output rows `out_stride` floats apart.
pub fn transpose(
    gpu: &Gpu,
    rows: u32,
    cols: u32,
    out_stride: u32,
    x: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = Params {
        rows,
        cols,
        extra: out_stride,
        ..Default::default()
    };
    elementwise(gpu, "transpose", params, &[x], y)
}

/// In place, `y[r] = softmax(scale · y[r])` for `rows` rows of `cols`, one workgroup per row.
pub fn softmax_rows(
    gpu: &Gpu,
    rows: u32,
    cols: u32,
    scale: f32,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = Params {
        rows,
        cols,
        scale,
        ..Default::default()
    };
    let spec = KernelSpec {
        family: "pixels",
        source: SOURCE,
        entry: "softmax",
        defines: &[],
    };
    let [x, yy] = crate::gpu::fold_grid(rows);
    Pass::new(gpu, spec, &params, &[(3, y)], [x, yy, 1])
}

/// `y = x·scale + offset` over `n` values.
pub fn affine(
    gpu: &Gpu,
    n: u32,
    scale: f32,
    offset: f32,
    x: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = Params {
        extra: offset.to_bits(),
        ..flat(n, scale)
    };
    elementwise(gpu, "affine", params, &[x], y)
}

/// Channels `offset..offset + cols` of each of `rows` rows of `x` (rows of `x_cols`).
pub fn slice_channels(
    gpu: &Gpu,
    rows: u32,
    (offset, cols): (u32, u32),
    x_cols: u32,
    x: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = Params {
        rows,
        cols,
        extra: x_cols,
        offset,
        ..Default::default()
    };
    elementwise(gpu, "slice", params, &[x], y)
}

/// `y = tanh(x / scale) · scale` over `n` values.
pub fn tanh_clamp(
    gpu: &Gpu,
    n: u32,
    scale: f32,
    x: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    elementwise(gpu, "tanh_clamp", flat(n, scale), &[x], y)
}
