use std::sync::Arc;

use thiserror::Error;

use super::pipelines::PipelineCache;

#[derive(Debug, Error)]
pub enum GpuError {
    #[error("no GPU adapter found (is a Vulkan, Metal or D3D12 driver installed?)")]
    NoAdapter,
    #[error("no GPU adapter matches {wanted:?}; available: {available}")]
    NoMatchingAdapter { wanted: String, available: String },
    #[error("could not open the GPU device: {0}")]
    RequestDevice(#[from] wgpu::RequestDeviceError),
    #[error("GPU error: {0}")]
    Device(String),
    #[error("shader {family}::{entry} failed to compile: {message}")]
    Shader {
        family: String,
        entry: String,
        message: String,
    },
    #[error(
        "{what} needs a {size} byte buffer, but this GPU allows at most {limit} bytes per buffer binding"
    )]
    TooLarge { what: String, size: u64, limit: u64 },
    #[error("waiting for the GPU failed: {0}")]
    Poll(String),
}

/// What the opened device can do; kernels pick their variant from this.
#[derive(Debug, Clone)]
pub struct GpuCaps {
    pub shader_f16: bool,
    pub subgroups: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub timestamps: bool,
    pub max_storage_binding: u64,
    pub max_buffer: u64,
    pub max_workgroup_storage: u32,
    pub max_workgroup_invocations: u32,
    pub max_workgroup_size_x: u32,
    /// Kernels keep naga's runtime bounds checks (`BACKPACK_SHADER_CHECKS=1`, for debugging and
    /// for running the parity tests both ways); otherwise they are compiled trusted.
    pub runtime_checks: bool,
    /// Prompt products run on tensor cores (matmul_coop.wgsl): the device has cooperative
    /// matrices with 16×16×16 f16 fragments accumulating in f32 and a fixed subgroup size.
    /// `BACKPACK_MATMUL=simt` keeps the SIMT tiles (for comparisons and debugging).
    pub cooperative_matrix: bool,
}

pub(crate) struct GpuInner {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub caps: GpuCaps,
    pub pipelines: PipelineCache,
    /// Scratch buffers shared by the kernels that ask under one label (see
    /// `Gpu::shared_scratch`).
    pub scratch: std::sync::Mutex<std::collections::HashMap<&'static str, super::StorageBuffer>>,
    /// Held around every submission, and by a recorder submitting in parts from its first
    /// part to its last (`Recorder::in_parts`), so the parts reach the queue with no other
    /// thread's work between them: services share a device and its shared scratch. One per
    /// queue (views with other capabilities share it).
    pub submit_lock: Arc<std::sync::Mutex<()>>,
    /// The GPU time each paced part aims at, in µs (0: parts unpaced; see `Gpu::pace_parts`).
    /// Shared by the views of one queue, like the lock.
    pub part_budget_us: Arc<std::sync::atomic::AtomicU32>,
    /// What paced parts have measured of each kernel (see `pacing.rs`).
    pub kernel_costs: super::pacing::KernelCosts,
}

/// A cheap-to-clone handle to the device and queue every kernel runs on.
#[derive(Clone)]
pub struct Gpu {
    pub(crate) inner: Arc<GpuInner>,
}

/// The features and limits the engine wants from an adapter: f16 and subgroups where offered,
/// timestamps for profiling, and the adapter's own buffer and workgroup limits.
pub fn required_features_and_limits(adapter: &wgpu::Adapter) -> (wgpu::Features, wgpu::Limits) {
    let offered = adapter.features();
    let mut wanted =
        wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
    if offers_tensor_core_tiles(adapter) {
        wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    }
    // The adapter's own limits, not WebGPU's defaults: model weights need large bindings.
    let limits = adapter.limits();
    (offered & wanted, limits)
}

/// The descriptor every device the engine runs on is opened with (its own, or the window's):
/// the features and limits of [`required_features_and_limits`], with wgpu's experimental
/// features unlocked when cooperative matrices are among them.
pub fn device_descriptor(adapter: &wgpu::Adapter) -> wgpu::DeviceDescriptor<'static> {
    let (features, limits) = required_features_and_limits(adapter);
    let experimental_features =
        if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            super::trusted::experimental_features()
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
    wgpu::DeviceDescriptor {
        label: Some("backpack"),
        required_features: features,
        required_limits: limits,
        experimental_features,
        ..Default::default()
    }
}

