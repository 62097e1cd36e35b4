use bytemuck::{Pod, Zeroable};

use super::{Gelu, MatVecLayout, Matrix, NormKind, bind, flag, gelu_flags};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};
use crate::load::GgmlType;

pub(super) const SOURCE: &str = concat!(
    include_str!("../../../shaders/matvec.wgsl"),
    include_str!("../../../shaders/matvec_handoff.wgsl"),
    include_str!("../../../shaders/route.wgsl")
);
const WG: u32 = 256;
const XCACHE_MAX_BYTES: u64 = 16 * 1024;
/// Workgroups a product keeps at least, before rows are grouped into fewer workgroups. On an
/// H200 (Qwen2.5-1.5B shapes) 512 beat one block per workgroup by 6-8% and 256 or 128 (fewer
/// workgroups in flight) by 10-50%.
const MIN_WORKGROUPS: u32 = 512;
/// Workgroups enough for a few lanes per quantized row where rows are short (under 4096
/// values): on an H200 the attention products of 1-1.7B models (96-384 workgroups that way)
/// decoded Llama-3.2-1B Q4_0 at 1,074 tok/s against 930 with 64 lanes per row, Q8_0 935
/// against 840, SmolLM2-1.7B Q4_0 775 against 736, Qwen2.5-1.5B Q4_0 660 against 630.
/// SmolLM2-135M's products (9-24 workgroups) keep 64 lanes (see `MatVec::new`).
const SHORT_ROW_MIN_WORKGROUPS: u32 = 96;
/// The most invocations a product handing its output off may take per workgroup to make its
/// rows whole blocks. On an H200 a down product of K-quant rows grown to 1,024 (8 rows per 256
/// invocations) lost what the QKV product reading its output gained.
pub const HANDOFF_MAX_WORKGROUP: u32 = 512;
/// Workgroups a product merging split attention keeps at least when it takes more rows a
/// workgroup (see `MatVec::new`).
const COMBINE_SPLIT_WORKGROUPS: u32 = 128;
/// The most rows a workgroup handing its output off takes (12 bytes of workgroup memory each).
const HANDOFF_MAX_ROWS: u32 = 1024;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    k: u32,
    row_vecs: u32,
    glu_offset: u32,
    eps: f32,
    heads: u32,
    head_dim: u32,
    q_scales: u32,
    expert_stride: u32,
    row_step: u32,
    up_offset: u32,
    experts: u32,
    alpha: f32,
    limit: f32,
    _pad: [u32; 2],
}

/// The routed experts of one decoded token as a decode product (shaders/matvec.wgsl EXPERTS):
/// workgroup row s computes the rows of expert `ids[s]`, so only the chosen experts' weights
/// are read and the ids never leave the GPU. The output holds `slots` rows of `rows` values.
#[derive(Clone, Copy)]
pub struct ExpertSlots<'a> {
    /// The chosen experts, `slots` of them.
    pub ids: &'a StorageBuffer,
    pub slots: u32,
    pub experts: u32,
    /// Outputs per expert.
    pub rows: u32,
    /// Expert e's output row r reads weight row `e·expert_stride + r·row_step`; its up row
    /// (gated products) is `up_offset` rows further.
    pub expert_stride: u32,
    pub row_step: u32,
    pub up_offset: u32,
    /// Slot s reads row s of the input (the down product over the slots' hidden rows) rather
    /// than the token's one row.
    pub input_per_slot: bool,
    /// GPT-OSS's clamped SwiGLU: (alpha, limit).
    pub clamp: Option<(f32, f32)>,
    /// The product routes the token itself (adapters with subgroups): `ids` are then written.
    pub route: Option<SlotRouting<'a>>,
}

/// Routing inside an expert product (see [`ExpertSlots::route`]): the token's router logits,
/// where each slot's weight goes, and how the weights are made.
#[derive(Clone, Copy)]
pub struct SlotRouting<'a> {
    pub logits: &'a StorageBuffer,
    pub weights: &'a StorageBuffer,
    /// The chosen experts' share of a softmax over all of them, rather than a softmax over
    /// the chosen ones.
    pub softmax_all: bool,
}

/// A router's product that routes the token itself (see [`MatVecOptions::routes`]): where the
/// chosen experts and their weights go, and how the weights are made.
#[derive(Clone, Copy)]
pub struct TokenRouting<'a> {
    pub ids: &'a StorageBuffer,
    pub weights: &'a StorageBuffer,
    pub top_k: u32,
    /// As [`SlotRouting::softmax_all`].
    pub softmax_all: bool,
}

