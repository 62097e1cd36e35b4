//! Diffusion-transformer plumbing (shaders/dit.wgsl): patch tokens, timestep-modulated norms,
//! gated residual adds, head norms with RoPE from a table, and padding-token rows.

use bytemuck::{Pod, Zeroable};

use super::flag;
use super::pass::{KernelSpec, Pass};
use crate::gpu::{Gpu, GpuError, StorageBuffer};

const SOURCE: &str = include_str!("../../../shaders/dit.wgsl");

/// Mirrors `Params` in dit.wgsl; what `extra`, `offset` and `patch` mean depends on the entry.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    extra: u32,
    eps: f32,
    offset: u32,
    side: u32,
    shift: u32,
    _pad: u32,
}

fn spec<'a>(entry: &'static str, defines: &'a [(&'static str, String)]) -> KernelSpec<'a> {
    KernelSpec {
        family: "dit",
        source: SOURCE,
        entry,
        defines,
    }
}

/// A latent's shape in patches: `width` pixels wide, `channels` deep, `side`² pixels a patch.
#[derive(Clone, Copy, Debug)]
pub struct PatchShape {
    pub tokens: u32,
    pub width: u32,
    pub channels: u32,
    pub side: u32,
}

impl PatchShape {
    fn params(self) -> Params {
        Params {
            rows: self.tokens,
            cols: self.side * self.side * self.channels,
            extra: self.width,
            offset: self.channels,
            side: self.side,
            ..Default::default()
        }
    }
}

/// Channel-last latent `[h·w][c]` → tokens `[tokens][side²·c]` (patch row, column, channel).
pub fn patchify(
    gpu: &Gpu,
    shape: PatchShape,
    latent: &StorageBuffer,
    tokens: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = shape.params();
    let grid = Pass::grid_of_64(params.rows * params.cols);
    Pass::new(
        gpu,
        spec("patchify", &[]),
        &params,
        &[(1, latent), (3, tokens)],
        grid,
    )
}

/// The inverse of [`patchify`].
pub fn unpatchify(
    gpu: &Gpu,
    shape: PatchShape,
    tokens: &StorageBuffer,
    latent: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = shape.params();
    let grid = Pass::grid_of_64(params.rows * params.cols);
    Pass::new(
        gpu,
        spec("unpatchify", &[]),
        &params,
        &[(1, tokens), (3, latent)],
        grid,
    )
}

/// Rows `first..first + rows` of `y` (`cols` wide) set to `token`.
pub fn fill_rows(
    gpu: &Gpu,
    (first, rows, cols): (u32, u32, u32),
    token: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = Params {
        rows,
        cols,
        extra: first,
        ..Default::default()
    };
    let grid = Pass::grid_of_64(rows * cols);
    Pass::new(
        gpu,
        spec("fill_rows", &[]),
        &params,
        &[(2, token), (3, y)],
        grid,
    )
}

/// Rows `used[0]..rows` of `y` (`cols` wide) set to `token`, the first row read when the pass
/// runs (`used` holds one u32).
pub fn fill_tail(
    gpu: &Gpu,
    (rows, cols): (u32, u32),
    used: &StorageBuffer,
    token: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = Params {
        rows,
        cols,
        ..Default::default()
    };
    let grid = Pass::grid_of_64(rows * cols);
    Pass::new(
        gpu,
        spec("fill_tail", &[]),
        &params,
        &[(2, token), (3, y), (6, used)],
        grid,
    )
}

/// Which norm a [`mod_norm`] takes of each row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowNorm {
    /// RMSNorm times a weight vector.
    Rms,
    /// LayerNorm without weight or bias.
    PlainLayer,
}

/// A vector inside a larger buffer: the timestep modulation's slices.
#[derive(Clone, Copy)]
pub struct Slice<'a> {
    pub buffer: &'a StorageBuffer,
    pub offset: u32,
}

fn row_grid(rows: u32) -> [u32; 3] {
    let [x, y] = crate::gpu::fold_grid(rows);
    [x, y, 1]
}

