//! One expert product of a sparse layer (moe.wgsl's EXPERT and TILED forms, moe_coop.wgsl's
//! tensor-core tiles): which form and tile it takes, its defines and its kernel.

use super::{COOP_SOURCE, Dispatch, MoeBuffers, Params, SOURCE, finish};
use crate::gpu::{Gpu, GpuCaps, GpuError, StorageBuffer};
use crate::ops::{CoopTile, Matrix, flag};

/// Output rows and assignments of one SIMT tile of the prompts' expert products (`BR`, `BT`
/// in moe.wgsl).
const TILE_ROWS: u32 = 64;
const TILE_ASSIGNMENTS: u32 = 32;

/// The tensor-core tiles of the prompts' expert products, in order of preference: the first
/// that fits the adapter is taken. 2×4 subgroups of 2×2 fragments (64 assignments by 128
/// rows, with their 128 up rows) ran fastest on an H200; the smaller ones fit adapters with
/// less workgroup memory. See docs/performance-log.md.
const COOP_TILES: [&str; 3] = ["2x4/2x2", "2x2/2x2", "2x2/1x2"];

/// What distinguishes the gate/up product from the down product, and decoding's form from
/// the prompts'.
#[derive(Clone, Copy)]
pub(super) struct ProductSide<'a> {
    pub(super) glu: bool,
    pub(super) clamped: bool,
    pub(super) per_token: bool,
    pub(super) top_k: &'a str,
    pub(super) form: Form,
}

/// How an expert product runs.
#[derive(Clone, Copy)]
pub(super) enum Form {
    /// One token (EXPERT): `tpr` lanes per row of the chosen experts.
    Decode { tpr: u32 },
    /// Prompts as SIMT tiles (TILED).
    Tiled,
    /// Prompts as tensor-core tiles (moe_coop.wgsl).
    Coop(CoopTile),
}

impl Form {
    /// Output rows and assignments of one tile of a prompt form.
    pub(super) fn tile(&self) -> (u32, u32) {
        match self {
            Form::Coop(tile) => {
                let (assignments, rows) = tile.size();
                (rows, assignments)
            }
            Form::Decode { .. } | Form::Tiled => (TILE_ROWS, TILE_ASSIGNMENTS),
        }
    }
}

/// The tile `BACKPACK_MOE_TILE` asks for (`GMxGN/WMxWN[/DEPTH]`), for measurements.
pub(super) fn forced_tile() -> Option<String> {
    std::env::var("BACKPACK_MOE_TILE").ok()
}

/// The prompts' form on `caps`' adapter: tensor-core tiles where it has them and a tile fits
/// (`forced` first, then [`COOP_TILES`]), else SIMT tiles.
pub(super) fn prompt_form(caps: &GpuCaps, glu: bool, forced: Option<&str>) -> Form {
    if !caps.cooperative_matrix {
        return Form::Tiled;
    }
    let fits = |tile: &CoopTile| {
        let threads = tile.grid.0 * tile.grid.1 * caps.subgroup_min_size;
        caps.subgroup_min_size == caps.subgroup_max_size
            && staging_passes(tile, glu, caps.subgroup_min_size).is_some()
            && threads <= caps.max_workgroup_invocations
            && threads <= caps.max_workgroup_size_x
            && coop_workgroup_bytes(tile, glu) <= caps.max_workgroup_storage
    };
    forced
        .into_iter()
        .chain(COOP_TILES)
        .filter_map(|text| text.trim().parse::<CoopTile>().ok())
        .find(fits)
        .map_or(Form::Tiled, Form::Coop)
}

/// The input and weight eights an invocation of `tile` stages each k step (`XN`, `WG` in
/// moe_coop.wgsl): the tiles must be whole passes of the workgroup.
fn staging_passes(tile: &CoopTile, glu: bool, subgroup: u32) -> Option<(u32, u32)> {
    let threads = tile.grid.0 * tile.grid.1 * subgroup;
    let (assignments, rows) = tile.size();
    let weight_rows = if glu { 2 * rows } else { rows };
    let eights = |tile_rows: u32| {
        let total = tile_rows * tile.depth / 8;
        total.is_multiple_of(threads).then_some(total / threads)
    };
    Some((eights(assignments)?, eights(weight_rows)?))
}

/// Workgroup memory of moe_coop.wgsl: the staged f16 tiles (rows of `depth` + 8 halves; with
/// GLU twice the weight rows), one f32 fragment (pair) per subgroup, the tile's assignments
/// and moe.wgsl's expert run (a vec3, 16 bytes).
fn coop_workgroup_bytes(tile: &CoopTile, glu: bool) -> u32 {
    let (assignments, rows) = tile.size();
    let (weight_rows, fragment) = if glu { (2 * rows, 2048) } else { (rows, 1024) };
    (assignments + weight_rows) * (tile.depth + 8) * 2
        + tile.grid.0 * tile.grid.1 * fragment
        + assignments * 8
        + 16
}