/// Where the split attention of one token left its runs (see [`super::Attention::new_split`]).
pub struct SplitAttention<'a> {
    pub partials: &'a StorageBuffer,
    pub stats: &'a StorageBuffer,
    pub heads: u32,
    pub head_dim: u32,
    /// The attention's sliding window, if it has one (it splits fewer keys).
    pub window: Option<u32>,
    /// The token's QKV row where it carries an output gate head after each query head
    /// (Qwen3.5): the merged output is scaled by sigmoid of it.
    pub gate: Option<&'a StorageBuffer>,
    /// A logit per query head joining each softmax's denominator (GPT-OSS), added where the
    /// runs are merged.
    pub sinks: Option<&'a StorageBuffer>,
}

/// A row handed from one decode product to the next as int8 blocks (shaders/matvec_handoff.wgsl):
/// the product writing the row quantizes it once, where each workgroup of the product reading
/// it would otherwise read and quantize the whole f32 row (and its norm's gains) itself. On an
/// H200 that prologue took 4-6 µs of each 13-18 µs product (SmolLM2-1.7B Q4_K, `bench
/// --profile`).
pub struct Int8Handoff {
    buffer: StorageBuffer,
    len: u32,
}

impl Int8Handoff {
    /// A handoff of rows of `len` values, a multiple of 32 (whole int8 blocks).
    pub fn new(gpu: &Gpu, len: u32) -> Result<Self, GpuError> {
        if len == 0 || !len.is_multiple_of(32) {
            return Err(GpuError::Device(format!(
                "an int8 handoff takes whole 32-value blocks; rows of {len} are not"
            )));
        }
        // The int8 words, then two words of statistics per 16 values (see the shader).
        let words = len / 4 + len / 8;
        Ok(Self {
            buffer: gpu.storage("int8 handoff", u64::from(words) * 4)?,
            len,
        })
    }
}

/// Options of the decode product. A fused norm normalises the input row in each workgroup.
#[derive(Default)]
pub struct MatVecOptions<'a> {
    pub norm: Option<(NormKind, &'a StorageBuffer, Option<&'a StorageBuffer>, f32)>,
    pub bias: Option<&'a StorageBuffer>,
    /// The matrix holds the gate rows then the up rows; the output is silu(gate) * up, or
    /// gelu(gate) * up with `gelu` (tanh form only).
    pub glu: bool,
    pub gelu: Option<Gelu>,
    /// Add into the output instead of overwriting it (the residual stream).
    pub residual: bool,
    /// The input is split attention output, merged while staging (`x` is then unused).
    pub combine: Option<SplitAttention<'a>>,
    /// Parts of the kernel layout to force (unset parts are chosen from the shape and device).
    pub layout: MatVecLayout,
    /// The input as the product before handed it off, instead of `x`, where this product takes
    /// int8 inputs in one level (the caller makes sure that product writes it).
    pub handoff_in: Option<&'a Int8Handoff>,
    /// Also hand the output off to the next product, times the gains of its fused RMSNorm if
    /// it has one.
    pub handoff_out: Option<(&'a Int8Handoff, Option<&'a StorageBuffer>)>,
    /// Rows of the token's chosen experts rather than of the whole matrix (block formats
    /// only; K-quant rows only with int8 inputs).
    pub experts: Option<ExpertSlots<'a>>,
    /// A router's product (one token's logits, `y`) computed in one workgroup, which then
    /// routes the token from them: the layout must put every row in one workgroup, and the
    /// adapter must have subgroups.
    pub routes: Option<TokenRouting<'a>>,
}

/// `y = W · x̂` for the last token of the step (decoding, and the LM head after a prompt).
pub struct MatVec {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    workgroups: u32,
    int8: bool,
    int8_levels: u32,
    reads_handoff: bool,
    hands_off: bool,
    /// Workgroup rows: the expert slots (a plain product's grid is folded instead).
    slots: Option<u32>,
    _params: UniformBuffer,
}

