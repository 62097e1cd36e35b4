//! Prompt attention on tensor cores (attention_coop.wgsl, appended to attention.wgsl): 64
//! queries of a head per workgroup, keys in blocks of 64 (32 for heads wider than 64), scores
//! and value sums as f16 fragment products with f32 accumulation, the outputs held in
//! fragments, and an online softmax between them.

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

/// Keys per block for heads of `head_dim`: 64, or 32 where the staged keys and values of wider
/// heads would not fit beside the scores.
fn block_keys(head_dim: u32) -> u32 {
    if head_dim <= 64 { 64 } else { 32 }
}

/// Workgroup memory of the kernel: staged keys and values (rows of head_dim + 8 halves), and
/// per query 72 f32 scores (or outputs) and block_keys + 8 f16 probabilities, and a flag per
/// subgroup.
fn workgroup_bytes(head_dim: u32) -> u32 {
    let keys = block_keys(head_dim);
    2 * keys * (head_dim + 8) * 2 + 64 * 72 * 4 + 64 * (keys + 8) * 2 + 4 * 4
}

/// Whether the kernel runs on `gpu` for heads of `head_dim`: cooperative matrices (16×16×16
/// f16 → f32), subgroups of 32 (two lanes per query), heads of whole fragments up to 64 dims
/// or of whole fragment pairs up to 128 (their outputs pass in two halves), and its workgroup
/// memory.
pub(super) fn fits(gpu: &Gpu, head_dim: u32) -> bool {
    let caps = gpu.caps();
    let shape = match head_dim {
        16..=64 => head_dim.is_multiple_of(16),
        65..=128 => head_dim.is_multiple_of(32),
        _ => false,
    };
    caps.cooperative_matrix
        && caps.subgroup_min_size == 32
        && caps.subgroup_max_size == 32
        && shape
        && caps.max_workgroup_storage >= workgroup_bytes(head_dim)
}

/// The kernel's own defines for heads of `head_dim`.
fn head_defines(head_dim: u32) -> [(&'static str, String); 8] {
    let keys = block_keys(head_dim);
    let passes = if head_dim > 64 { 2 } else { 1 };
    let per_pass = head_dim / 16 / passes;
    [
        ("FK", keys.to_string()),
        ("KF", (keys / 16).to_string()),
        ("SQ", (keys / 8).to_string()),
        ("DF", (head_dim / 16).to_string()),
        ("PASSES", passes.to_string()),
        ("DFP", per_pass.to_string()),
        ("OQP", (2 * per_pass).to_string()),
        ("KVQ", (keys * head_dim / 512).to_string()),
    ]
}

/// Whether the keys and values come from an f16 or q8_0 cache or f16 rows (HALVES), whose
/// words the kernel keeps as loaded until it stages them (f32 sources it converts as they load).
fn kv_words(defines: &[(&'static str, String)]) -> (&'static str, String) {
    let set = |name: &str| defines.iter().any(|(k, v)| *k == name && v != "0");
    let full = set("FULL");
    flag(
        "KV_WORDS",
        (full && set("HALVES")) || (!full && (set("F16") || set("Q8"))),
    )
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
    defines.push(flag("TILED", false));
    defines.push(kv_words(&defines));
    defines.extend(head_defines(head_dim));
    gpu.kernel("attention_coop", SOURCE.as_str(), "flash", &defines)
}

#[cfg(test)]
mod tests {
    /// CI's software adapter has no cooperative matrices: naga checks each variant here.
    #[test]
    fn tensor_core_attention_translates_in_every_variant() {
        let mut checked = 0;
        for hd in [16u32, 32, 48, 64, 96, 128] {
            for (full, cache) in [
                (true, ""),
                (true, "HALVES"),
                (false, ""),
                (false, "F16"),
                (false, "Q8"),
            ] {
                for ring in [false, true].into_iter().take(1 + usize::from(!full)) {
                    let mut defines = vec![
                        ("WG", "256".to_string()),
                        ("HD", hd.to_string()),
                        super::flag("FULL", full),
                        super::flag("HALVES", cache == "HALVES"),
                        super::flag("F16", cache == "F16"),
                        super::flag("Q8", cache == "Q8"),
                        super::flag("RING", ring),
                        super::flag("SPLIT", false),
                        super::flag("TILED", false),
                        ("ROT", hd.to_string()),
                        ("MIN_SPLIT", "64".to_string()),
                        ("MAX_SPLITS", "16".to_string()),
                    ];
                    defines.push(super::kv_words(&defines));
                    defines.extend(super::head_defines(hd));
                    assert!(super::workgroup_bytes(hd) <= 48 * 1024);
                    crate::gpu::assert_translates(super::SOURCE.as_str(), &defines, &["flash"]);
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 6 * 8);
    }
}