/// Whether the adapter can run matmul_coop.wgsl: cooperative matrices with 16×16×16 f16
/// fragments accumulating in f32, f16 and subgroups, and one subgroup size (the kernel lays
/// its subgroups out by invocation index).
fn offers_tensor_core_tiles(adapter: &wgpu::Adapter) -> bool {
    use wgpu::CooperativeScalarType as T;
    let features = adapter.features();
    let info = adapter.get_info();
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP;
    features.contains(needed)
        && !simt_forced()
        && tile_layout_fits(&info, adapter.limits().max_compute_workgroup_storage_size)
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == T::F16
                && p.cr_type == T::F32
        })
}

/// The tensor-core tiles' layout: one fixed subgroup size of 16, 32 or 64 (four subgroups
/// stage 32-deep k steps), and workgroup memory for the largest default tile (two 128×40 f16
/// tiles and four 16×16 f32 fragments: 24 KiB).
fn tile_layout_fits(info: &wgpu::AdapterInfo, workgroup_storage: u32) -> bool {
    info.subgroup_min_size == info.subgroup_max_size
        && [16, 32, 64].contains(&info.subgroup_min_size)
        && workgroup_storage >= crate::ops::COOP_MIN_WORKGROUP_BYTES
}

/// `BACKPACK_MATMUL=simt`: prompt products keep the SIMT tiles even on tensor-core adapters.
fn simt_forced() -> bool {
    std::env::var("BACKPACK_MATMUL").is_ok_and(|v| v.eq_ignore_ascii_case("simt"))
}

