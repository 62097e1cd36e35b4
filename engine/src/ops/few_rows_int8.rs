//! The product of a few rows over block formats with int8 products: the rows quantized to
//! int8 once (quant_rows.wgsl), then W streamed once in its blocks (few_rows_int8.wgsl).

use std::sync::LazyLock;

use super::matmul::product_source;
use super::matvec::{int8_input, k_quant};
use super::{MatMulOptions, Matrix, bind, flag, gelu_flags};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

/// How a workgroup is laid out: lanes per weight group (they split the row's `units`), weight
/// groups side by side (they read each piece of x once between them; a subgroup must not span
/// two, so only where subgroups are at most a group's lanes), and rows of x one workgroup
/// multiplies each unit of weights by (a step of more rows takes several chunks, whose
/// workgroups read the same weights side by side). `BACKPACK_FEW_ROWS_INT8=lanes=L,groups=G,rows=R`
/// sets them, for measuring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WorkgroupShape {
    lanes: u32,
    groups: u32,
    rows: u32,
}

/// The most invocations a workgroup may have on every adapter (WebGPU's default limit).
const MAX_INVOCATIONS: u32 = 256;

/// Weight groups (of four weight rows) up to which a product's lanes are too few to keep the
/// GPU's loads in flight at 32 lanes a group (see [`wide_shape`]).
const FEW_WEIGHT_GROUPS: u32 = 1024;

/// The default: 32 lanes a weight group (a subgroup where subgroups are wider), four weight
/// groups and four rows of x a workgroup. On an H200 (`bench --parallel 1,2,4,8,16`, Q4_K,
/// docs/performance-log.md) batched steps took 9–26 % less time than with 64 lanes, two
/// groups and eight rows: eight named sums a lane held registers that more workgroups in
/// flight put to better use, and a step of eight rows read each weight twice, from the cache
/// the second time. `BACKPACK_FEW_ROWS_INT8` sets it (and no `wide` shape is taken).
fn workgroup_shape(max_subgroup: Option<u32>) -> (WorkgroupShape, bool) {
    let lanes = max_subgroup.map_or(32, |size| size.clamp(32, MAX_INVOCATIONS));
    let mut shape = WorkgroupShape {
        lanes,
        groups: 4,
        rows: 4,
    };
    let forced = std::env::var("BACKPACK_FEW_ROWS_INT8").ok();
    if let Some(spec) = &forced {
        for (key, value) in spec.split(',').filter_map(|kv| kv.split_once('=')) {
            match (key.trim(), value.trim().parse::<u32>()) {
                ("lanes", Ok(v)) if v.is_power_of_two() && (32..=256).contains(&v) => {
                    shape.lanes = v
                }
                ("groups", Ok(v)) if v.is_power_of_two() => shape.groups = v,
                ("rows", Ok(v)) if (1..=32).contains(&v) => shape.rows = v,
                _ => {}
            }
        }
    }
    (fitted(shape, max_subgroup), forced.is_some())
}

/// `shape` with as many weight groups side by side as the adapter's subgroups and workgroups
/// allow.
fn fitted(mut shape: WorkgroupShape, max_subgroup: Option<u32>) -> WorkgroupShape {
    let fits_subgroups = max_subgroup.is_none_or(|size| size <= shape.lanes);
    if !fits_subgroups {
        shape.groups = 1;
    }
    shape.groups = shape.groups.clamp(1, MAX_INVOCATIONS / shape.lanes);
    shape
}

/// The shape for steps of one chunk of rows where the product's weight groups are few and
/// its rows at least 64 units (Llama-3.1-8B's output and down products: 1,024 groups): 64
/// lanes in two groups, twice the invocations streaming the same weights. On an H200 (`bench
/// --speculate 3 --profile`, a verification of four rows, 32 layers) the down products took
/// 1.05 against 1.34 ms and the output products 0.62 against 0.70 that way, while the QKV
/// products (1,536 groups) lost (0.83 against 0.74); verifications of four rows took 7.71
/// against 8.00 ms, batched steps of one to four rows 5 % less. Steps of more chunks have
/// workgroups enough: with it, verifications of eight rows took 11.4–11.5 against 11.0–11.1 ms.
fn wide_shape(
    shape: WorkgroupShape,
    max_subgroup: Option<u32>,
    units: u32,
    weight_groups: u32,
) -> Option<WorkgroupShape> {
    let wide = WorkgroupShape {
        lanes: 64,
        groups: 2,
        rows: shape.rows,
    };
    (shape.lanes < wide.lanes && units >= 64 && weight_groups <= FEW_WEIGHT_GROUPS)
        .then(|| fitted(wide, max_subgroup))
}

static SOURCE: LazyLock<String> = LazyLock::new(|| {
    super::quant_source::quant_source()
        + &product_source(&format!(
            "{}\n{}",
            super::few_rows::SUMS,
            include_str!("../../../shaders/few_rows_int8.wgsl")
        ))
});

