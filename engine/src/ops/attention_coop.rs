//! Prompt attention on tensor cores (attention_coop.wgsl, appended to attention.wgsl): 64
//! queries of a head per workgroup, keys in blocks of 64, scores and value sums as f16
//! fragment products with f32 accumulation, and an online softmax between them.

use std::sync::LazyLock;

use super::flag;
use crate::gpu::{Gpu, GpuError, Kernel};

static SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}\n{}",
        include_str!("../../../shaders/attention.wgsl"),
        include_str!("../../../shaders/attention_coop.wgsl")
    )
});

/// Queries per workgroup.
pub(super) const QUERIES: u32 = 64;

/// Workgroup memory of the kernel: staged keys and values (64 rows of 72 halves each), and
/// per query 68 f32 scores and 72 f16 probabilities.
const WORKGROUP_BYTES: u32 = 2 * 64 * 72 * 2 + 64 * 68 * 4 + 64 * 72 * 2;

/// Whether the kernel runs on `gpu` for heads of `head_dim`: cooperative matrices (16×16×16
/// f16 → f32), subgroups of 32 (two lanes per query), heads of 16 to 64 dims in whole
/// fragments, and its workgroup memory.
pub(super) fn fits(gpu: &Gpu, head_dim: u32) -> bool {
    let caps = gpu.caps();
    caps.cooperative_matrix
        && caps.subgroup_min_size == 32
        && caps.subgroup_max_size == 32
        && head_dim.is_multiple_of(16)
        && (16..=64).contains(&head_dim)
        && caps.max_workgroup_storage >= WORKGROUP_BYTES
}

/// The kernel for attention.wgsl's `defines` (which must not ask for its `tiled` entry).
pub(super) fn kernel(
    gpu: &Gpu,
    defines: &[(&'static str, String)],
    head_dim: u32,
) -> Result<Kernel, GpuError> {
    let mut defines: Vec<_> = defines
        .iter()
        .filter(|(k, _)| !matches!(*k, "TILED" | "BQ" | "BK"))
        .cloned()
        .collect();
    defines.extend([
        flag("TILED", false),
        ("DF", (head_dim / 16).to_string()),
        ("OQ", (head_dim / 8).to_string()),
    ]);
    gpu.kernel("attention_coop", SOURCE.as_str(), "flash", &defines)
}

#[cfg(test)]
mod tests {
    use wgpu::naga;

    /// CI's software adapter has no cooperative matrices: naga checks each variant here.
    #[test]
    fn tensor_core_attention_translates_in_every_variant() {
        let mut checked = 0;
        for hd in [16u32, 32, 48, 64] {
            for (full, cache) in [(true, ""), (false, ""), (false, "F16"), (false, "Q8")] {
                for ring in [false, true].into_iter().take(1 + usize::from(!full)) {
                    let defines = vec![
                        ("WG", "256".to_string()),
                        ("HD", hd.to_string()),
                        ("DF", (hd / 16).to_string()),
                        ("OQ", (hd / 8).to_string()),
                        super::flag("FULL", full),
                        super::flag("F16", cache == "F16"),
                        super::flag("Q8", cache == "Q8"),
                        super::flag("RING", ring),
                        super::flag("SPLIT", false),
                        super::flag("TILED", false),
                        ("ROT", hd.to_string()),
                        ("MIN_SPLIT", "64".to_string()),
                        ("MAX_SPLITS", "16".to_string()),
                    ];
                    let what = format!("{defines:?}");
                    let text =
                        crate::gpu::kernel_text(super::SOURCE.as_str(), &defines).expect(&what);
                    let module = naga::front::wgsl::parse_str(&text)
                        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&text)));
                    let info = naga::valid::Validator::new(
                        naga::valid::ValidationFlags::all(),
                        naga::valid::Capabilities::all(),
                    )
                    .validate(&module)
                    .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&text)));
                    let pipeline = naga::back::spv::PipelineOptions {
                        shader_stage: naga::ShaderStage::Compute,
                        entry_point: "flash".into(),
                    };
                    naga::back::spv::write_vec(
                        &module,
                        &info,
                        &naga::back::spv::Options::default(),
                        Some(&pipeline),
                    )
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 4 * 7);
    }
}