/// How a [`mod_norm`] normalises and where it writes.
#[derive(Clone, Copy)]
pub struct RowNormForm<'a> {
    pub norm: RowNorm,
    pub eps: f32,
    /// The RMSNorm's weight (none for a plain LayerNorm).
    pub weight: Option<&'a StorageBuffer>,
    /// Scales the normed row by `1 + scale`.
    pub scale: Option<Slice<'a>>,
    /// Then adds the vector at this offset in the scale's buffer (FLUX.2's adaLN shift).
    pub shift: Option<u32>,
    /// y takes f16 values, two to a word (for a product that reads its X so): an even width.
    pub half_out: bool,
}

/// `y[r] = norm(x[r]) · (1 + scale) + shift` for `rows` rows of `cols` (no scale or shift:
/// just the norm).
pub fn mod_norm(
    gpu: &Gpu,
    (rows, cols): (u32, u32),
    form: RowNormForm<'_>,
    x: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let RowNormForm {
        norm,
        eps,
        weight,
        scale,
        shift,
        half_out,
    } = form;
    if shift.is_some() && scale.is_none() {
        return Err(GpuError::Device(
            "a norm's shift is read from its scale's buffer: a scale is needed".into(),
        ));
    }
    if (norm == RowNorm::Rms) != weight.is_some() {
        return Err(GpuError::Device(
            "an RMSNorm takes a weight and a plain LayerNorm none".into(),
        ));
    }
    if half_out && !cols.is_multiple_of(2) {
        return Err(GpuError::Device(format!(
            "a norm of width {cols} cannot write f16 pairs"
        )));
    }
    let defines = [
        flag("LAYER", norm == RowNorm::PlainLayer),
        flag("WEIGHT", weight.is_some()),
        flag("MODULATE", scale.is_some()),
        flag("SHIFT", shift.is_some()),
        flag("HALF_OUT", half_out),
    ];
    let params = Params {
        rows,
        cols,
        eps,
        offset: scale.map_or(0, |s| s.offset),
        shift: shift.unwrap_or(0),
        ..Default::default()
    };
    let mut buffers = vec![(1, x), (if half_out { 5 } else { 3 }, y)];
    if let Some(w) = weight {
        buffers.push((2, w));
    }
    if let Some(s) = scale {
        buffers.push((4, s.buffer));
    }
    Pass::new(
        gpu,
        spec("mod_norm", &defines),
        &params,
        &buffers,
        row_grid(rows),
    )
}

/// `y[r] += tanh(gate) · RMSNorm(x[r]) · weight` (no gate: a plain add of the normed row).
#[allow(clippy::too_many_arguments)]
pub fn gated_add(
    gpu: &Gpu,
    (rows, cols): (u32, u32),
    eps: f32,
    weight: &StorageBuffer,
    gate: Option<Slice<'_>>,
    x: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let defines = [flag("LAYER", false), flag("MODULATE", gate.is_some())];
    let params = Params {
        rows,
        cols,
        eps,
        offset: gate.map_or(0, |s| s.offset),
        ..Default::default()
    };
    let mut buffers = vec![(1, x), (2, weight), (3, y)];
    if let Some(g) = gate {
        buffers.push((4, g.buffer));
    }
    Pass::new(
        gpu,
        spec("gated_add", &defines),
        &params,
        &buffers,
        row_grid(rows),
    )
}

/// In place over `tokens` fused QKV rows of `heads` query, key and value heads each: RMSNorm
/// of every query and key head (`q_weight`, `k_weight`), then RoPE on adjacent pairs with the
/// angles' `(cos, sin)` from `table` `[tokens][head_dim / 2][2]`. With `f16`, the rows hold
/// f16 values two to a word (as a product with `half_out` writes them).
#[allow(clippy::too_many_arguments)]
pub fn head_rope(
    gpu: &Gpu,
    (tokens, heads, head_dim): (u32, u32, u32),
    eps: f32,
    q_weight: &StorageBuffer,
    k_weight: &StorageBuffer,
    table: &StorageBuffer,
    qkv: &StorageBuffer,
    f16: bool,
) -> Result<Pass, GpuError> {
    if !head_dim.is_multiple_of(2) {
        return Err(GpuError::Device(format!(
            "RoPE over heads of {head_dim}: an even size is needed"
        )));
    }
    let params = Params {
        rows: tokens,
        cols: 3 * heads * head_dim,
        extra: head_dim,
        eps,
        side: heads,
        ..Default::default()
    };
    let rows = if f16 { 5 } else { 3 };
    Pass::new(
        gpu,
        spec("head_rope", &[flag("F16", f16)]),
        &params,
        &[(1, table), (2, q_weight), (rows, qkv), (4, k_weight)],
        {
            // Eight (token, head) items a workgroup (dit.wgsl HEAD_ITEMS).
            let [x, y] = crate::gpu::fold_grid((tokens * 2 * heads).div_ceil(8));
            [x, y, 1]
        },
    )
}