const QUANTIZE_SOURCE: &str = include_str!("../../../shaders/quant_rows.wgsl");

/// Where the rows of a step's products go quantized to int8: one buffer for every product of
/// a model, since each quantizes its input just before it reads it.
pub struct Int8Rows {
    pub(super) words: StorageBuffer,
    pub(super) scales: StorageBuffer,
    rows: u32,
    pub(super) cols: u32,
}

impl Int8Rows {
    /// Room for `rows` rows of up to `cols` values, in two levels (LM heads' fine inputs).
    pub fn new(gpu: &Gpu, rows: u32, cols: u32) -> Result<Self, GpuError> {
        let values = 2 * u64::from(rows) * u64::from(cols.next_multiple_of(32));
        Ok(Self {
            words: gpu.storage("int8 rows", values)?,
            scales: gpu.storage("int8 row scales", values / 32 * 8)?,
            rows,
            cols,
        })
    }
}

/// How a [`FewRowsInt8`] reads its rows of x quantized: their width, the int8 words of a unit
/// (the order quant_rows.wgsl writes a row's words in), and the levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int8Input {
    pub cols: u32,
    pub unit_words: u32,
    pub levels: u32,
}

/// `Y = epilogue(X·Wᵀ)` over the rows of a batched decode step or a short prompt (any number
/// of rows, in chunks), for weights in a block format with int8 products. The rows are
/// quantized to int8 in 32-value blocks as the decode products quantize theirs; `fine` adds a
/// second level for the rounding remainders (LM heads). Takes the few-row product's epilogues.
/// Each output's sum is the same whatever the number of rows.
pub struct FewRowsInt8 {
    input: Int8Input,
    quantize: Kernel,
    quantize_group: wgpu::BindGroup,
    product: ProductKernel,
    /// Steps of one chunk of rows take this, where it exists (see [`wide_shape`]).
    wide: Option<ProductKernel>,
    blocks_per_row: u32,
    max_rows: u32,
    _params: UniformBuffer,
}

/// The product's kernel in one workgroup shape.
struct ProductKernel {
    kernel: Kernel,
    group: wgpu::BindGroup,
    workgroups_per_chunk: u32,
    x_rows: u32,
}

