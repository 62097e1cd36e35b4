use std::sync::LazyLock;

use bytemuck::{Pod, Zeroable};

use super::coop_tile::{CoopTile, ProductRows, coop_tile_from_env, default_coop_tile};
use super::{Conv2dShape, Gelu, GluKind, Matrix, WeightDType, bind, flag, gelu_flags};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

/// What every prompt-product kernel shares: the gated forms (glu_forms.wgsl), then
/// matmul_io.wgsl, before the tiles' own file.
pub(super) fn product_source(tiles: &str) -> String {
    format!(
        "{}\n{}\n{tiles}",
        super::elementwise::GLU_FORMS,
        include_str!("../../../shaders/matmul_io.wgsl")
    )
}

/// The SIMT tiles: any adapter.
pub(crate) static SIMT_SOURCE: LazyLock<String> =
    LazyLock::new(|| product_source(include_str!("../../../shaders/matmul.wgsl")));

/// The tensor-core tiles: adapters with cooperative matrices (see `GpuCaps`).
pub(crate) static COOP_SOURCE: LazyLock<String> =
    LazyLock::new(|| product_source(include_str!("../../../shaders/matmul_coop.wgsl")));

/// The CPU adapters' tiles (`matmul_cpu.wgsl`): subgroups of 8 lanes, no workgroup memory.
pub(crate) static CPU_SOURCE: LazyLock<String> =
    LazyLock::new(|| product_source(include_str!("../../../shaders/matmul_cpu.wgsl")));

/// Output tile edge of the CPU adapters' tiles.
const CPU_TILE: u32 = 32;

/// Products with fewer weights keep the SIMT tiles on CPU adapters: on lavapipe a CPU-tile
/// dispatch can cost ~1.5 ms of fixed time inside a long sequence of different dispatches,
/// which only pays where the product itself takes longer (tiny-sdxl's UNet step, whose
/// products have at most 8 K weights: 873 ms on the CPU tiles, 207 ms on the SIMT ones;
/// Whisper tiny.en's 147 K-weight products: 4.7× faster on the CPU tiles).
pub const CPU_TILES_FROM: u32 = 64 * 1024;

/// Output tile edge of the default tiles (both paths); `big_tiles` doubles it.
const TILE: u32 = 64;

/// matmul_io.wgsl's parameters (also the few-row product's, `few_rows.rs`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(super) struct Params {
    pub(super) n: u32,
    pub(super) k: u32,
    pub(super) row_vecs: u32,
    pub(super) slices: u32,
    pub(super) q_scales: u32,
    // What `reduce` needs to find the slices of a dispatch (see `MatMul::slices_for`).
    pub(super) col_tiles: u32,
    pub(super) tile_rows: u32,
    pub(super) target_workgroups: u32,
}

/// Output tiles wanted in flight: enough to occupy a large GPU (an H100 has 132 SMs).
pub const TARGET_WORKGROUPS: u32 = 256;
/// Smallest k slice worth a workgroup of its own.
const MIN_SLICE: u32 = 256;

/// The most k slices an `n`-wide product over `k` takes (a prompt of at most one row tile):
/// few output tiles are split along k so the GPU fills up. Longer prompts take fewer (see
/// [`MatMul::slices_for`]).
pub fn k_slices(n: u32, k: u32) -> u32 {
    let tiles = n.div_ceil(TILE);
    TARGET_WORKGROUPS
        .div_ceil(tiles)
        .min(k / MIN_SLICE)
        .clamp(1, 16)
}

