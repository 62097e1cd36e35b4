use bytemuck::{Pod, Zeroable};

use super::flag;
use super::pass::{KernelSpec, Pass};
use crate::gpu::{Gpu, GpuError, Recorder, StorageBuffer};

const SOURCE: &str = include_str!("../../../shaders/group_norm.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    pixels: u32,
    channels: u32,
    groups: u32,
    chunks: u32,
    eps: f32,
    _pad: [u32; 3],
}

/// Shape of a GroupNorm over a channel-last image.
#[derive(Clone, Copy, Debug)]
pub struct GroupNormShape {
    pub pixels: u32,
    pub channels: u32,
    pub groups: u32,
    pub eps: f32,
    /// What follows the affine map.
    pub activation: NormActivation,
}

/// The activation after a GroupNorm's affine map: SiLU in ResNet blocks, ReLU in the tiny
/// autoencoders' pooled blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormActivation {
    None,
    Silu,
    Relu,
}

/// GroupNorm of `x` into `y` (see shaders/group_norm.wgsl), or folded into per-channel
/// affine maps that a convolution applies as it loads `x`.
pub struct GroupNorm {
    stats: Pass,
    /// finalize and apply, or fold.
    finish: Vec<Pass>,
    _scratch: Vec<StorageBuffer>,
}

/// Values each stats workgroup reduces, at least.
const VALUES_PER_CHUNK: u32 = 4096;

impl GroupNorm {
    pub fn new(
        gpu: &Gpu,
        shape: GroupNormShape,
        gamma: &StorageBuffer,
        beta: &StorageBuffer,
        x: &StorageBuffer,
        y: &StorageBuffer,
    ) -> Result<Self, GpuError> {
        Self::build(gpu, shape, gamma, beta, x, y, false)
    }

    /// The statistics of `x` folded with γ and β into each channel's affine map: `folded`
    /// (2 × channels f32) takes the scales, then the shifts, for a convolution that applies
    /// them and the activation to its input as it loads it
    /// ([`super::MatMulOptions::input_norm`]). Two dispatches instead of three, and no
    /// normalised copy of `x` written and read back.
    pub fn folded(
        gpu: &Gpu,
        shape: GroupNormShape,
        gamma: &StorageBuffer,
        beta: &StorageBuffer,
        x: &StorageBuffer,
        folded: &StorageBuffer,
    ) -> Result<Self, GpuError> {
        Self::build(gpu, shape, gamma, beta, x, folded, true)
    }

    fn build(
        gpu: &Gpu,
        shape: GroupNormShape,
        gamma: &StorageBuffer,
        beta: &StorageBuffer,
        x: &StorageBuffer,
        y: &StorageBuffer,
        fold: bool,
    ) -> Result<Self, GpuError> {
        let GroupNormShape {
            pixels,
            channels,
            groups,
            ..
        } = shape;
        if groups == 0 || !channels.is_multiple_of(groups) {
            return Err(GpuError::Device(format!(
                "GroupNorm: {channels} channels do not split into {groups} groups"
            )));
        }
        let per_group = pixels * (channels / groups);
        let chunks = (per_group / VALUES_PER_CHUNK)
            .clamp(1, 64)
            .min(pixels.max(1));
        let params = Params {
            pixels,
            channels,
            groups,
            chunks,
            eps: shape.eps,
            _pad: [0; 3],
        };
        let partials = gpu.storage("group norm partials", u64::from(groups * chunks) * 16)?;
        let stats = gpu.storage("group norm stats", u64::from(groups) * 8)?;
        let defines = [
            flag("SILU", shape.activation == NormActivation::Silu),
            flag("RELU", shape.activation == NormActivation::Relu),
        ];
        let spec = |entry| KernelSpec {
            family: "group_norm",
            source: SOURCE,
            entry,
            defines: &defines,
        };
        let stats_pass = Pass::new(
            gpu,
            spec("stats_pass"),
            &params,
            &[(1, x), (2, &partials)],
            [groups, chunks, 1],
        )?;
        let finish = if fold {
            vec![Pass::new(
                gpu,
                spec("fold"),
                &params,
                &[(2, &partials), (4, gamma), (5, beta), (6, y)],
                [channels.div_ceil(64), 1, 1],
            )?]
        } else {
            let finalize = Pass::new(
                gpu,
                spec("finalize"),
                &params,
                &[(2, &partials), (3, &stats)],
                [groups.div_ceil(64), 1, 1],
            )?;
            let apply = Pass::new(
                gpu,
                spec("apply"),
                &params,
                &[(1, x), (3, &stats), (4, gamma), (5, beta), (6, y)],
                Pass::grid_of_64(pixels * channels),
            )?;
            vec![finalize, apply]
        };
        Ok(Self {
            stats: stats_pass,
            finish,
            _scratch: vec![partials, stats],
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>) {
        self.stats.encode(rec);
        for pass in &self.finish {
            pass.encode(rec);
        }
    }
}