/// Lanes per row: enough to stride a row's units a few at a time, a power of two (one row per
/// invocation on CPU adapters, where reductions across lanes cost most).
pub(super) fn lanes_per_row(gpu: &Gpu, w: &Matrix) -> u32 {
    if gpu.is_software() {
        return 1;
    }
    units_of(w).div_ceil(4).next_power_of_two().clamp(4, 64)
}

/// The units a row's lanes stride over: 32-value sub-blocks, or vec4 words of dense rows.
fn units_of(w: &Matrix) -> u32 {
    match w.quant {
        Some(_) => w.cols / 32,
        None => w.row_vecs(),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn expert_product(
    gpu: &Gpu,
    w: &Matrix,
    side: &ProductSide<'_>,
    params: Params,
    x: &StorageBuffer,
    bias: Option<&StorageBuffer>,
    bufs: &MoeBuffers,
    y: &StorageBuffer,
) -> Result<Dispatch, GpuError> {
    if w.quant.is_some() && !w.cols.is_multiple_of(32) {
        return Err(GpuError::Device(format!(
            "block-quantized expert rows of {} values are not whole sub-blocks",
            w.cols
        )));
    }
    let x_vec4 = reads_vec4(side, params.cols);
    let defines = product_defines(
        w.defines(),
        w.row_vecs(),
        units_of(w),
        side,
        x_vec4,
        bias.is_some(),
        gpu.caps(),
    );
    let mut entries = vec![
        // Rows of whole vec4s are read only through the vec4 view.
        (if x_vec4 { 12 } else { 2 }, x),
        (3, &w.buffer),
        (6, &bufs.order),
        (7, &bufs.offsets),
        (8, &bufs.live),
        (9, y),
    ];
    if let Some(b) = bias {
        entries.push((10, b));
    }
    let kernel = gpu.kernel(
        "moe expert",
        product_source(w.quant.is_some(), side.form),
        "main",
        &defines,
    )?;
    // The products read their rows from the routing state, not the step.
    finish(gpu, kernel, params, None, &entries)
}

/// Whether a product reads its inputs through the vec4 view: rows of whole vec4 words, in
/// the forms that read them so.
fn reads_vec4(side: &ProductSide<'_>, cols: u32) -> bool {
    cols.is_multiple_of(4) && !matches!(side.form, Form::Tiled)
}

fn product_source(quantized: bool, form: Form) -> &'static str {
    match (quantized, form) {
        (true, Form::Coop(_)) => crate::ops::quant_source::QUANT_MOE_COOP.as_str(),
        (true, _) => crate::ops::quant_source::QUANT_MOE.as_str(),
        (false, Form::Coop(_)) => COOP_SOURCE.as_str(),
        (false, _) => SOURCE,
    }
}

/// The defines of an expert product over weights with `weight_defines`, rows of `row_vecs`
/// vec4 words and `units` units.
fn product_defines(
    weight_defines: Vec<(&'static str, String)>,
    row_vecs: u32,
    units: u32,
    side: &ProductSide<'_>,
    x_vec4: bool,
    bias: bool,
    caps: &GpuCaps,
) -> Vec<(&'static str, String)> {
    let (tpr, decode) = match side.form {
        Form::Decode { tpr } => (tpr, true),
        Form::Tiled | Form::Coop(_) => (1, false),
    };
    let tiled = matches!(side.form, Form::Tiled);
    // A row's lanes reduce by shuffles where they lie in one subgroup of fixed size.
    let shuffles = caps.subgroups
        && caps.subgroup_min_size == caps.subgroup_max_size
        && tpr <= caps.subgroup_min_size
        && tpr > 1;
    let mut defines = weight_defines;
    defines.extend([
        flag("SGX", shuffles),
        flag("XVEC4", x_vec4),
        flag("PRODUCT", true),
        flag("EXPERT", decode),
        flag("TILED", tiled),
        flag("QDOT", decode),
        flag("QGATHER", tiled),
        ("TOP_K", side.top_k.to_owned()),
        ("ROW_VECS", row_vecs.to_string()),
        ("UNITS", units.to_string()),
        ("TPR", tpr.to_string()),
        ("TB", "4".into()),
        flag("GLU", side.glu),
        flag("CLAMPED", side.clamped),
        flag("BIAS", bias),
        flag("PER_TOKEN", side.per_token),
    ]);
    if let Form::Coop(tile) = side.form {
        let (tm, tn) = tile.size();
        let (xn, wg) = staging_passes(&tile, side.glu, caps.subgroup_min_size).unwrap_or((0, 0));
        defines.extend([
            ("XN", xn.to_string()),
            ("WG", wg.to_string()),
            ("GM", tile.grid.0.to_string()),
            ("GN", tile.grid.1.to_string()),
            ("WM", tile.frags.0.to_string()),
            ("WN", tile.frags.1.to_string()),
            ("TM", tm.to_string()),
            ("TN", tn.to_string()),
            ("SG", caps.subgroup_min_size.to_string()),
            ("KSUB", (tile.depth / 16).to_string()),
        ]);
    }
    defines
}

#[cfg(test)]
#[path = "moe_tests.rs"]
mod tests;