impl MatVec {
    pub fn new(
        gpu: &Gpu,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        opts: MatVecOptions<'_>,
    ) -> Result<Self, GpuError> {
        let n = match (&opts.experts, opts.glu) {
            (Some(e), _) => e.rows,
            (None, true) => w.rows / 2,
            (None, false) => w.rows,
        };
        // The rows the whole dispatch computes, which the layout's workgroup counts go by.
        let all_rows = n * opts.experts.as_ref().map_or(1, |e| e.slots);
        if opts.experts.is_some()
            && (w.quant.is_none()
                || opts.residual
                || opts.combine.is_some()
                || opts.handoff_in.is_some()
                || opts.handoff_out.is_some())
        {
            return Err(GpuError::Device(
                "expert decode products take block-format weights and a plain input".into(),
            ));
        }
        if opts.glu && opts.gelu.is_some_and(|g| g != Gelu::Tanh) {
            return Err(GpuError::Device(
                "a gated product takes SiLU or tanh GELU only".into(),
            ));
        }
        let caps = gpu.caps();
        // A fixed subgroup size lets a row's lanes reduce with shuffles inside one subgroup.
        let fixed_subgroup = (caps.subgroups
            && caps.subgroup_min_size == caps.subgroup_max_size
            && caps.subgroup_min_size.is_power_of_two()
            && caps.subgroup_min_size >= 4)
            .then_some(caps.subgroup_min_size);
        // Quantized rows: a few 32-weight sub-blocks per lane, then a shuffle reduction, when
        // the matrix has rows enough to keep MIN_WORKGROUPS busy that way (on an H200 the
        // Qwen2.5-1.5B Q4_K gate/up product went from 43 to 31 µs; short rows need fewer
        // workgroups, SHORT_ROW_MIN_WORKGROUPS); smaller matrices keep 64
        // lanes per row, since fewer, fuller workgroups left the GPU idle (SmolLM2-135M Q4_0
        // fell from 833 to 633 tok/s).
        // K-quant lanes take sub-blocks in pairs (see q_dot_pairs), so half as many per row.
        let per_lane_unit = if k_quant(w) { 64 } else { 32 };
        let quant_lanes = fixed_subgroup
            .map(|sg| {
                (w.cols / per_lane_unit / 4)
                    .next_power_of_two()
                    .clamp(4, sg)
            })
            .filter(|&lanes| {
                let workgroups = all_rows / (WG / lanes);
                workgroups >= MIN_WORKGROUPS
                    || (w.cols < 4096 && workgroups >= SHORT_ROW_MIN_WORKGROUPS)
            });
        let mut tpr: u32 = match (w.quant.is_some(), quant_lanes) {
            (true, Some(lanes)) => lanes,
            // Without that, 64 lanes per quantized row measured fastest on an H100 (Q4_K: 317
            // tok/s against 295 with 32 lanes and 263 with 128).
            (true, None) => 64,
            // More lanes per row for long rows keeps enough loads in flight per row.
            (false, _) if w.cols >= 4096 => 64,
            (false, _) => 32,
        };
        let mut rows_per_group = 1;
        let mut xcache = Self::stages_input(gpu, w.cols);
        // Long rows of 32-weight int8 blocks with too few rows for sub-block lanes (down
        // products): a subgroup per row, two rows per subgroup sharing each input read, where
        // that still leaves 128 workgroups. On an H200 (`bench`, 128 tokens) SmolLM2-1.7B
        // decoded Q4_0 at 742 tok/s against 726 with 64 lanes per row, Q8_0 670 against 659,
        // and Llama-3.2-1B Q4_0 936 against 919; Qwen2.5-1.5B's 1536 rows (96 workgroups) were
        // 0.5 % slower so.
        if let Some(sg) = fixed_subgroup
            && quant_lanes.is_none()
            && matches!(
                w.quant,
                Some((GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0, _))
            )
            && w.cols >= 4096
            && all_rows / ((WG / sg).max(1) * 2) >= 128
        {
            tpr = sg;
            rows_per_group = 2;
        }
        // K-quant rows with a sub-block pair for every lane of a subgroup: a subgroup per row,
        // two rows per subgroup sharing each input read, the input staged where it fits. On an
        // H100 (SmolLM2-1.7B Q4_K) that decoded 601 tok/s against 505 with the layouts above;
        // four rows per subgroup, or 16 lanes per row, were slower (370, 480).
        // Rows long enough for four pairs a lane (down products) take one row per subgroup
        // instead: on an H200 (SmolLM2-1.7B Q4_K, rows of 8192) that decoded 704-710 tok/s
        // against 687-699.
        if let Some(sg) = fixed_subgroup
            && k_quant(w)
            && w.cols / 64 >= sg
        {
            tpr = sg;
            rows_per_group = if w.cols / 64 >= 4 * sg { 1 } else { 2 };
            xcache = Self::input_fits(gpu, w.cols);
        }
        // K-quant rows too short for that still take sub-block pairs (and int8 products): the
        // most lanes, a power of two, that leave every lane a pair. On an H200 (Qwen2.5-1.5B
        // Q4_K, rows of 1536) 16 lanes per row decoded 490 tok/s against 442 with 64 lanes,
        // which left the pairs and the int8 products to the per-sub-block float path.
        if let Some(sg) = fixed_subgroup
            && k_quant(w)
            && w.cols / 64 < sg
        {
            tpr = prev_power_of_two(w.cols / 64).clamp(4, sg);
            rows_per_group = 1;
        }
        // The environment's layout (for measuring) wins over the caller's, and that over a
        // CPU adapter's.
        let forced = MatVecLayout::from_env(w.cols, n, opts.glu)
            .or(opts.layout)
            .or(MatVecLayout::software(gpu, w.quant.is_some()));
        // A forced workgroup past the adapter's limits falls back to the default (a router's
        // product that must fit one workgroup is then refused below, and routed otherwise).
        let mut wg = forced
            .workgroup
            .filter(|w| {
                [64, 128, 256, 512, 1024].contains(w)
                    && *w <= caps.max_workgroup_invocations
                    && *w <= caps.max_workgroup_size_x
            })
            .unwrap_or(WG);
        if let Some(lanes) = forced.lanes.filter(|l| l.is_power_of_two() && *l <= wg) {
            tpr = lanes;
        }
        let tpr = tpr.min(wg);
        if let Some(rows) = forced.rows.filter(|r| (1..=4).contains(r)) {
            rows_per_group = rows;
        }
        let handoffs = forced.handoff != Some(false);
        let mut handoff_out = opts.handoff_out.filter(|_| handoffs);
        // A product handing its output off quantizes whole blocks of 16 or 32 rows in each
        // workgroup, so its workgroups take more invocations (the same rows each) where a
        // block spans several, up to HANDOFF_MAX_WORKGROUP.
        if handoff_out.is_some() && forced.workgroup.is_none() {
            let largest = gpu
                .caps()
                .max_workgroup_invocations
                .min(HANDOFF_MAX_WORKGROUP);
            let mut grown = wg;
            while !(grown / tpr * rows_per_group).is_multiple_of(16) && grown * 2 <= largest {
                grown *= 2;
            }
            if (grown / tpr * rows_per_group).is_multiple_of(16) {
                wg = grown;
            }
        }
        // Products merging split attention repeat that merge in every workgroup, so where rows
        // are many (outputs of 4,096 and more in workgroups of 16 rows) a workgroup takes twice
        // the rows: on an H200 (`bench`, Llama-3.1-8B Q4_K, two rounds) 512 invocations decoded
        // 356 tok/s against 348 with 256.
        if opts.combine.is_some()
            && forced.workgroup.is_none()
            && wg == WG
            && n / (wg / tpr * rows_per_group) >= 2 * COMBINE_SPLIT_WORKGROUPS
            && gpu.caps().max_workgroup_invocations >= 2 * wg
        {
            wg *= 2;
        }
        if let Some(stage) = forced.stage {
            // Merging split attention always stages its input.
            xcache = (stage || opts.combine.is_some()) && Self::input_fits(gpu, w.cols);
        }
        // Block formats with an integer form take the input as int8, quantized per workgroup
        // (then only merged attention output is staged as f32, for merging), in two levels for
        // LM heads; f32 models keep float inputs (see `MatVecLayout::for_head`, `for_dtype`).
        let fine = forced.int8_fine.unwrap_or(false);
        let int8 = decode_int8_input(w)
            && (!k_quant(w) || tpr <= w.cols / 64)
            && forced.int8.unwrap_or(true)
            && forced.int8_max_cols.is_none_or(|max| w.cols <= max)
            && Self::int8_fits(
                gpu,
                w.cols,
                opts.combine.is_some(),
                if fine { 2 } else { 1 },
            );
        let int8_levels = match (int8, fine) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        };
        if int8 {
            xcache = opts.combine.is_some() && Self::input_fits(gpu, w.cols);
        }
        let handoff_in = opts.handoff_in.filter(|h| {
            handoffs
                && int8_levels == 1
                && opts.combine.is_none()
                && matches!(opts.norm, None | Some((NormKind::Rms, ..)))
                && h.len == w.cols
                // Staging keeps a sum per 16 values besides the int8 row.
                && Self::int8_fits(gpu, w.cols + w.cols / 4, false, 1)
        });
        if let Some((h, _)) = handoff_out
            && h.len != n
        {
            return Err(GpuError::Device(format!(
                "a product of {n} outputs cannot hand off rows of {}",
                h.len
            )));
        }
        let shuffle_reduce = fixed_subgroup.is_some_and(|sg| tpr <= sg);
        // K-quant rows by sub-block pairs (q_dot_pairs) when every lane gets at least one.
        let k_pairs = k_quant(w) && tpr <= w.cols / 64;
        let subgroups = caps.subgroups && caps.subgroup_max_size <= tpr;
        // Row stride in vec4 words (dense) or the row's inputs in vec4s (quantized, for staging).
        let row_vecs = if w.quant.is_some() {
            w.cols / 4
        } else {
            w.row_vecs()
        };
        // The units a row's lanes stride over (vec4 words of dense rows; sub-blocks, or K-quant
        // sub-block pairs, of int8 products): the same count for every lane when the row's
        // units are a multiple of its lanes. On an H200 (`bench`, SmolLM2-1.7B) taking four a
        // trip decoded Q4_K at 688-691 tok/s against 674-678 in the plain loop, Q4_0 733-736
        // against 704-710, Q8_0 659 against 644.
        let units = match w.quant {
            None => row_vecs,
            Some(_) => (w.cols / 32) / if k_pairs { 2 } else { 1 },
        };
        // Int8 rows of sub-blocks that are no multiple of the lanes take the same trips too, the
        // units past the row's end left out (`UNIT_TAIL`), in one trip where a lane has at
        // most eight. On an H200 (Qwen2.5-1.5B's down products, 280 sub-blocks to 64 lanes)
        // that decoded Q4_0 at 687 tok/s against 675-676 in the plain loop, Q8_0 610 against
        // 604-605; K-quant sub-block pairs lost (its other products, 24 pairs to 16 lanes: 577
        // against 604-605) and keep the plain loop.
        let unit_tail = int8 && !k_pairs && !units.is_multiple_of(tpr);
        let lane_units = if unit_tail {
            Some(units.div_ceil(tpr))
        } else {
            (units.is_multiple_of(tpr) && (int8 || w.quant.is_none())).then_some(units / tpr)
        };
        let unroll = match (lane_units, forced.unroll) {
            (None, _) | (_, Some(0)) => 0,
            (Some(n), Some(u)) if u <= n && (n.is_multiple_of(u) || unit_tail) => u,
            // A chosen expert's rows with two-level inputs (MXFP4): one unit a trip. On an H200
            // (`bench`, GPT-OSS-20B, three units a lane; two rounds) that decoded 375.8 / 375.6
            // tok/s against 362.0 / 362.0 with all three in one trip (371.4 with the gate/up
            // product alone so, 373.1 with the down product alone).
            (Some(_), _) if opts.experts.is_some() && fine && int8 => 1,
            (Some(n), _) if unit_tail && n <= 8 => n,
            // Gated K-quant products load a unit for each of their rows and each half (gate,
            // up): more than four pairs in flight a lane cost occupancy more than they hid
            // latency. On an H200 (`bench`, Llama-3.1-8B Q4_K, rows of 4,096: two pairs a lane,
            // two rows a lane group; two rounds) one a trip decoded 356 tok/s against 340 with both.
            (Some(n), _) if opts.glu && k_pairs => {
                default_unroll(n).min((2 / rows_per_group).max(1))
            }
            (Some(n), _) => default_unroll(n),
        };
        // A tail's trips cover every lane's units, rounded up to whole trips.
        let lane_units = lane_units.map(|n| {
            if unit_tail {
                n.next_multiple_of(unroll.max(1))
            } else {
                n
            }
        });
        if opts.combine.is_some() && !xcache {
            return Err(GpuError::Device(format!(
                "merging split attention needs rows of at most {XCACHE_MAX_BYTES} bytes of f32 input; this has {}",
                w.cols
            )));
        }
        let block_rows = wg / tpr * rows_per_group;
        let rb = forced
            .blocks
            .filter(|b| (1..=16).contains(b))
            .unwrap_or_else(|| Self::row_blocks_per_workgroup(all_rows.div_ceil(block_rows)));
        // The writer keeps its rows, their squares and the gains in workgroup memory.
        if !(rb * block_rows).is_multiple_of(16) || rb * block_rows > HANDOFF_MAX_ROWS {
            handoff_out = None;
        }
        // Rows a workgroup quantizes together (see matvec_handoff.wgsl).
        let out_block = if (rb * block_rows).is_multiple_of(32) {
            32
        } else {
            16
        };
        let rows_of_vec4s = w.cols.is_multiple_of(4);
        // x through its vec4 view too, wherever x is read (merged attention replaces it): rows
        // staged in workgroup memory load four inputs at a time as well. On an H200 (`bench`,
        // f16 weights, whose rows of 2048 are staged) SmolLM2-1.7B decoded 603-606 tok/s
        // against 598, Qwen2.5-1.5B 559-560 against 557, Llama-3.2-1B level at 864.
        let x_vec4 = rows_of_vec4s && opts.combine.is_none() && handoff_in.is_none();
        // Loading a trip ahead pays only in the normed products that take no gate (QKV), whose
        // lanes take the row in one trip: their weights arrive while the row and its norm
        // statistics are staged. On an H200
        // (`bench`, 504-token prompt, each product alone with `BACKPACK_MATVEC_OUTPUTS`) the QKV
        // product that way decoded SmolLM2-1.7B Q8_0 at 790-791 tok/s against 773-776, Q4_K
        // 874-875 against 855-856, Llama-3.2-1B Q8_0 1,091 against 1,074-1,077; the gate/up
        // product lost 6 % (729-730), the down product 2 % (760) and the output product,
        // which merges attention first, 1 % (767-769). With it on everywhere, rows of several
        // trips included, SmolLM2-1.7B Q4_K had decoded 709 against 736.
        let pipeline = int8
            && unroll > 0
            && forced.pipeline.unwrap_or(
                opts.norm.is_some()
                    && !opts.glu
                    && !fine
                    && opts.combine.is_none()
                    && lane_units.is_some_and(|n| rb * n <= unroll),
            );
        let trips = lane_units.map_or(0, |n| rb * n / unroll.max(1));
        let routing = opts.experts.and_then(|e| e.route);
        let routes = opts.routes;
        if (routing.is_some() || routes.is_some()) && !caps.subgroups {
            return Err(GpuError::Device(
                "a product routes the token only with subgroups".into(),
            ));
        }
        if routes.is_some()
            && (n.div_ceil(block_rows * rb) != 1
                || opts.experts.is_some()
                || opts.glu
                || opts.combine.is_some())
        {
            return Err(GpuError::Device(format!(
                "a router's product routes the token only as one plain workgroup; {n} rows take {}",
                n.div_ceil(block_rows * rb)
            )));
        }
        let routed_sg = (routing.is_some() || routes.is_some()) && !subgroups;
        if opts.experts.is_some() && k_quant(w) && !int8 {
            return Err(GpuError::Device(
                "K-quant expert rows take int8 inputs, which this layout turns off".into(),
            ));
        }
        let heads = opts.combine.as_ref().map_or(1, |c| c.heads);
        let mut defines = w.defines();
        defines.push(("QDOT", "1".into()));
        defines.extend(gelu_flags(opts.gelu));
        defines.extend([
            ("WG", wg.to_string()),
            ("ROW_VECS", row_vecs.to_string()),
            flag("XCACHE", xcache),
            flag("XVEC4", x_vec4),
            flag(
                "GAIN4",
                rows_of_vec4s && opts.norm.is_some() && handoff_in.is_none(),
            ),
            flag("XQ8_IN", handoff_in.is_some()),
            flag("XQ8_OUT", handoff_out.is_some()),
            flag("OUT_GAIN", handoff_out.is_some_and(|(_, g)| g.is_some())),
            ("OUT_BLOCK", out_block.to_string()),
            flag("COMBINE", opts.combine.is_some()),
            flag(
                "GATED",
                opts.combine.as_ref().is_some_and(|c| c.gate.is_some()),
            ),
            flag(
                "SINKS",
                opts.combine.as_ref().is_some_and(|c| c.sinks.is_some()),
            ),
            (
                "WINDOW",
                opts.combine
                    .as_ref()
                    .and_then(|c| c.window)
                    .unwrap_or(u32::MAX)
                    .to_string(),
            ),
            ("MIN_SPLIT", super::attention::MIN_SPLIT.to_string()),
            ("MAX_SPLITS", super::attention::MAX_SPLITS.to_string()),
            ("TPR", tpr.to_string()),
            ("RB", rb.to_string()),
            ("NR", rows_per_group.to_string()),
            ("UNROLL", unroll.to_string()),
            ("UNITS", units.to_string()),
            ("LANE_UNITS", lane_units.unwrap_or(0).to_string()),
            flag("UNIT_TAIL", unit_tail && unroll > 0),
            flag("SUBGROUP", subgroups),
            flag("SGX", shuffle_reduce),
            flag("NORM", opts.norm.is_some()),
            flag(
                "NORM_LAYER",
                matches!(opts.norm, Some((NormKind::Layer, ..))),
            ),
            flag("BIAS", opts.bias.is_some()),
            flag("GLU", opts.glu),
            flag("RESIDUAL", opts.residual),
            flag("KPAIR", k_pairs),
            flag("XQ8", int8),
            flag("XQ8_FINE", int8_levels == 2),
            ("LEVELS", int8_levels.max(1).to_string()),
            flag("PIPE", pipeline),
            flag("PIPE_NEXT", pipeline && trips > 1),
            flag("XQ8_VIEW", int8 && !k_quant(w)),
            flag(
                "RMS_LATE",
                int8 && matches!(opts.norm, Some((NormKind::Rms, ..))),
            ),
            flag("EXPERTS", opts.experts.is_some()),
            flag(
                "IN_PER_SLOT",
                opts.experts.is_some_and(|e| e.input_per_slot),
            ),
            flag("CLAMPED", opts.experts.is_some_and(|e| e.clamp.is_some())),
            flag("ROUTED", routing.is_some()),
            flag("ROUTES", routes.is_some()),
            flag("ROUTING", routing.is_some() || routes.is_some()),
            flag("ROUTED_SG", routed_sg),
            (
                "TOP_K",
                match (opts.experts, routes) {
                    (Some(e), _) => e.slots,
                    (None, Some(r)) => r.top_k,
                    (None, None) => 1,
                }
                .to_string(),
            ),
            flag(
                "SOFTMAX_ALL",
                routing.is_some_and(|r| r.softmax_all) || routes.is_some_and(|r| r.softmax_all),
            ),
        ]);
        let kernel = if w.quant.is_some() {
            gpu.kernel(
                "matvec_q",
                super::quant_source::QUANT_MATVEC.as_str(),
                "main",
                &defines,
            )?
        } else {
            gpu.kernel("matvec", SOURCE, "main", &defines)?
        };
        let params = gpu.uniform(
            "matvec params",
            &Params {
                n,
                k: w.cols,
                row_vecs,
                glu_offset: n * row_vecs,
                eps: opts.norm.map_or(0.0, |n| n.3),
                heads,
                head_dim: opts.combine.as_ref().map_or(1, |c| c.head_dim),
                q_scales: w.q_scales(),
                expert_stride: opts.experts.map_or(0, |e| e.expert_stride),
                row_step: opts.experts.map_or(1, |e| e.row_step),
                up_offset: opts.experts.map_or(0, |e| e.up_offset),
                experts: match (opts.experts, routes) {
                    (Some(e), _) => e.experts,
                    (None, Some(_)) => n,
                    (None, None) => 1,
                },
                alpha: opts.experts.and_then(|e| e.clamp).map_or(0.0, |c| c.0),
                limit: opts.experts.and_then(|e| e.clamp).map_or(0.0, |c| c.1),
                _pad: [0; 2],
            },
        );
        if opts.combine.is_some() && opts.norm.is_some() {
            return Err(GpuError::Device(
                "a norm cannot be fused into a product that merges split attention".into(),
            ));
        }
        let mut entries = vec![
            (0, &params.buffer),
            // Sub-block pairs read the blocks only through their vec4 view.
            (if k_pairs { 11 } else { 3 }, &w.buffer.buffer),
            (4, &y.buffer),
        ];
        if int8 && !k_pairs {
            // The int8 products load whole blocks through the vec4 view, scales through words.
            entries.push((11, &w.buffer.buffer));
        }
        // Merged attention runs, or a handed-off row, replace x entirely.
        if opts.combine.is_none() && handoff_in.is_none() {
            entries.push((2, &x.buffer));
        }
        if let Some(h) = handoff_in {
            entries.push((14, &h.buffer.buffer));
        }
        if let Some((h, gain)) = handoff_out {
            entries.push((15, &h.buffer.buffer));
            if let Some(g) = gain {
                entries.push((16, &g.buffer));
            }
        }
        if let Some(b) = opts.bias {
            entries.push((5, &b.buffer));
        }
        if x_vec4 {
            entries.push((8, &x.buffer));
        }
        if let Some(e) = &opts.experts {
            entries.push((18, &e.ids.buffer));
        }
        if let Some(r) = routing {
            entries.extend([(20, &r.logits.buffer), (21, &r.weights.buffer)]);
        }
        if let Some(r) = routes {
            entries.extend([(18, &r.ids.buffer), (21, &r.weights.buffer)]);
        }
        // Slots reading rows of their own never read the step's token count.
        if !opts.experts.is_some_and(|e| e.input_per_slot) {
            entries.push((1, &step.buffer));
        }