#[derive(Clone, Copy, Default)]
pub struct MatMulOptions<'a> {
    pub bias: Option<&'a StorageBuffer>,
    pub gelu: Option<Gelu>,
    pub residual: bool,
    /// Scratch for k-split partial sums with room for `rows` rows (see
    /// [`MatMul::scratch_bytes`]); without it the product is never split.
    pub split_scratch: Option<(&'a StorageBuffer, u32)>,
    /// X is the input of this convolution rather than a `[rows][k]` matrix.
    pub conv: Option<Conv2dShape>,
    /// max(0, ·) after the residual.
    pub relu: bool,
    /// SIMT tiles 128 wide with 8×8 outputs per invocation: for dense products over
    /// thousands of rows with at least 128 outputs per row (never split along k). `None`
    /// leaves it to the adapter (GPUs take the 64-wide tiles; CPU adapters without tiles of
    /// their own the 128-wide ones for 128 outputs or more). The tensor-core tiles choose
    /// their size from the product's width, and CPU adapters with 8-lane subgroups run their
    /// own tiles (`matmul_cpu.wgsl`, never split) whatever this says.
    pub big_tiles: Option<bool>,
    /// The CPU adapters' own tiles (`matmul_cpu.wgsl`, never split): `None` leaves it to the
    /// adapter (CPU adapters with 8-lane subgroups take them for products of at least
    /// [`CPU_TILES_FROM`] weights); `Some` forces them on (where the adapter has them) or off
    /// (tests and benchmarks of the other tiles there).
    pub cpu_tiles: Option<bool>,
    /// The workgroups a split product aims for (default [`TARGET_WORKGROUPS`]); tests lower it
    /// to reach slice counts between one and the most on small products.
    pub split_target: Option<u32>,
    /// The tensor-core tile layout (benchmarks and tests); `None` picks one for the product.
    pub coop_tile: Option<CoopTile>,
    /// The rows every call multiplies, where they are fixed (an image network's pixels, a
    /// speech encoder's window): the tensor-core tiles size themselves to them. Prompts, whose
    /// length varies, leave it `None`. Convolutions know their rows from `conv`.
    pub rows: Option<u32>,
    /// W is a fused gate/up matrix (two blocks of `width` rows) and Y takes the `width` gated
    /// outputs, gated in the tiles' epilogue (or the k-split sums): tensor-core tiles only
    /// (see [`MatMul::gates_in_epilogue`]), with no residual, GELU or ReLU.
    pub glu: Option<GluKind>,
    /// Y takes f16 values, two to a 32-bit word (for a consumer that reads them so, such as a
    /// [`super::FullLayout`] with `f16`): tensor-core tiles only, over an even `n`, with no
    /// residual, gating or k split. Half the bytes of the f32 rows to write and to read back.
    pub half_out: bool,
    /// X holds f16 values, two to a 32-bit word (as a product with `half_out` or a norm with
    /// f16 outputs writes them): tensor-core tiles only, over k a multiple of 8, and no
    /// convolution. The tiles stage them as loaded, from half the bytes.
    pub half_in: bool,
    /// A GroupNorm folded into a convolution's input ([`super::GroupNorm::folded`]: each
    /// channel's scale, then each channel's shift), applied with SiLU as the input is loaded:
    /// only where [`MatMul::folds_input_norm`] says so.
    pub input_norm: Option<&'a StorageBuffer>,
}

/// `Y = X · Wᵀ` over all tokens of a step (prompt processing).
pub struct MatMul {
    tiled: Tiled,
    /// Prompts of at least [`LONG_PROMPT_ROWS`] tokens take this tile, where it differs.
    long: Option<Tiled>,
    /// The pass that sums k slices, when the product is split.
    reduce: Option<Kernel>,
    n: u32,
    /// Outputs per row: n, or n / 2 where the product gates its two blocks.
    out_width: u32,
    /// The k-split sums read four outputs at a time.
    reduce_v4: bool,
    /// The most k slices, and the workgroups a split aims for.
    slices: u32,
    split_target: u32,
    tensor_cores: bool,
    _conv: Option<UniformBuffer>,
}

/// One compiled tile layout of a product.
struct Tiled {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    /// The reduce pass's bindings (its parameters know this tile's size).
    reduce_group: Option<wgpu::BindGroup>,
    /// Output tile: rows, columns.
    tile: (u32, u32),
    _params: UniformBuffer,
}

/// Prompts of this many tokens or more may take a wider tensor-core tile than shorter ones
/// (`ProductRows::Fixed` in coop_tile.rs): the wide tiles pay where a product has row tiles
/// enough, and run short prompts at half speed.
pub const LONG_PROMPT_ROWS: u32 = 256;

/// What `MatMul::new` settles before building a tile: the kernel family and the defines
/// every tile of the product shares.
struct Plan<'a> {
    family: &'static str,
    source: &'static str,
    defines: Vec<(&'static str, String)>,
    slices: u32,
    split_target: u32,
    reduce_v4: bool,
    w: &'a Matrix,
}

