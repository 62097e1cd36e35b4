use std::sync::LazyLock;

use bytemuck::{Pod, Zeroable};

use super::coop_tile::{CoopTile, ProductRows, coop_tile_from_env, default_coop_tile};
use super::{Conv2dShape, Gelu, Matrix, WeightDType, bind, flag, gelu_flags};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const IO: &str = include_str!("../../../shaders/matmul_io.wgsl");

/// The SIMT tiles: any adapter.
pub(crate) static SIMT_SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{IO}\n{}", include_str!("../../../shaders/matmul.wgsl")));

/// The tensor-core tiles: adapters with cooperative matrices (see `GpuCaps`).
pub(crate) static COOP_SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{IO}\n{}",
        include_str!("../../../shaders/matmul_coop.wgsl")
    )
});

/// The CPU adapters' tiles (`matmul_cpu.wgsl`): subgroups of 8 lanes, no workgroup memory.
pub(crate) static CPU_SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{IO}\n{}", include_str!("../../../shaders/matmul_cpu.wgsl")));

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

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    k: u32,
    row_vecs: u32,
    slices: u32,
    q_scales: u32,
    // What `reduce` needs to find the slices of a dispatch (see `MatMul::slices_for`).
    col_tiles: u32,
    tile_rows: u32,
    target_workgroups: u32,
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

#[derive(Default)]
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
    /// The rows every call multiplies, where they are fixed (an image network's pixels): the
    /// tensor-core tiles of a product that may split along k size themselves to them.
    /// Prompts, whose length varies, leave it `None`. Convolutions know their rows from
    /// `conv`.
    pub rows: Option<u32>,
}

/// `Y = X · Wᵀ` over all tokens of a step (prompt processing).
pub struct MatMul {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    /// The pass that sums k slices, when the product is split.
    reduce: Option<(Kernel, wgpu::BindGroup)>,
    n: u32,
    /// The most k slices, and the workgroups a split aims for.
    slices: u32,
    split_target: u32,
    /// Output tile: rows, columns.
    tile: (u32, u32),
    tensor_cores: bool,
    _params: UniformBuffer,
    _conv: Option<UniformBuffer>,
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
        let slices = if big || cpu { 1 } else { slices };
        let split = slices > 1;
        let mut defines = w.defines();
        let mut tile = if big {
            (2 * TILE, 2 * TILE)
        } else if cpu {
            (CPU_TILE, CPU_TILE)
        } else {
            (TILE, TILE)
        };
        if tensor_cores {
            let caps = gpu.caps();
            let coop = opts
                .coop_tile
                .or_else(coop_tile_from_env)
                .unwrap_or_else(|| {
                    let rows = match opts.conv {
                        Some(c) => ProductRows::Conv(c.out_h() * c.out_w),
                        None => match (opts.rows, opts.split_scratch) {
                            (Some(rows), Some(_)) => ProductRows::Fixed(rows),
                            _ => ProductRows::Varying,
                        },
                    };
                    default_coop_tile(w.rows, w.cols, rows, caps)
                });
            let sg = caps.subgroup_min_size;
            if !coop.fits(caps) {
                return Err(GpuError::Device(format!(
                    "tensor-core tile {coop} does not fit this adapter (subgroups of {sg}, \
                     {} invocations and {} bytes of workgroup memory a workgroup)",
                    caps.max_workgroup_invocations, caps.max_workgroup_storage
                )));
            }
            tile = coop.size();
            defines.extend(coop.defines(sg));
            defines.push(flag(
                "WRAW",
                w.quant.is_none() && w.dtype == WeightDType::F16,
            ));
        }
        // The tensor-core tiles bind X as vec4 words where its rows are whole words.
        let x_words = tensor_cores && opts.conv.is_none() && w.cols.is_multiple_of(4);
        if tensor_cores {
            defines.push(flag("XV", x_words));
        }
        defines.extend(gelu_flags(opts.gelu));
        defines.extend([
            flag("BIAS", opts.bias.is_some()),
            flag("RESIDUAL", opts.residual),
            flag("SPLIT_K", split),
            flag("REDUCE_V4", split && w.rows.is_multiple_of(4)),
            flag("CONV", opts.conv.is_some()),
            flag("RELU", opts.relu),
            flag("BIG", big),
        ]);
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
        let kernel = gpu.kernel(family, source, "main", &defines)?;
        let params = gpu.uniform(
            "matmul params",
            &Params {
                n: w.rows,
                k: w.cols,
                row_vecs: w.row_vecs(),
                slices,
                q_scales: w.q_scales(),
                col_tiles: w.rows.div_ceil(tile.1),
                tile_rows: tile.0,
                target_workgroups: split_target,
            },
        );
        let mut entries = vec![
            (0, &params.buffer),
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
        let reduce = match opts.split_scratch {
            Some((scratch, _)) if split => {
                entries.push((6, &scratch.buffer));
                let reduce = gpu.kernel(family, source, "reduce", &defines)?;
                let scratch_binding = if w.rows.is_multiple_of(4) { 12 } else { 6 };
                let mut reduce_entries = vec![
                    (0, &params.buffer),
                    (1, &step.buffer),
                    (4, &y.buffer),
                    (scratch_binding, &scratch.buffer),
                ];
                if let Some(b) = opts.bias {
                    reduce_entries.push((5, &b.buffer));
                }
                let group = bind(gpu, &reduce, &reduce_entries);
                Some((reduce, group))
            }
            _ => None,
        };
        // The split product writes only scratch; y is touched by the reduce pass.
        let entries: Vec<_> = entries
            .into_iter()
            .filter(|(b, _)| !split || (*b != 4 && *b != 5))
            .collect();
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Self {
            kernel,
            bind_group,
            reduce,
            n: w.rows,
            slices,
            split_target,
            tile,
            tensor_cores,
            _params: params,
            _conv: conv_params,
        })
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