impl Gpu {
    /// Opens a device of its own. `adapter_filter` (or `BACKPACK_ADAPTER`) picks an adapter by a
    /// case-insensitive substring of its name; otherwise a discrete GPU is preferred, then an
    /// integrated one, and a CPU adapter only when nothing else exists.
    pub fn headless(adapter_filter: Option<&str>) -> Result<Self, GpuError> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        // Driver validation layers make lavapipe several times slower; opt in with WGPU_DEBUG.
        if std::env::var_os("WGPU_DEBUG").is_none() {
            desc.flags = wgpu::InstanceFlags::empty();
        }
        let instance = wgpu::Instance::new(desc);
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let filter = self::adapter_filter(adapter_filter);
        let adapter = pick_adapter(&adapters, filter.as_deref())?;
        let (device, queue) =
            pollster::block_on(adapter.request_device(&device_descriptor(&adapter)))?;
        Ok(Self::from_device(device, queue, adapter.get_info()))
    }

    /// Wraps a device created elsewhere (the app's renderer), sharing it rather than opening a
    /// second one. The device should have been created with [`required_features_and_limits`].
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue, info: wgpu::AdapterInfo) -> Self {
        let features = device.features();
        let limits = device.limits();
        let subgroups = features.contains(wgpu::Features::SUBGROUP);
        let caps = GpuCaps {
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups,
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            max_storage_binding: limits.max_storage_buffer_binding_size,
            max_buffer: limits.max_buffer_size,
            max_workgroup_storage: limits.max_compute_workgroup_storage_size,
            max_workgroup_invocations: limits.max_compute_invocations_per_workgroup,
            max_workgroup_size_x: limits.max_compute_workgroup_size_x,
            runtime_checks: std::env::var_os("BACKPACK_SHADER_CHECKS").is_some_and(|v| v != "0"),
            // The feature is only requested (by `device_descriptor`) where the adapter offers
            // the 16×16×16 f16→f32 fragments the kernel is written for.
            cooperative_matrix: features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
                && features.contains(wgpu::Features::SHADER_F16)
                && subgroups
                && tile_layout_fits(&info, limits.max_compute_workgroup_storage_size)
                && !simt_forced(),
        };
        Self {
            inner: Arc::new(GpuInner {
                device,
                queue,
                info,
                caps,
                pipelines: PipelineCache::default(),
                scratch: Default::default(),
                submit_lock: Default::default(),
                part_budget_us: Default::default(),
                kernel_costs: Default::default(),
            }),
        }
    }

    /// The same device with subgroup operations left unused, so the shared-memory fallback of
    /// every reduction (the path of adapters without subgroups) can run and be tested anywhere.
    pub fn without_subgroups(&self) -> Self {
        self.with_caps(|caps| {
            caps.subgroups = false;
            caps.cooperative_matrix = false;
        })
    }

    /// The same device with prompt products on the SIMT tiles, so both paths can be tested
    /// (and compared) on a tensor-core adapter.
    pub fn without_cooperative_matrix(&self) -> Self {
        self.with_caps(|caps| caps.cooperative_matrix = false)
    }

    fn with_caps(&self, change: impl FnOnce(&mut GpuCaps)) -> Self {
        let mut caps = self.inner.caps.clone();
        change(&mut caps);
        Self {
            inner: Arc::new(GpuInner {
                device: self.inner.device.clone(),
                queue: self.inner.queue.clone(),
                info: self.inner.info.clone(),
                caps,
                pipelines: PipelineCache::default(),
                scratch: Default::default(),
                submit_lock: self.inner.submit_lock.clone(),
                part_budget_us: self.inner.part_budget_us.clone(),
                kernel_costs: self.inner.kernel_costs.clone(),
            }),
        }
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    pub fn info(&self) -> &wgpu::AdapterInfo {
        &self.inner.info
    }

    pub fn caps(&self) -> &GpuCaps {
        &self.inner.caps
    }

    /// True for CPU rasterisers such as llvmpipe/lavapipe: usable, but slow, and worth telling.
    pub fn is_software(&self) -> bool {
        self.inner.info.device_type == wgpu::DeviceType::Cpu
    }

    /// One line naming the adapter, its backend and its kind.
    pub fn describe(&self) -> String {
        let info = &self.inner.info;
        let kind = match info.device_type {
            wgpu::DeviceType::DiscreteGpu => "discrete GPU",
            wgpu::DeviceType::IntegratedGpu => "integrated GPU",
            wgpu::DeviceType::VirtualGpu => "virtual GPU",
            wgpu::DeviceType::Cpu => "CPU adapter (software rendering: slow)",
            wgpu::DeviceType::Other => "adapter",
        };
        format!("{} ({:?}, {kind})", info.name, info.backend)
    }

    /// Sends the contents written into buffers at their creation (the weights) to the GPU and
    /// waits for them. wgpu copies those contents from host staging memory with the next
    /// submission and releases the staging memory afterwards; a model calls this once it is
    /// built, so that loading ends with the weights in place and the first prompt does not pay
    /// for the copy.
    pub fn finish_uploads(&self) -> Result<(), GpuError> {
        self.submit(None);
        self.wait()
    }

    /// Submits command buffers under the submission lock (see `GpuInner::submit_lock`).
    pub(crate) fn submit(
        &self,
        buffers: impl IntoIterator<Item = wgpu::CommandBuffer>,
    ) -> wgpu::SubmissionIndex {
        let _held = self.submit_lock();
        self.inner.queue.submit(buffers)
    }

    /// Paces long sequences recorded in parts (`Recorder::in_parts`: prompts, image steps, VAE
    /// decodes) for a window that draws with the same queue: each part aims at `budget` of GPU
    /// time and at most two wait in the queue, so a frame waits for two parts at most rather
    /// than for a whole image step. `None` submits as fast as the host records (batch work).
    pub fn pace_parts(&self, budget: Option<std::time::Duration>) {
        let us = budget.map_or(0, |b| b.as_micros().clamp(1, u128::from(u32::MAX)) as u32);
        self.inner
            .part_budget_us
            .store(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// The GPU time a paced part aims at, where parts are paced.
    pub fn part_budget(&self) -> Option<std::time::Duration> {
        match self
            .inner
            .part_budget_us
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            us => Some(std::time::Duration::from_micros(u64::from(us))),
        }
    }

    pub(crate) fn kernel_costs(&self) -> super::pacing::KernelCosts {
        self.inner.kernel_costs.clone()
    }

    /// The lock every submission holds (see `GpuInner::submit_lock`). A panic elsewhere
    /// while it was held leaves nothing half-done to guard, so a poisoned lock is taken as is.
    pub(crate) fn submit_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .submit_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Blocks until all submitted work has finished.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.inner
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| GpuError::Poll(e.to_string()))
    }

    /// Fails with a clear message when a buffer would exceed the device's binding limit.
    pub fn check_binding_size(&self, what: &str, size: u64) -> Result<(), GpuError> {
        let limit = self
            .inner
            .caps
            .max_storage_binding
            .min(self.inner.caps.max_buffer);
        if size > limit {
            return Err(GpuError::TooLarge {
                what: what.to_owned(),
                size,
                limit,
            });
        }
        Ok(())
    }
}

