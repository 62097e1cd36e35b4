//! The GPU core: one [`Gpu`] handle over a wgpu device, a pipeline cache keyed by shader and
//! specialisation, buffer helpers, and a [`Recorder`] that encodes a whole forward pass into
//! one command buffer.

mod buffers;
mod device;
mod memory;
mod pacing;
mod pipelines;
pub(crate) mod profile;
mod recorder;
mod shader;
mod trusted;

pub use buffers::{StorageBuffer, UniformBuffer};
pub use device::{
    Gpu, GpuCaps, GpuError, adapter_filter, device_descriptor, pick_adapter,
    required_features_and_limits,
};
#[cfg(test)]
pub(crate) use pipelines::assert_translates;
pub use pipelines::{Kernel, KernelKey};
pub use profile::KernelTiming;
pub(crate) use profile::Profiler;
pub use recorder::{Recorder, fold_grid};
pub use shader::preprocess;
