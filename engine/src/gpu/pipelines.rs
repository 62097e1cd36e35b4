use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::device::{Gpu, GpuError};
use super::shader::preprocess;
use super::trusted::trusted_module;

/// Declarations every kernel shares (the step uniform's layout).
const COMMON: &str = include_str!("../../../shaders/common.wgsl");

/// Identifies one compiled pipeline: the shader family, its entry point, and the defines it
/// was specialised with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelKey {
    pub family: &'static str,
    pub entry: &'static str,
    pub defines: Vec<(&'static str, String)>,
}

/// A compiled compute pipeline and the layout its bind groups must follow.
#[derive(Clone)]
pub struct Kernel {
    pub pipeline: Arc<wgpu::ComputePipeline>,
    pub layout: wgpu::BindGroupLayout,
    pub label: Arc<str>,
}

#[derive(Default)]
pub(crate) struct PipelineCache {
    pipelines: Mutex<HashMap<KernelKey, Kernel>>,
}

impl Gpu {
    /// Returns the pipeline for `source` specialised by `defines`, compiling it on first use.
    /// `SUBGROUP` is added to the defines when the device has subgroups and `use_subgroups` is
    /// asked for, so each family has one place that decides.
    pub fn kernel(
        &self,
        family: &'static str,
        source: &'static str,
        entry: &'static str,
        defines: &[(&'static str, String)],
    ) -> Result<Kernel, GpuError> {
        let mut defines = defines.to_vec();
        defines.sort();
        let key = KernelKey {
            family,
            entry,
            defines,
        };
        let cache = &self.inner.pipelines.pipelines;
        if let Some(k) = cache.lock().map_err(poisoned)?.get(&key) {
            return Ok(k.clone());
        }
        let kernel = self.compile(&key, source)?;
        cache.lock().map_err(poisoned)?.insert(key, kernel.clone());
        Ok(kernel)
    }

    fn compile(&self, key: &KernelKey, source: &str) -> Result<Kernel, GpuError> {
        let shader_error = |message: String| GpuError::Shader {
            family: key.family.to_owned(),
            entry: key.entry.to_owned(),
            message,
        };
        let text = kernel_text(source, &key.defines).map_err(shader_error)?;
        let label: Arc<str> = format!(
            "{}::{}[{}]",
            key.family,
            key.entry,
            key.defines
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        )
        .into();
        let device = &self.inner.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        // A backend's own shader compiler failing (D3D's FXC on a kernel it cannot express) is
        // an internal error: caught too, so it is this kernel's error, not a panic.
        let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(text.into()),
        };
        let module = if self.inner.caps.runtime_checks {
            device.create_shader_module(descriptor)
        } else {
            trusted_module(device, descriptor)
        };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(key.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[],
                // Every kernel initialises the workgroup memory it reads.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        let internal = pollster::block_on(internal.pop());
        if let Some(err) = pollster::block_on(scope.pop()).or(internal) {
            return Err(shader_error(err.to_string()));
        }
        let layout = pipeline.get_bind_group_layout(0);
        Ok(Kernel {
            pipeline: Arc::new(pipeline),
            layout,
            label,
        })
    }
}

fn poisoned<T>(_: T) -> GpuError {
    GpuError::Device("pipeline cache lock poisoned".to_owned())
}

/// The WGSL a kernel is compiled from: `source` preprocessed with `defines`, after common.wgsl.
pub(crate) fn kernel_text(source: &str, defines: &[(&str, String)]) -> Result<String, String> {
    let body = preprocess(source, defines)?;
    // The step's accessors refer to its binding: only kernels that bind it get them.
    let mut common_defines = defines.to_vec();
    if source.contains("var<uniform> step: Step") {
        common_defines.push(("STEP_BOUND", "1".to_owned()));
    }
    let common = preprocess(COMMON, &common_defines)?;
    // WGSL wants `enable` directives before any declaration, COMMON's included.
    let (enables, rest): (Vec<&str>, Vec<&str>) = body
        .lines()
        .partition(|line| line.trim_start().starts_with("enable "));
    Ok(format!(
        "{}\n{common}\n{}",
        enables.join("\n"),
        rest.join("\n")
    ))
}

/// Translates `source` with `defines` through naga (parse, validate, SPIR-V for each entry in
/// `entries`), panicking with the shader's diagnostics: the unit tests' check of kernels that CI's
/// software adapter cannot compile (cooperative matrices).
#[cfg(test)]
pub(crate) fn assert_translates(source: &str, defines: &[(&str, String)], entries: &[&str]) {
    use wgpu::naga;
    let what = format!("{defines:?}");
    let text = kernel_text(source, defines).unwrap_or_else(|e| panic!("{what}: {e}"));
    let module = naga::front::wgsl::parse_str(&text)
        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&text)));
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&text)));
    for entry in entries {
        let pipeline = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: (*entry).into(),
        };
        naga::back::spv::write_vec(
            &module,
            &info,
            &naga::back::spv::Options::default(),
            Some(&pipeline),
        )
        .unwrap_or_else(|e| panic!("{what} {entry}: {e}"));
    }
}
