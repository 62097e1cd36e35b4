//! The engine's only `unsafe`: both are wgpu opt-ins whose safety rests on the engine's own
//! kernels, so they live together here where they can be audited as one.

/// A shader module without naga's runtime bounds checks, which cost up to a quarter of a
/// kernel's time (a clamp on every storage and workgroup access). This is the engine's one
/// exception to `unsafe_code = "deny"`.
#[allow(unsafe_code)]
pub(crate) fn trusted_module(
    device: &wgpu::Device,
    descriptor: wgpu::ShaderModuleDescriptor<'_>,
) -> wgpu::ShaderModule {
    // SAFETY: the kernels are our own WGSL. Every index they compute comes from shapes the
    // host validated against the buffers it binds (weights against their tensors, activations
    // sized by their producers), each global access is guarded by those shapes, and every
    // kernel has a parity test on awkward sizes that CI runs with the checks on and off.
    unsafe {
        device.create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked())
    }
}

/// The token that lets a device enable wgpu's experimental features; the engine asks for one
/// only, `EXPERIMENTAL_COOPERATIVE_MATRIX` (tensor-core tiles in matmul_coop.wgsl).
#[allow(unsafe_code)]
pub(crate) fn experimental_features() -> wgpu::ExperimentalFeatures {
    // SAFETY: wgpu marks experimental features unsafe because their implementations may still
    // have bugs. The one requested is used by one kernel family, which only runs after the
    // adapter reported a matching fragment shape, and whose every variant has a parity test
    // run on such an adapter; `BACKPACK_MATMUL=simt` turns it off.
    unsafe { wgpu::ExperimentalFeatures::enabled() }
}