        if let Some(c) = &opts.combine {
            entries.push((9, &c.partials.buffer));
            entries.push((10, &c.stats.buffer));
            if let Some(gate) = c.gate {
                entries.push((17, &gate.buffer));
            }
            if let Some(sinks) = c.sinks {
                entries.push((19, &sinks.buffer));
            }
        }
        if let Some((kind, weight, bias, _)) = opts.norm.filter(|_| handoff_in.is_none()) {
            entries.push((6, &weight.buffer));
            // The gains' vec4 view: on an H200 (`bench`, 504-token prompt) reading them four at a
            // time decoded SmolLM2-1.7B Q4_K at 789 tok/s against 739, Q4_0 856 against 791,
            // Q8_0 735 against 694; Llama-3.2-1B Q4_K 1,098 against 1,045; Qwen2.5-1.5B Q4_K
            // 636 against 609: every normed product's workgroups stage the whole row.
            if rows_of_vec4s {
                entries.push((13, &weight.buffer));
            }
            if kind == NormKind::Layer {
                let bias = bias.ok_or_else(|| {
                    GpuError::Device("LayerNorm fused into a product needs its bias".into())
                })?;
                entries.push((7, &bias.buffer));
            }
        }
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Self {
            kernel,
            bind_group,
            workgroups: n.div_ceil(block_rows * rb),
            int8,
            int8_levels,
            reads_handoff: handoff_in.is_some(),
            hands_off: handoff_out.is_some(),
            slots: opts.experts.map(|e| e.slots),
            _params: params,
        })
    }

    /// Whether a product of `w` with `layout` may take its input as int8 (its weights have an
    /// integer form and the layout does not turn int8 inputs off), and so read a handed-off row.
    pub fn may_take_int8(w: &Matrix, layout: MatVecLayout) -> bool {
        decode_int8_input(w) && layout.int8 != Some(false)
    }

    /// Whether the input is quantized to int8 for packed integer products.
    pub fn takes_int8(&self) -> bool {
        self.int8
    }

    /// Whether the input is the int8 row another product hands off (`handoff_in`).
    pub fn reads_handoff(&self) -> bool {
        self.reads_handoff
    }

    /// Whether the output is handed off (`handoff_out`): only where each workgroup's rows are
    /// whole blocks of 16 or 32 rows, with at most [`HANDOFF_MAX_WORKGROUP`] invocations.
    pub fn hands_off(&self) -> bool {
        self.hands_off
    }

    /// Workgroups of one dispatch (every expert slot's, for expert products).
    pub fn grid_workgroups(&self) -> u32 {
        self.workgroups * self.slots.unwrap_or(1)
    }

    /// Levels of the int8 input: 0 (float input), 1, or 2 (`int8_fine`).
    pub fn int8_levels(&self) -> u32 {
        self.int8_levels
    }

    /// How many blocks of rows one workgroup computes. Each workgroup stages (and normalises)
    /// the whole input row once, so a workgroup per few rows repeats that work thousands of
    /// times on large matrices; but too few workgroups leave the GPU's cores idle.
    fn row_blocks_per_workgroup(blocks: u32) -> u32 {
        (blocks / MIN_WORKGROUPS).clamp(1, 16)
    }

    /// Whether rows of `cols` inputs are staged in workgroup memory on this device (short rows
    /// are; long rows stream their input alongside the weights instead, since a large staging
    /// prologue delays every weight load: on an H100, k = 8960 ran at 0.7 TB/s staged against
    /// 1.2 TB/s streamed).
    pub fn stages_input(gpu: &Gpu, cols: u32) -> bool {
        u64::from(Matrix::padded_cols(cols)) * 4 <= XCACHE_MAX_BYTES && Self::input_fits(gpu, cols)
    }

    /// Whether the int8 input of `cols` (a byte per value, 8 bytes of scale and sum per 32),
    /// and the f32 input too where it is staged first (merged attention), fit the device's
    /// workgroup memory.
    fn int8_fits(gpu: &Gpu, cols: u32, staged_f32: bool, levels: u64) -> bool {
        let cols = u64::from(Matrix::padded_cols(cols));
        let f32_stage = if staged_f32 { cols * 4 } else { 0 };
        f32_stage + levels * (cols + cols / 4) + u64::from(WG) * 4 + 64 + 8 * 1024
            <= u64::from(gpu.caps().max_workgroup_storage)
    }

    /// Whether the staged input of `cols` fits the device's workgroup memory.
    fn input_fits(gpu: &Gpu, cols: u32) -> bool {
        let x_bytes = u64::from(Matrix::padded_cols(cols)) * 4;
        // The input, the reduction array of the largest workgroup, the norm statistics.
        x_bytes + u64::from(WG) * 4 + 64 + 8 * 1024 <= u64::from(gpu.caps().max_workgroup_storage)
    }

    pub fn encode(&self, rec: &mut Recorder<'_>) {
        match self.slots {
            Some(slots) => {
                rec.dispatch_xyz(&self.kernel, &self.bind_group, [self.workgroups, slots, 1])
            }
            None => rec.dispatch(&self.kernel, &self.bind_group, self.workgroups),
        }
    }
}