impl MatMul {
    pub fn new(
        gpu: &Gpu,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        opts: MatMulOptions<'_>,
    ) -> Result<Self, GpuError> {
        let wanted = k_slices(w.rows, w.cols);
        let slices = match opts.split_scratch {
            Some((scratch, rows))
                if wanted > 1 && scratch.size >= Self::scratch_bytes(w.rows, w.cols, rows) =>
            {
                wanted
            }
            _ => 1,
        };
        let tensor_cores = gpu.caps().cooperative_matrix;
        let cpu = !tensor_cores
            && super::cpu_tiles(gpu)
            && opts
                .cpu_tiles
                .unwrap_or(w.rows.saturating_mul(w.cols) >= CPU_TILES_FROM);
        // The tensor-core tiles pick their own size; the SIMT ones decode blocks only into the
        // 64-wide tile. A CPU adapter not on its own tiles takes the big tile for dense
        // products at least a tile wide: its barriers and workgroup-memory loads cost more
        // than the rows a big tile computes for nothing (lavapipe, `bench-gemm`: 1500×384×384
        // from 582 to 301 ms).
        let big = opts
            .big_tiles
            .unwrap_or(gpu.is_software() && w.rows >= 2 * TILE)
            && !tensor_cores
            && !cpu
            && w.quant.is_none();
        if opts.half_out || opts.half_in {
            Self::check_halves(w, &opts, tensor_cores)?;
        }
        let slices = if big || cpu || opts.half_out {
            1
        } else {
            slices
        };
        let split = slices > 1;
        if let Some(kind) = opts.glu {
            Self::check_glu(gpu, w, &opts, kind)?;
        }
        let out_width = if opts.glu.is_some() {
            w.rows / 2
        } else {
            w.rows
        };
        let reduce_v4 = split && out_width.is_multiple_of(4);
        let mut defines = w.defines();
        // The tensor-core tiles bind X as vec4 words where its rows are whole words, or where
        // each eight columns of a convolution are eight channels of one input pixel.
        let x_words = tensor_cores
            && !opts.half_in
            && match &opts.conv {
                None => w.cols.is_multiple_of(4),
                Some(conv) => Self::loads_channel_eights(gpu, conv.cin),
            };
        if opts.input_norm.is_some() && !(x_words && opts.conv.is_some()) {
            return Err(GpuError::Device(format!(
                "a {}×{} product cannot fold a GroupNorm into its input: only tensor-core \
                 convolutions over channels in eights can",
                w.rows, w.cols
            )));
        }
        if tensor_cores {
            defines.push(flag("XV", x_words));
            defines.push(flag(
                "WRAW",
                w.quant.is_none() && w.dtype == WeightDType::F16,
            ));
        }
        defines.extend(gelu_flags(opts.gelu));
        defines.extend([
            flag("BIAS", opts.bias.is_some()),
            flag("RESIDUAL", opts.residual),
            flag("SPLIT_K", split),
            flag("REDUCE_V4", reduce_v4),
            flag("CONV", opts.conv.is_some()),
            flag("NORM_IN", opts.input_norm.is_some()),
            flag("RELU", opts.relu),
            flag("BIG", big),
            flag("GLU", opts.glu.is_some()),
            flag("HALF_OUT", opts.half_out),
            flag("HALF_IN", opts.half_in),
        ]);
        if let Some(kind) = opts.glu {
            defines.extend(kind.defines());
        }
        if cpu {
            let steps = if w.quant.is_some() {
                2
            } else {
                w.dtype.per_vec4() / 4
            };
            defines.push(("KSTEPS", steps.to_string()));
        }
        if let Some(conv) = opts.conv
            && conv.width() != w.cols
        {
            return Err(GpuError::Device(format!(
                "convolution {conv:?} needs weight rows of {}, not {}",
                conv.width(),
                w.cols
            )));
        }
        let conv_params = opts.conv.map(|c| gpu.uniform("conv params", &c));
        let split_target = opts
            .split_target
            .or_else(split_target_from_env)
            .unwrap_or(TARGET_WORKGROUPS)
            .max(1);
        let (family, source) = match (w.quant.is_some(), tensor_cores) {
            (true, _) if cpu => (
                "matmul_cpu_q",
                super::quant_source::QUANT_MATMUL_CPU.as_str(),
            ),
            _ if cpu => ("matmul_cpu", CPU_SOURCE.as_str()),
            (true, false) => ("matmul_q", super::quant_source::QUANT_MATMUL.as_str()),
            (true, true) => (
                "matmul_coop_q",
                super::quant_source::QUANT_MATMUL_COOP.as_str(),
            ),
            (false, false) => ("matmul", SIMT_SOURCE.as_str()),
            (false, true) => ("matmul_coop", COOP_SOURCE.as_str()),
        };
        let plan = Plan {
            family,
            source,
            defines,
            slices,
            split_target,
            reduce_v4,
            w,
        };
        // Everything but the parameters, which are each tile's own.
        let mut entries = vec![
            (1, &step.buffer),
            (2, &x.buffer),
            (3, &w.buffer.buffer),
            (4, &y.buffer),
        ];
        if let Some(b) = opts.bias {
            entries.push((5, &b.buffer));
        }
        if let Some(c) = &conv_params {
            entries.push((7, &c.buffer));
        }
        if let Some(norm) = opts.input_norm {
            entries.push((14, &norm.buffer));
        }
        let coop = if tensor_cores {
            Some(Self::coop_tiles(gpu, w, &opts)?)
        } else {
            None
        };
        let reduce = match opts.split_scratch {
            Some((scratch, _)) if split => {
                entries.push((6, &scratch.buffer));
                // The source's tile code needs a tile's defines even where `reduce` ignores it.
                let mut defines = plan.defines.clone();
                if let Some((short, _)) = coop {
                    defines.extend(short.defines(gpu.caps().subgroup_min_size));
                }
                Some(gpu.kernel(family, source, "reduce", &defines)?)
            }
            _ => None,
        };
        let (tiled, long) = match coop {
            Some((short, long)) => {
                let build = |tile: CoopTile| {
                    Tiled::new(gpu, &plan, tile.size(), Some(tile), &entries, &reduce)
                };
                (build(short)?, long.map(build).transpose()?)
            }
            None => {
                let tile = if big {
                    (2 * TILE, 2 * TILE)
                } else if cpu {
                    (CPU_TILE, CPU_TILE)
                } else {
                    (TILE, TILE)
                };
                (Tiled::new(gpu, &plan, tile, None, &entries, &reduce)?, None)
            }
        };
        Ok(Self {
            tiled,
            long,
            reduce,
            n: w.rows,
            out_width,
            reduce_v4,
            slices,
            split_target,
            tensor_cores,
            _conv: conv_params,
        })
    }