fn device_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// How an adapter ranks (lower first): the kind of device, then its API.
fn adapter_rank(device: wgpu::DeviceType, backend: wgpu::Backend) -> (u8, u8) {
    (device_rank(device), backend_rank(backend))
}

fn backend_rank(b: wgpu::Backend) -> u8 {
    // For the same device: Vulkan (or Metal) first, whose shaders get f16, subgroups and
    // cooperative matrices; then D3D12 (whose FXC compiler has none of them); GL last.
    match b {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal => 0,
        wgpu::Backend::Dx12 => 1,
        _ => 2,
    }
}

/// The `--adapter` filter, else `BACKPACK_ADAPTER`; empty means none.
pub fn adapter_filter(explicit: Option<&str>) -> Option<String> {
    explicit
        .map(str::to_owned)
        .or_else(|| std::env::var("BACKPACK_ADAPTER").ok())
        .filter(|f| !f.is_empty())
}

/// Picks the adapter to run on: those whose name contains `filter` (case-insensitive) if given;
/// among them a discrete GPU before an integrated one before a CPU, and Vulkan/Metal/D3D12
/// before GL for the same device.
pub fn pick_adapter(
    adapters: &[wgpu::Adapter],
    filter: Option<&str>,
) -> Result<wgpu::Adapter, GpuError> {
    if adapters.is_empty() {
        return Err(GpuError::NoAdapter);
    }
    let mut candidates: Vec<&wgpu::Adapter> = match filter {
        Some(wanted) => {
            let needle = wanted.to_lowercase();
            let matching: Vec<_> = adapters
                .iter()
                .filter(|a| a.get_info().name.to_lowercase().contains(&needle))
                .collect();
            if matching.is_empty() {
                let names: Vec<String> = adapters
                    .iter()
                    .map(|a| {
                        let i = a.get_info();
                        format!("{} ({:?})", i.name, i.backend)
                    })
                    .collect();
                return Err(GpuError::NoMatchingAdapter {
                    wanted: wanted.to_owned(),
                    available: names.join(", "),
                });
            }
            matching
        }
        None => adapters.iter().collect(),
    };
    candidates.sort_by_key(|a| {
        let i = a.get_info();
        adapter_rank(i.device_type, i.backend)
    });
    Ok(candidates[0].clone())
}

#[cfg(test)]
mod rank_tests {
    use super::adapter_rank;
    use wgpu::{Backend, DeviceType};

    #[test]
    fn the_device_comes_first_then_vulkan_before_d3d12_before_gl() {
        let discrete_dx12 = adapter_rank(DeviceType::DiscreteGpu, Backend::Dx12);
        assert!(adapter_rank(DeviceType::DiscreteGpu, Backend::Vulkan) < discrete_dx12);
        assert!(discrete_dx12 < adapter_rank(DeviceType::DiscreteGpu, Backend::Gl));
        assert!(discrete_dx12 < adapter_rank(DeviceType::IntegratedGpu, Backend::Vulkan));
        assert!(
            adapter_rank(DeviceType::IntegratedGpu, Backend::Dx12)
                < adapter_rank(DeviceType::Cpu, Backend::Vulkan)
        );
    }
}