/// An input row as the int8 products see it, for CPU references: 32-value blocks, each scaled
/// by max |x| / 127 and rounded to even, as `stage_int8` in shaders/matvec.wgsl does.
pub fn int8_rounded_input(x: &[f32]) -> Vec<f32> {
    x.chunks(32)
        .flat_map(|block| {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            block
                .iter()
                .map(move |v| (v * inv).round_ties_even() * (amax / 127.0))
        })
        .collect()
}

/// Units a trip for `n` units a lane: four where they divide, else all of up to four, else
/// two or one.
fn default_unroll(n: u32) -> u32 {
    if n.is_multiple_of(4) {
        4
    } else if n <= 4 {
        n
    } else if n.is_multiple_of(2) {
        2
    } else {
        1
    }
}

/// The largest power of two at most `n` (1 for 0).
fn prev_power_of_two(n: u32) -> u32 {
    if n == 0 {
        1
    } else {
        1 << (31 - n.leading_zeros())
    }
}

/// Q4_K / Q5_K weights, decoded by sub-block pairs through a vec4 view (q_dot_pairs).
pub(super) fn k_quant(w: &Matrix) -> bool {
    matches!(w.quant, Some((GgmlType::Q4K | GgmlType::Q5K, _)))
}

/// Block formats the decode product takes with int8 inputs: those of [`int8_input`] and
/// MXFP4, whose codes become int8 values in registers (e2m1_i8 in quant.wgsl).
fn decode_int8_input(w: &Matrix) -> bool {
    int8_input(w) || matches!(w.quant, Some((GgmlType::Mxfp4, _)))
}

/// Block formats whose decode product can run on int8 inputs (q_dot8 in quant.wgsl; K-quant
/// rows only in sub-block pairs, which need a lane group per row of at most k / 64).
pub(super) fn int8_input(w: &Matrix) -> bool {
    matches!(
        w.quant,
        Some((
            GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q4K
                | GgmlType::Q5K
                | GgmlType::Q6K,
            _
        ))
    )
}