    /// Whether a convolution over `cin` input channels on `gpu` loads eight channels at once
    /// (tensor-core tiles, channels in eights): `BACKPACK_CONV_EIGHTS=0` loads them value by
    /// value, for measuring.
    fn loads_channel_eights(gpu: &Gpu, cin: u32) -> bool {
        gpu.caps().cooperative_matrix
            && cin.is_multiple_of(8)
            && !std::env::var("BACKPACK_CONV_EIGHTS").is_ok_and(|v| v.trim() == "0")
    }

    /// Whether a convolution over `cin` input channels on `gpu` can apply a folded GroupNorm
    /// and SiLU to its input as it loads it ([`MatMulOptions::input_norm`]).
    pub fn folds_input_norm(gpu: &Gpu, cin: u32) -> bool {
        Self::loads_channel_eights(gpu, cin)
    }

    /// Whether products on `gpu` can gate a fused gate/up product in their epilogue
    /// ([`MatMulOptions::glu`]): the tensor-core tiles can; elsewhere a separate pass (`Glu`)
    /// gates the product's output.
    pub fn gates_in_epilogue(gpu: &Gpu) -> bool {
        gpu.caps().cooperative_matrix
    }

    /// Whether the product can take f16 X (`half_in`) and write f16 Y (`half_out`) as asked.
    fn check_halves(
        w: &Matrix,
        opts: &MatMulOptions<'_>,
        tensor_cores: bool,
    ) -> Result<(), GpuError> {
        let refusal = if !tensor_cores {
            Some("the adapter has no tensor-core tiles")
        } else if opts.half_out && !w.rows.is_multiple_of(2) {
            Some("its width is odd")
        } else if opts.half_out && (opts.residual || opts.glu.is_some()) {
            Some("it adds to Y or gates its outputs")
        } else if opts.half_in && (!w.cols.is_multiple_of(8) || opts.conv.is_some()) {
            Some("its X is a convolution's input or k is no multiple of 8")
        } else {
            None
        };
        match refusal {
            Some(why) => Err(GpuError::Device(format!(
                "a {}×{} product cannot take f16 values here: {why}",
                w.rows, w.cols
            ))),
            None => Ok(()),
        }
    }