    /// The k slices of a dispatch for `rows` rows: as many as bring the output tiles up to
    /// the wanted workgroups, at most `slices`. Every slice's partial sums cross memory twice
    /// (scratch, then `reduce`), so a prompt with tiles enough of its own splits less or not at
    /// all. `reduce` in matmul_io.wgsl computes the same from its parameters.
    pub fn slices_for(&self, rows: u32) -> u32 {
        let tiles = (self.n.div_ceil(self.tile.1) * rows.div_ceil(self.tile.0)).max(1);
        self.split_target.div_ceil(tiles).clamp(1, self.slices)
    }

    /// Records the product for `n_tokens` rows (which must match the step uniform).
    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        rec.dispatch_xyz(
            &self.kernel,
            &self.bind_group,
            [
                self.n.div_ceil(self.tile.1),
                n_tokens.div_ceil(self.tile.0),
                self.slices_for(n_tokens),
            ],
        );
        if let Some((kernel, group)) = &self.reduce {
            // matmul_io.wgsl's reduce: four outputs an invocation in workgroups of 256 where
            // rows are whole vec4 words, else one an invocation in workgroups of 64.
            let groups = if self.n.is_multiple_of(4) {
                (n_tokens * self.n).div_ceil(1024)
            } else {
                (n_tokens * self.n).div_ceil(64)
            };
            rec.dispatch(kernel, group, groups);
        }
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
mod tests {
    use super::*;
    use crate::load::GgmlType;

    /// The tensor-core tiles only compile on adapters with cooperative matrices, which CI's
    /// software adapter lacks: naga checks every variant here (parse, validation, SPIR-V).
    #[test]
    fn tensor_core_tiles_translate_in_every_variant() {
        let dense =
            [WeightDType::F32, WeightDType::F16].map(|d| (COOP_SOURCE.as_str(), d.defines()));
        let quant = [
            GgmlType::Q8_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
        ]
        .map(|ty| {
            let source = super::super::quant_source::QUANT_MATMUL_COOP.as_str();
            (source, super::super::quant_defines(ty, 512))
        });
        let mut checked = 0;
        for (source, base) in dense.iter().chain(&quant) {
            let raw = base.iter().any(|(k, v)| *k == "F16" && v == "1");
            for (tile, split, conv) in [
                ("2x2/4x4", false, false),
                ("4x4/2x2", true, false),
                ("4x2/2x2", false, true),
                ("2x2/4x2", true, true),
                ("4x4/2x2/64", false, false),
                ("4x2/2x2/64", true, true),
                ("4x4/2x4", false, true),
                ("4x4/4x2", true, false),
            ] {
                let tile: CoopTile = tile.parse().expect("tile");
                let mut defines = base.clone();
                defines.extend(tile.defines(32));
                defines.extend([
                    flag("WRAW", raw),
                    flag("XV", !conv),
                    flag("BIAS", true),
                    flag("RESIDUAL", !split),
                    flag("SPLIT_K", split),
                    flag("REDUCE_V4", split && !conv),
                    flag("CONV", conv),
                    flag("RELU", false),
                    flag("BIG", false),
                ]);
                defines.extend(gelu_flags(None));
                let entries = ["main", "reduce"];
                crate::gpu::assert_translates(source, &defines, &entries[..1 + usize::from(split)]);
                checked += 1;
            }
        }
        assert_eq!(checked, 7 * 8);
    }
}