impl ProductKernel {
    fn new(
        gpu: &Gpu,
        shape: WorkgroupShape,
        defines: &[(&'static str, String)],
        entries: &[(u32, &wgpu::Buffer)],
        weight_groups: u32,
    ) -> Result<Self, GpuError> {
        let mut defines = defines.to_vec();
        defines.extend([
            ("XROWS", shape.rows.to_string()),
            ("WGROUPS", shape.groups.to_string()),
            ("WG", (shape.lanes * shape.groups).to_string()),
        ]);
        let kernel = gpu.kernel("few_rows_int8", SOURCE.as_str(), "main", &defines)?;
        let group = bind(gpu, &kernel, entries);
        Ok(Self {
            kernel,
            group,
            workgroups_per_chunk: weight_groups.div_ceil(shape.groups),
            x_rows: shape.rows,
        })
    }
}

impl FewRowsInt8 {
    /// The int8 form of the product `opts` describe over rows in `rows`, or None where the
    /// format has no int8 products, the shape is not one the kernel takes (k no multiple of 32,
    /// K-quant rows shorter than a sub-block pair of every lane, a convolution, f16 inputs or
    /// outputs) or the rows' buffer is too small.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        opts: &MatMulOptions<'_>,
        rows: &Int8Rows,
        fine: bool,
    ) -> Result<Option<Self>, GpuError> {
        if !int8_input(w)
            || !w.cols.is_multiple_of(32)
            || w.cols > rows.cols
            || opts.conv.is_some()
            || opts.half_in
            || opts.half_out
        {
            return Ok(None);
        }
        if opts.glu.is_some() && !w.rows.is_multiple_of(2) {
            return Err(GpuError::Device(format!(
                "a gated product needs gate and up halves: {} rows",
                w.rows
            )));
        }
        let levels: u32 = if fine { 2 } else { 1 };

        let k_pairs = k_quant(w);
        // Units of a row: sub-block pairs (K-quants, whose pairs share their quant bytes) or
        // sub-blocks; the int8 input words each takes.
        let (units, unit_words) = if k_pairs {
            (w.cols / 64, 16)
        } else {
            (w.cols / 32, 8)
        };
        let caps = gpu.caps();
        let weight_groups = super::few_rows::weight_groups(w, opts);
        let max_subgroup = caps.subgroups.then_some(caps.subgroup_max_size);
        let (shape, forced) = workgroup_shape(max_subgroup);
        let wide = wide_shape(shape, max_subgroup, units, weight_groups).filter(|_| !forced);
        let mut defines = w.defines();
        defines.extend(gelu_flags(opts.gelu));
        defines.extend([
            flag("QDOT", true),
            flag("XQ8", true),
            flag("KPAIR", k_pairs),
            flag("XQ8_VIEW", !k_pairs),
            flag("XQ8_FINE", fine),
            ("LEVELS", levels.to_string()),
            ("NR", "1".into()),
            ("UNITS", units.to_string()),
            ("UNIT_WORDS", unit_words.to_string()),
            flag("BIAS", opts.bias.is_some()),
            flag("RESIDUAL", opts.residual),
            flag("RELU", opts.relu),
            flag("GLU", opts.glu.is_some()),
            flag("SUBGROUP", gpu.caps().subgroups),
        ]);
        if let Some(kind) = opts.glu {
            defines.extend(kind.defines());
        }
        let quantize = gpu.kernel(
            "quant_rows",
            QUANTIZE_SOURCE,
            "main",
            &[
                ("K", w.cols.to_string()),
                ("LEVELS", levels.to_string()),
                ("UNIT_WORDS", unit_words.to_string()),
                flag("LEVELS_2", fine),
            ],
        )?;
        let params = super::few_rows::params(gpu, w, "few-row int8 product params");
        let quantize_group = bind(
            gpu,
            &quantize,
            &[
                (1, &step.buffer),
                (2, &x.buffer),
                (7, &rows.words.buffer),
                (9, &rows.scales.buffer),
            ],
        );
        let mut entries = vec![
            (0, &params.buffer),
            (1, &step.buffer),
            (4, &y.buffer),
            (7, &rows.words.buffer),
            (9, &rows.scales.buffer),
            // Sub-block pairs read the blocks only through their vec4 view; the other formats
            // load whole blocks through it and scales through words.
            (11, &w.buffer.buffer),
        ];
        if !k_pairs {
            entries.push((3, &w.buffer.buffer));
        }
        if let Some(b) = opts.bias {
            entries.push((5, &b.buffer));
        }
        let product = ProductKernel::new(gpu, shape, &defines, &entries, weight_groups)?;
        let wide = wide
            .map(|wide| ProductKernel::new(gpu, wide, &defines, &entries, weight_groups))
            .transpose()?;
        Ok(Some(Self {
            input: Int8Input {
                cols: w.cols,
                unit_words,
                levels,
            },
            quantize,
            quantize_group,
            product,
            wide,
            blocks_per_row: w.cols / 32,
            max_rows: rows.rows,
            _params: params,
        }))
    }

    /// Whether a step of `rows` rows fits the rows' buffer.
    pub fn takes(&self, rows: u32) -> bool {
        rows <= self.max_rows
    }

    /// How the product reads its rows quantized.
    pub fn input(&self) -> Int8Input {
        self.input
    }

    /// Records the product over the step's `rows` rows (as many as the step uniform says, and
    /// at most what [`Self::takes`]).
    pub fn encode(&self, rec: &mut Recorder<'_>, rows: u32) {
        rec.dispatch(
            &self.quantize,
            &self.quantize_group,
            (rows * self.blocks_per_row).div_ceil(64),
        );
        self.encode_quantized(rec, rows);
    }

    /// As [`Self::encode`], the rows being in the rows' buffer already, quantized as this
    /// product reads them (by a [`super::NormInt8`] just before).
    pub fn encode_quantized(&self, rec: &mut Recorder<'_>, rows: u32) {
        let product = match &self.wide {
            Some(wide) if rows <= wide.x_rows => wide,
            _ => &self.product,
        };
        rec.dispatch(
            &product.kernel,
            &product.group,
            product.workgroups_per_chunk * rows.div_ceil(product.x_rows),
        );
    }

    /// Takes one workgroup shape whatever the step's rows, so that each output is summed
    /// alike in steps of any width (batch-invariant serving).
    pub fn invariant(mut self) -> Self {
        self.wide = None;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn narrow() -> WorkgroupShape {
        WorkgroupShape {
            lanes: 32,
            groups: 4,
            rows: 4,
        }
    }

    #[test]
    fn few_weight_groups_over_long_rows_take_the_wide_shape() {
        let wide = |units, groups| wide_shape(narrow(), Some(32), units, groups);
        // Llama-3.1-8B's down (224 pairs a row) and output products (64 pairs), 1,024 groups.
        let expected = WorkgroupShape {
            lanes: 64,
            groups: 2,
            rows: 4,
        };
        assert_eq!(wide(224, 1024), Some(expected));
        assert_eq!(wide(64, 1024), Some(expected));
        // Its QKV products (1,536 groups), and rows of 32 pairs, which 64 lanes leave half idle.
        assert_eq!(wide(64, 1536), None);
        assert_eq!(wide(32, 512), None);
        // Lanes as wide already (64-lane subgroups).
        let shape = WorkgroupShape {
            lanes: 64,
            ..narrow()
        };
        assert_eq!(wide_shape(shape, Some(64), 224, 1024), None);
    }
}