    fn check_glu(
        gpu: &Gpu,
        w: &Matrix,
        opts: &MatMulOptions<'_>,
        kind: GluKind,
    ) -> Result<(), GpuError> {
        let fits = Self::gates_in_epilogue(gpu)
            && w.rows.is_multiple_of(2)
            && !opts.residual
            && !opts.relu
            && opts.gelu.is_none()
            && opts.conv.is_none();
        if fits {
            Ok(())
        } else {
            Err(GpuError::Device(format!(
                "a {kind:?} gate in the product's epilogue needs tensor-core tiles, an even \
                 number of weight rows ({}), and no residual, GELU, ReLU or convolution",
                w.rows
            )))
        }
    }

    /// The tensor-core tile for the product, and for prompts whose length varies, the one
    /// long prompts take where it differs.
    fn coop_tiles(
        gpu: &Gpu,
        w: &Matrix,
        opts: &MatMulOptions<'_>,
    ) -> Result<(CoopTile, Option<CoopTile>), GpuError> {
        let caps = gpu.caps();
        let forced = opts.coop_tile.or_else(coop_tile_from_env);
        let rows = match opts.conv {
            Some(c) => ProductRows::Conv(c.out_h() * c.out_w),
            None => match (opts.rows, opts.split_scratch) {
                (Some(rows), Some(_)) => ProductRows::Fixed(rows),
                (Some(rows), None) => ProductRows::Unsplit(rows),
                _ => ProductRows::Varying,
            },
        };
        let short = forced.unwrap_or_else(|| default_coop_tile(w.rows, w.cols, rows, caps));
        // Gating pairs each subgroup of a tile's first half of columns with one of its second.
        let pairs = |tile: &CoopTile| opts.glu.is_none() || tile.grid.1.is_multiple_of(2);
        let long = match (forced, rows, opts.split_scratch) {
            (None, ProductRows::Varying, Some(_)) => Some(default_coop_tile(
                w.rows,
                w.cols,
                ProductRows::Fixed(LONG_PROMPT_ROWS),
                caps,
            ))
            .filter(|long| *long != short),
            _ => None,
        };
        let sg = caps.subgroup_min_size;
        for tile in std::iter::once(short).chain(long) {
            if !pairs(&tile) {
                return Err(GpuError::Device(format!(
                    "tensor-core tile {tile} cannot gate: its subgroup grid has an odd width"
                )));
            }
            if !tile.fits(caps) {
                return Err(GpuError::Device(format!(
                    "tensor-core tile {tile} does not fit this adapter (subgroups of {sg}, \
                     {} invocations and {} bytes of workgroup memory a workgroup)",
                    caps.max_workgroup_invocations, caps.max_workgroup_storage
                )));
            }
        }
        Ok((short, long))
    }

    /// Whether this product runs on the tensor-core tiles (its inputs are rounded to f16).
    pub fn uses_tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    /// Scratch a split `n`×`k` product needs for `rows` rows.
    pub fn scratch_bytes(n: u32, k: u32, rows: u32) -> u64 {
        let slices = k_slices(n, k);
        if slices <= 1 {
            return 0;
        }
        u64::from(slices) * u64::from(rows) * u64::from(n) * 4
    }

    /// The output tile (rows, columns) a dispatch of `rows` rows takes.
    pub fn tile_for(&self, rows: u32) -> (u32, u32) {
        self.tiled_for(rows).tile
    }

    /// The tile layout a dispatch of `rows` rows takes.
    fn tiled_for(&self, rows: u32) -> &Tiled {
        match &self.long {
            Some(long) if rows >= LONG_PROMPT_ROWS => long,
            _ => &self.tiled,
        }
    }

