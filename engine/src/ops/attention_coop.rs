//! Prompt attention on tensor cores (attention_coop.wgsl, appended to attention.wgsl): 64
//! queries of a head per workgroup, keys in blocks of 64 (32 for heads wider than 64; heads up
//! to 256 wide, each block loaded right before it is staged above 128), scores
//! and value sums as f16 fragment products with f32 accumulation, the outputs held in
//! fragments, and an online softmax between them. The wide form takes 128 queries a workgroup
//! (f16 rows of an encoder or a diffusion transformer, read straight into fragments), so each
//! staged block of keys and values serves twice the queries.

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

/// Queries per workgroup: 64, or 128 in the wide form.
pub(super) fn queries(wide: bool) -> u32 {
    if wide { 128 } else { 64 }
}

/// Keys per block for heads of `head_dim`: 64, or 32 where the staged keys and values of wider
/// heads (or the wide form's scores) would not fit.
fn block_keys(head_dim: u32, wide: bool) -> u32 {
    if head_dim <= 64 && !wide { 64 } else { 32 }
}

/// Heads wider than 128 dims: queries and outputs in fragments take most of the registers, and
/// the staged keys and values most of the workgroup memory (see [`fits`]).
fn very_wide(head_dim: u32) -> bool {
    head_dim > 128
}

/// Fragments of the head that pass through workgroup memory at once: the whole head up to 64
/// dims (32 in the wide form and for heads wider than 128), else the largest share of it that
/// fits.
fn pass_fragments(head_dim: u32, wide: bool) -> u32 {
    let fragments = head_dim / 16;
    let most = if wide || very_wide(head_dim) { 2 } else { 4 };
    (1..=most.min(fragments))
        .rev()
        .find(|f| fragments.is_multiple_of(*f))
        .unwrap_or(1)
}

/// Score and output rows in vec4s: the wider of a block's scores and a pass's outputs, and 8
/// more (4 for heads wider than 128: 256-dim heads then fit 48 KiB of workgroup memory, at the
/// cost of two-way bank conflicts in the softmax's reads).
fn score_row_quads(head_dim: u32, wide: bool) -> u32 {
    let pad = if very_wide(head_dim) { 4 } else { 8 };
    (block_keys(head_dim, wide).max(16 * pass_fragments(head_dim, wide)) + pad) / 4
}

/// Workgroup memory of the kernel: staged keys and values (rows of head_dim + 8 halves), and
/// per query a row of f32 scores (or outputs) and block_keys + 8 f16 probabilities, and a
/// flag per subgroup.
fn workgroup_bytes(head_dim: u32, wide: bool) -> u32 {
    let keys = block_keys(head_dim, wide);
    let queries = queries(wide);
    2 * keys * (head_dim + 8) * 2
        + queries * score_row_quads(head_dim, wide) * 16
        + queries * (keys + 8) * 2
        + queries / 16 * 4
}

/// Whether the kernel runs on `gpu` for heads of `head_dim`: cooperative matrices (16×16×16
/// f16 → f32), subgroups of 32 (two lanes per query), heads of whole fragments up to 64 dims
/// or of whole fragment pairs up to 256 (their outputs pass in pieces; above 128 dims unless
/// `BACKPACK_FLASH_VERY_WIDE=0`, for measuring the SIMT tiles there), and its workgroup
/// memory.
pub(super) fn fits(gpu: &Gpu, head_dim: u32) -> bool {
    let caps = gpu.caps();
    let very_wide_off = std::env::var("BACKPACK_FLASH_VERY_WIDE").is_ok_and(|v| v.trim() == "0");
    let shape = match head_dim {
        16..=64 => head_dim.is_multiple_of(16),
        65..=128 => head_dim.is_multiple_of(32),
        129..=256 => head_dim.is_multiple_of(32) && !very_wide_off,
        _ => false,
    };
    caps.cooperative_matrix
        && caps.subgroup_min_size == 32
        && caps.subgroup_max_size == 32
        && shape
        && caps.max_workgroup_storage >= workgroup_bytes(head_dim, false)
}