/// `y[r] += gate · x[r]` over `rows` rows of `cols`, the gate a vector of the modulation.
pub fn scaled_add(
    gpu: &Gpu,
    (rows, cols): (u32, u32),
    gate: Slice<'_>,
    x: &StorageBuffer,
    y: &StorageBuffer,
) -> Result<Pass, GpuError> {
    let params = Params {
        rows,
        cols,
        offset: gate.offset,
        ..Default::default()
    };
    // Four values an invocation where rows are whole vec4 words.
    let quads = cols.is_multiple_of(4);
    let (entries, invocations) = if quads {
        ([(7, x), (8, y), (4, gate.buffer)], rows * cols / 4)
    } else {
        ([(1, x), (3, y), (4, gate.buffer)], rows * cols)
    };
    Pass::new(
        gpu,
        spec("scaled_add", &[flag("QUADS", quads)]),
        &params,
        &entries,
        Pass::grid_of_64(invocations),
    )
}

/// FLUX.2's packed latent `[tokens][4·c]` (a `tokens_wide`-wide grid; feature `c·4 + dy·2 +
/// dx`) times the batch-norm σ plus its mean (`stats`: `[2][4·c]`, σ then mean) into the VAE's
/// channel-last latent `[2·rows·2·tokens_wide][c]`.
pub fn bn_unpack(
    gpu: &Gpu,
    (tokens, features, tokens_wide): (u32, u32, u32),
    stats: &StorageBuffer,
    packed: &StorageBuffer,
    latent: &StorageBuffer,
) -> Result<Pass, GpuError> {
    if !features.is_multiple_of(4) || tokens_wide == 0 || !tokens.is_multiple_of(tokens_wide) {
        return Err(GpuError::Device(format!(
            "{tokens} packed tokens of {features} features, {tokens_wide} wide: 2×2 patches of whole rows are needed"
        )));
    }
    let params = Params {
        rows: tokens,
        cols: features,
        extra: tokens_wide,
        ..Default::default()
    };
    Pass::new(
        gpu,
        spec("bn_unpack", &[]),
        &params,
        &[(1, packed), (2, stats), (3, latent)],
        Pass::grid_of_64(tokens * features),
    )
}

/// `rows` rows of `halves` (f16 values two to a word, `half_cols` of them) followed by `full`'s
/// f32 values (`full_cols`), written as one row of f16 pairs into `out`: two outputs side by
/// side for a product that reads its X as f16. Both widths must be even.
pub fn join_half_rows(
    gpu: &Gpu,
    rows: u32,
    (half_cols, full_cols): (u32, u32),
    halves: &StorageBuffer,
    full: &StorageBuffer,
    out: &StorageBuffer,
) -> Result<Pass, GpuError> {
    if !half_cols.is_multiple_of(2) || !full_cols.is_multiple_of(2) {
        return Err(GpuError::Device(format!(
            "rows of {half_cols} and {full_cols} values cannot join as f16 pairs"
        )));
    }
    let params = Params {
        rows,
        cols: (half_cols + full_cols) / 2,
        extra: half_cols / 2,
        offset: full_cols,
        ..Default::default()
    };
    // Four words an invocation where both parts are whole vec4 words of the joined row.
    let quads = half_cols.is_multiple_of(8) && full_cols.is_multiple_of(8);
    let words = rows * (half_cols + full_cols) / 2;
    let (entries, invocations) = if quads {
        ([(7, full), (9, out), (10, halves)], words / 4)
    } else {
        ([(1, full), (5, out), (6, halves)], words)
    };
    Pass::new(
        gpu,
        spec("join_half_rows", &[flag("QUADS", quads)]),
        &params,
        &entries,
        Pass::grid_of_64(invocations),
    )
}