    /// The k slices of a dispatch for `rows` rows: as many as bring the output tiles up to
    /// the wanted workgroups, at most `slices`. Every slice's partial sums cross memory twice
    /// (scratch, then `reduce`), so a prompt with tiles enough of its own splits less or not at
    /// all. `reduce` in matmul_io.wgsl computes the same from its parameters.
    pub fn slices_for(&self, rows: u32) -> u32 {
        let tile = self.tiled_for(rows).tile;
        let tiles = (self.n.div_ceil(tile.1) * rows.div_ceil(tile.0)).max(1);
        self.split_target.div_ceil(tiles).clamp(1, self.slices)
    }

    /// Records the product for `n_tokens` rows (which must match the step uniform).
    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        let tiled = self.tiled_for(n_tokens);
        rec.dispatch_xyz(
            &tiled.kernel,
            &tiled.bind_group,
            [
                self.n.div_ceil(tiled.tile.1),
                n_tokens.div_ceil(tiled.tile.0),
                self.slices_for(n_tokens),
            ],
        );
        if let (Some(kernel), Some(group)) = (&self.reduce, &tiled.reduce_group) {
            // matmul_io.wgsl's reduce: four outputs an invocation in workgroups of 256 where
            // rows are whole vec4 words, else one an invocation in workgroups of 64.
            let outputs = n_tokens * self.out_width;
            let groups = if self.reduce_v4 {
                outputs.div_ceil(1024)
            } else {
                outputs.div_ceil(64)
            };
            rec.dispatch(kernel, group, groups);
        }
    }
}

impl Tiled {
    /// Compiles the product's kernel for `tile` outputs (a tensor-core layout, or the SIMT or
    /// CPU tiles') and binds `entries` (everything but the parameters) with parameters of its
    /// own.
    fn new(
        gpu: &Gpu,
        plan: &Plan<'_>,
        tile: (u32, u32),
        coop: Option<CoopTile>,
        entries: &[(u32, &wgpu::Buffer)],
        reduce: &Option<Kernel>,
    ) -> Result<Self, GpuError> {
        let w = plan.w;
        let mut defines = plan.defines.clone();
        if let Some(coop) = coop {
            defines.extend(coop.defines(gpu.caps().subgroup_min_size));
        }
        let kernel = gpu.kernel(plan.family, plan.source, "main", &defines)?;
        let params = gpu.uniform(
            "matmul params",
            &Params {
                n: w.rows,
                k: w.cols,
                row_vecs: w.row_vecs(),
                slices: plan.slices,
                q_scales: w.q_scales(),
                col_tiles: w.rows.div_ceil(tile.1),
                tile_rows: tile.0,
                target_workgroups: plan.split_target,
            },
        );
        let split = plan.slices > 1;
        let mut main_entries = vec![(0, &params.buffer)];
        // The split product writes only scratch; y is touched by the reduce pass.
        main_entries.extend(
            entries
                .iter()
                .filter(|(b, _)| !split || (*b != 4 && *b != 5))
                .copied(),
        );
        let bind_group = bind(gpu, &kernel, &main_entries);
        let reduce_group = reduce.as_ref().map(|reduce| {
            let scratch_binding = if plan.reduce_v4 { 12 } else { 6 };
            let mut reduce_entries = vec![(0, &params.buffer)];
            for &(binding, buffer) in entries {
                match binding {
                    1 | 4 | 5 => reduce_entries.push((binding, buffer)),
                    6 => reduce_entries.push((scratch_binding, buffer)),
                    _ => {}
                }
            }
            bind(gpu, reduce, &reduce_entries)
        });
        Ok(Self {
            kernel,
            bind_group,
            reduce_group,
            tile,
            _params: params,
        })
    }
}

/// `BACKPACK_SPLIT_TARGET=N` sets the workgroups every split product aims for (at most the
/// slices its scratch was sized for), for measuring in a whole model; malformed values are
/// ignored.
fn split_target_from_env() -> Option<u32> {
    std::env::var("BACKPACK_SPLIT_TARGET")
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
#[path = "matmul_tests.rs"]
mod tests;