/// Whether the wide form runs on `gpu` for heads of `head_dim` (as [`fits`], heads of whole
/// fragment pairs), unless `BACKPACK_FLASH_WIDE=0`.
pub(super) fn fits_wide(gpu: &Gpu, head_dim: u32) -> bool {
    let off = std::env::var("BACKPACK_FLASH_WIDE").is_ok_and(|v| v.trim() == "0");
    !off && fits(gpu, head_dim)
        && head_dim.is_multiple_of(32)
        && !very_wide(head_dim)
        && gpu.caps().max_workgroup_storage >= workgroup_bytes(head_dim, true)
}

/// The kernel's own defines for heads of `head_dim`.
fn head_defines(head_dim: u32, wide: bool) -> [(&'static str, String); 13] {
    let keys = block_keys(head_dim, wide);
    let queries = queries(wide);
    let per_pass = pass_fragments(head_dim, wide);
    [
        ("FQ", queries.to_string()),
        ("SUBGROUPS", (queries / 16).to_string()),
        ("FK", keys.to_string()),
        ("KF", (keys / 16).to_string()),
        ("SQ", (keys / 8).to_string()),
        ("DF", (head_dim / 16).to_string()),
        ("PASSES", (head_dim / 16 / per_pass).to_string()),
        ("DFP", per_pass.to_string()),
        ("OQP", (2 * per_pass).to_string()),
        ("LDS4", score_row_quads(head_dim, wide).to_string()),
        ("KVQ", (keys * head_dim / (8 * queries)).to_string()),
        flag("QROWS", wide),
        flag("PREFETCH", !very_wide(head_dim)),
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

/// The kernel for attention.wgsl's `defines` (which must not ask for its `tiled` entry); `wide`
/// only with FULL and HALVES, for at least 128 queries, binding the queries at 12 in place of
/// 2.
pub(super) fn kernel(
    gpu: &Gpu,
    defines: &[(&'static str, String)],
    head_dim: u32,
    wide: bool,
) -> Result<Kernel, GpuError> {
    let mut defines: Vec<_> = defines
        .iter()
        .filter(|(k, _)| !matches!(*k, "TILED" | "BQ" | "BK"))
        .cloned()
        .collect();
    defines.push(flag("TILED", false));
    defines.push(kv_words(&defines));
    defines.extend(head_defines(head_dim, wide));
    gpu.kernel("attention_coop", SOURCE.as_str(), "flash", &defines)
}

#[cfg(test)]
mod tests {
    /// CI's software adapter has no cooperative matrices: naga checks each variant here.
    #[test]
    fn tensor_core_attention_translates_in_every_variant() {
        let mut checked = 0;
        for hd in [16u32, 32, 48, 64, 96, 128, 192, 256] {
            for (full, cache) in [
                (true, ""),
                (true, "HALVES"),
                (false, ""),
                (false, "F16"),
                (false, "Q8"),
            ] {
                // With FULL, `ring` stands for the wide form (HALVES, whole fragment pairs).
                let wide_too = cache == "HALVES" && hd.is_multiple_of(32) && !super::very_wide(hd);
                let variants = if !full || wide_too { 2 } else { 1 };
                for ring in [false, true].into_iter().take(variants) {
                    let wide = full && ring;
                    let mut defines = vec![
                        ("WG", "256".to_string()),
                        ("HD", hd.to_string()),
                        super::flag("FULL", full),
                        super::flag("HALVES", cache == "HALVES"),
                        super::flag("F16", cache == "F16"),
                        super::flag("Q8", cache == "Q8"),
                        super::flag("RING", ring && !full),
                        super::flag("SPLIT", false),
                        super::flag("TILED", false),
                        ("ROT", hd.to_string()),
                        ("MIN_SPLIT", "64".to_string()),
                        ("MAX_SPLITS", "16".to_string()),
                    ];
                    defines.push(super::kv_words(&defines));
                    defines.extend(super::head_defines(hd, wide));
                    assert!(super::workgroup_bytes(hd, wide) <= 48 * 1024);
                    crate::gpu::assert_translates(super::SOURCE.as_str(), &defines, &["flash"]);
                    checked += 1;
                }
            }
        }
        // 8 head sizes × (2 FULL forms + 2 × 3 cache forms), and the wide form at 32, 64, 96
        // and 128.
        assert_eq!(checked, 8 * 8 + 4);
    }
}
