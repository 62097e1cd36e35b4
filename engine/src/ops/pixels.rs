//! Channel-last image plumbing (shaders/pixels.wgsl): SiLU, skip-connection concatenation,
//! transposition and row softmax.

use bytemuck::{Pod, Zeroable};

use super::pass::{KernelSpec, Pass};
use crate::gpu::{Gpu, GpuError, StorageBuffer};

const SOURCE: &str = include_str!("../../../shaders/pixels.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    extra: u32,
    scale: f32,
    offset: u32,
    _pad: [u32; 3],
}

fn spec(entry: &'static str) -> KernelSpec<'static> {
    KernelSpec {
        family: "pixels",
        source: SOURCE,
        entry,
        defines: &[],
    }
}

/// `y = x·σ(x)` over `n` values.
pub fn silu(gpu: &Gpu, n: u32, x: &StorageBuffer, y: &StorageBuffer) -> Result<Pass, GpuError> {
    let params = Params {
        rows: 1,
        cols: n,
        extra: 0,
        scale: 1.0,
        offset: 0,
        _pad: [0; 3],
    };
    Pass::new(
        gpu,
        spec("silu"),
        &params,
        &[(1, x), (3, y)],
        Pass::grid_of_64(n),
    )
}

/// `y[r] = a[r] ++ b[r]` for `rows` rows of `a_cols` and `b_cols` channels.
pub fn concat(
    gpu: &Gpu,
    rows: u32,
    (a, a_cols): (&StorageBuffer, u32),
    (b, b_cols): (&StorageBuffer, u32),
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let cols = a_cols + b_cols;
    let params = Params {
        rows,
        cols,
        extra: a_cols,
        scale: 1.0,
        offset: 0,
        _pad: [0; 3],
    };
    Pass::new(
        gpu,
        spec("concat"),
        &params,
        &[(1, a), (2, b), (3, y)],
        Pass::grid_of_64(rows * cols),
    )
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
        scale: 1.0,
        offset: 0,
        _pad: [0; 3],
    };
    Pass::new(
        gpu,
        spec("transpose"),
        &params,
        &[(1, x), (3, y)],
        Pass::grid_of_64(rows * cols),
    )
}

/// In place, `y[r] = softmax(scale · y[r])` for `rows` rows of `cols`.
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
        extra: 0,
        scale,
        offset: 0,
        _pad: [0; 3],
    };
    let [x, yy] = crate::gpu::fold_grid(rows);
    Pass::new(gpu, spec("softmax"), &params, &[(3, y)], [x, yy, 1])
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
        rows: 1,
        cols: n,
        extra: offset.to_bits(),
        scale,
        offset: 0,
        _pad: [0; 3],
    };
    Pass::new(
        gpu,
        spec("affine"),
        &params,
        &[(1, x), (3, y)],
        Pass::grid_of_64(n),
    )
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
        scale: 1.0,
        offset,
        _pad: [0; 3],
    };
    Pass::new(
        gpu,
        spec("slice"),
        &params,
        &[(1, x), (3, y)],
        Pass::grid_of_64(rows * cols),
    )
}

/// `y = tanh(x / scale) · scale` over `n` values.
pub fn tanh_clamp(
    gpu: &Gpu,
    n: u32,
    scale: f32,
    x: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = Params {
        rows: 1,
        cols: n,
        extra: 0,
        scale,
        offset: 0,
        _pad: [0; 3],
    };
    Pass::new(
        gpu,
        spec("tanh_clamp"),
        &params,
        &[(1, x), (3, y)],
        Pass::grid_of_64(n),
    )
}
