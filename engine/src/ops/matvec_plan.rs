//! How one decode product is laid out ([`Plan`]): lanes and rows per workgroup, the input's
//! form (f32, staged or not; int8 in one or two levels; a handed-off row), the trips over each
//! row's units, and the shader defines that follow. [`super::MatVec::new`] makes one, then
//! builds the kernel and its bindings from it.

#[path = "matvec_defines.rs"]
mod defines;

use super::matvec::{HANDOFF_MAX_WORKGROUP, Int8Handoff, MatVecOptions, k_quant};
use super::{Gelu, MatVecLayout, Matrix, NormKind};
use crate::gpu::{GpuCaps, GpuError, StorageBuffer};
use crate::load::GgmlType;

pub(super) const WG: u32 = 256;
pub(super) const XCACHE_MAX_BYTES: u64 = 16 * 1024;
/// Workgroups a product keeps at least, before rows are grouped into fewer workgroups. On an
/// H200 (Qwen2.5-1.5B shapes) 512 beat one block per workgroup by 6-8% and 256 or 128 (fewer
/// workgroups in flight) by 10-50%.
const MIN_WORKGROUPS: u32 = 512;
/// Workgroups enough for a few lanes per quantized row where rows are short (under 4096
/// values): on an H200 the attention products of 1-1.7B models (96-384 workgroups that way)
/// decoded Llama-3.2-1B Q4_0 at 1,074 tok/s against 930 with 64 lanes per row, Q8_0 935
/// against 840, SmolLM2-1.7B Q4_0 775 against 736, Qwen2.5-1.5B Q4_0 660 against 630.
/// SmolLM2-135M's products (9-24 workgroups) keep 64 lanes (see `default_lanes`).
const SHORT_ROW_MIN_WORKGROUPS: u32 = 96;
/// Workgroups a product merging split attention keeps at least when it takes more rows a
/// workgroup (see `Plan::fit_workgroup`).
const COMBINE_SPLIT_WORKGROUPS: u32 = 128;
/// The workgroup of a product merging split attention with sinks (see `Plan::fit_workgroup`).
const SINKS_MERGE_WG: u32 = 1024;
/// The most rows a workgroup handing its output off takes (12 bytes of workgroup memory each).
const HANDOFF_MAX_ROWS: u32 = 1024;

/// A decode product's layout (the names follow the shader's defines, see shaders/matvec.wgsl).
pub(super) struct Plan<'a> {
    /// Outputs: a gated product's gate rows, an expert slot's rows.
    pub n: u32,
    /// The rows the whole dispatch computes (every slot's), which workgroup counts go by.
    all_rows: u32,
    fixed_subgroup: Option<u32>,
    forced: MatVecLayout,
    pub wg: u32,
    pub tpr: u32,
    pub rows_per_group: u32,
    pub xcache: bool,
    handoffs: bool,
    pub handoff_out: Option<(&'a Int8Handoff, Option<&'a StorageBuffer>)>,
    pub handoff_in: Option<&'a Int8Handoff>,
    pub hand_input: Option<&'a Int8Handoff>,
    fine: bool,
    pub int8: bool,
    pub int8_levels: u32,
    pub shuffle_reduce: bool,
    pub k_pairs: bool,
    pub subgroups: bool,
    pub row_vecs: u32,
    pub units: u32,
    pub unit_tail: bool,
    pub lane_units: Option<u32>,
    pub unroll: u32,
    pub block_rows: u32,
    pub rb: u32,
    pub out_block: u32,
    pub rows_of_vec4s: bool,
    pub x_vec4: bool,
    pub pipeline: bool,
    pub trips: u32,
    pub routed_sg: bool,
}

impl<'a> Plan<'a> {
    /// The layout of `w` with `opts` on an adapter with `caps` (`software`: a CPU one): chosen
    /// from the shape and the device, with what `opts.layout` and the environment
    /// (`BACKPACK_MATVEC`) force.
    pub(super) fn new(
        caps: &GpuCaps,
        software: bool,
        w: &Matrix,
        opts: &MatVecOptions<'a>,
    ) -> Result<Self, GpuError> {
        let (n, all_rows) = rows_of(w, opts)?;
        let fixed_subgroup = fixed_subgroup(caps);
        let (tpr, rows_per_group, xcache) = default_lanes(caps, w, all_rows, fixed_subgroup);
        // The environment's layout (for measuring) wins over the caller's, and that over a
        // CPU adapter's.
        let forced = MatVecLayout::from_env(w.cols, n, opts.glu)
            .or(opts.layout)
            .or(MatVecLayout::software(software, w.quant.is_some()));
        let mut plan = Self {
            n,
            all_rows,
            fixed_subgroup,
            forced,
            wg: WG,
            tpr,
            rows_per_group,
            xcache,
            handoffs: forced.handoff != Some(false),
            handoff_out: None,
            handoff_in: None,
            hand_input: None,
            fine: forced.int8_fine.unwrap_or(false),
            int8: false,
            int8_levels: 0,
            shuffle_reduce: false,
            k_pairs: false,
            subgroups: false,
            row_vecs: 0,
            units: 0,
            unit_tail: false,
            lane_units: None,
            unroll: 0,
            block_rows: 0,
            rb: 1,
            out_block: 16,
            rows_of_vec4s: w.cols.is_multiple_of(4),
            x_vec4: false,
            pipeline: false,
            trips: 0,
            routed_sg: false,
        };
        plan.fit_workgroup(caps, w, opts);
        plan.choose_input(caps, w, opts)?;
        plan.choose_units(caps, w, opts)?;
        plan.choose_blocks(caps, w, opts)?;
        Ok(plan)
    }

    /// The forced workgroup, lanes and rows, and the workgroups grown for handing the output
    /// off or for merging split attention.
    fn fit_workgroup(&mut self, caps: &GpuCaps, w: &Matrix, opts: &MatVecOptions<'a>) {
        let (forced, n) = (self.forced, self.n);
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
            self.tpr = lanes;
        }
        let tpr = self.tpr.min(wg);
        self.tpr = tpr;
        if let Some(rows) = forced.rows.filter(|r| (1..=4).contains(r)) {
            self.rows_per_group = rows;
        }
        let rows_per_group = self.rows_per_group;
        self.handoff_out = opts.handoff_out.filter(|_| self.handoffs);
        // A product handing its output off quantizes whole blocks of 16 or 32 rows in each
        // workgroup, so its workgroups take more invocations (the same rows each) where a
        // block spans several, up to HANDOFF_MAX_WORKGROUP. Expert products keep theirs and
        // hand off where their row blocks make whole blocks (see `choose_blocks`).
        if self.handoff_out.is_some() && forced.workgroup.is_none() && opts.experts.is_none() {
            let largest = caps.max_workgroup_invocations.min(HANDOFF_MAX_WORKGROUP);
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
            && caps.max_workgroup_invocations >= 2 * wg
        {
            wg *= 2;
        }
        // With sinks (GPT-OSS's output products: 2,880 rows over 64 heads of 64), workgroups
        // of 1,024: every workgroup merges the whole row's runs before its first weight load,
        // and fewer workgroups merge it fewer times. On an H200 (`bench`, GPT-OSS-20B, two
        // rounds) 1,024 invocations decoded 401.8 / 401.2 tok/s, 512 399.3 / 399.7, 256
        // 393.8 / 393.6.
        if opts.combine.as_ref().is_some_and(|c| c.sinks.is_some())
            && forced.workgroup.is_none()
            && caps.max_workgroup_invocations >= SINKS_MERGE_WG
            && caps.max_workgroup_size_x >= SINKS_MERGE_WG
        {
            wg = SINKS_MERGE_WG;
        }
        self.wg = wg;
        if let Some(stage) = forced.stage {
            // Merging split attention always stages its input.
            self.xcache = (stage || opts.combine.is_some()) && input_fits(caps, w.cols);
        }
    }

    /// The input's form: f32, or int8 in one or two levels, or the row the product before
    /// handed off.
    fn choose_input(
        &mut self,
        caps: &GpuCaps,
        w: &Matrix,
        opts: &MatVecOptions<'a>,
    ) -> Result<(), GpuError> {
        let (forced, fine, n) = (self.forced, self.fine, self.n);
        // Block formats with an integer form take the input as int8, quantized per workgroup
        // (then only merged attention output is staged as f32, for merging), in two levels for
        // LM heads; f32 models keep float inputs (see `MatVecLayout::for_head`, `for_dtype`).
        let int8 = decode_int8_input(w)
            && (!k_quant(w) || self.tpr <= w.cols / 64)
            && forced.int8.unwrap_or(true)
            && forced.int8_max_cols.is_none_or(|max| w.cols <= max)
            && int8_fits(
                caps,
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
            self.xcache = opts.combine.is_some() && input_fits(caps, w.cols);
        }
        // Slots reading rows of their own read a handed-off row each.
        let rows_read = opts
            .experts
            .filter(|e| e.input_per_slot)
            .map_or(1, |e| e.slots);
        self.handoff_in = opts.handoff_in.filter(|h| {
            self.handoffs
                && int8_levels == h.levels
                && h.rows >= rows_read
                && opts.combine.is_none()
                && matches!(opts.norm, None | Some((NormKind::Rms, ..)))
                && h.len == w.cols
                // Staging keeps a sum per 16 values besides the int8 row.
                && int8_fits(caps, w.cols + w.cols / 4, false, u64::from(int8_levels))
        });
        let rows_written = opts.experts.map_or(1, |e| e.slots);
        if let Some((h, _)) = self.handoff_out
            && (h.len != n || h.rows < rows_written)
        {
            return Err(GpuError::Device(format!(
                "a product of {rows_written} × {n} outputs cannot hand off {} rows of {}",
                h.rows, h.len
            )));
        }
        // The input is handed off from the float row the product reads (its first workgroup
        // staging it), whatever the environment forces: the product after relies on it.
        if let Some(h) = opts.handoff_input {
            if int8 || opts.combine.is_some() || opts.experts.is_some() || h.len != w.cols {
                return Err(GpuError::Device(format!(
                    "a product of rows of {} cannot hand off its input as rows of {}: it must take a float input of that length",
                    w.cols, h.len
                )));
            }
            self.hand_input = Some(h);
        }
        self.int8 = int8;
        self.int8_levels = int8_levels;
        Ok(())
    }

    /// The units each row's lanes stride over and how many a trip of the loop takes.
    fn choose_units(
        &mut self,
        caps: &GpuCaps,
        w: &Matrix,
        opts: &MatVecOptions<'a>,
    ) -> Result<(), GpuError> {
        let (tpr, int8) = (self.tpr, self.int8);
        self.shuffle_reduce = self.fixed_subgroup.is_some_and(|sg| tpr <= sg);
        // K-quant rows by sub-block pairs (q_dot_pairs) when every lane gets at least one.
        let k_pairs = k_quant(w) && tpr <= w.cols / 64;
        self.k_pairs = k_pairs;
        self.subgroups = caps.subgroups && caps.subgroup_max_size <= tpr;
        // Row stride in vec4 words (dense) or the row's inputs in vec4s (quantized, for staging).
        self.row_vecs = if w.quant.is_some() {
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
            None => self.row_vecs,
            Some(_) => (w.cols / 32) / if k_pairs { 2 } else { 1 },
        };
        self.units = units;
        // Int8 rows of sub-blocks that are no multiple of the lanes take the same trips too, the
        // units past the row's end left out (`UNIT_TAIL`), in one trip where a lane has at
        // most eight. On an H200 (Qwen2.5-1.5B's down products, 280 sub-blocks to 64 lanes)
        // that decoded Q4_0 at 687 tok/s against 675-676 in the plain loop, Q8_0 610 against
        // 604-605; K-quant sub-block pairs lost (its other products, 24 pairs to 16 lanes: 577
        // against 604-605) and keep the plain loop.
        let unit_tail = int8 && !k_pairs && !units.is_multiple_of(tpr);
        self.unit_tail = unit_tail;
        let lane_units = if unit_tail {
            Some(units.div_ceil(tpr))
        } else {
            (units.is_multiple_of(tpr) && (int8 || w.quant.is_none())).then_some(units / tpr)
        };
        let unroll = self.unroll_of(lane_units, opts);
        self.unroll = unroll;
        // A tail's trips cover every lane's units, rounded up to whole trips.
        self.lane_units = lane_units.map(|n| {
            if unit_tail {
                n.next_multiple_of(unroll.max(1))
            } else {
                n
            }
        });
        if opts.combine.is_some() && !self.xcache {
            return Err(GpuError::Device(format!(
                "merging split attention needs rows of at most {XCACHE_MAX_BYTES} bytes of f32 input; this has {}",
                w.cols
            )));
        }
        Ok(())
    }

    /// Units a trip for `lane_units` units a lane (0: the plain strided loop).
    fn unroll_of(&self, lane_units: Option<u32>, opts: &MatVecOptions<'a>) -> u32 {
        let (unit_tail, k_pairs) = (self.unit_tail, self.k_pairs);
        match (lane_units, self.forced.unroll) {
            (None, _) | (_, Some(0)) => 0,
            (Some(n), Some(u)) if u <= n && (n.is_multiple_of(u) || unit_tail) => u,
            // A chosen expert's rows with two-level inputs (MXFP4): one unit a trip. On an H200
            // (`bench`, GPT-OSS-20B, three units a lane; two rounds) that decoded 375.8 / 375.6
            // tok/s against 362.0 / 362.0 with all three in one trip (371.4 with the gate/up
            // product alone so, 373.1 with the down product alone).
            (Some(_), _) if opts.experts.is_some() && self.fine && self.int8 => 1,
            (Some(n), _) if unit_tail && n <= 8 => n,
            // Gated K-quant products load a unit for each of their rows and each half (gate,
            // up): more than four pairs in flight a lane cost occupancy more than they hid
            // latency. On an H200 (`bench`, Llama-3.1-8B Q4_K, rows of 4,096: two pairs a lane,
            // two rows a lane group; two rounds) one a trip decoded 356 tok/s against 340 with both.
            (Some(n), _) if opts.glu && k_pairs => {
                default_unroll(n).min((2 / self.rows_per_group).max(1))
            }
            (Some(n), _) => default_unroll(n),
        }
    }

    /// Row blocks a workgroup, the handoff's blocks, loading a trip ahead, and the routing
    /// forms' checks.
    fn choose_blocks(
        &mut self,
        caps: &GpuCaps,
        w: &Matrix,
        opts: &MatVecOptions<'a>,
    ) -> Result<(), GpuError> {
        let (n, int8, unroll) = (self.n, self.int8, self.unroll);
        let block_rows = self.wg / self.tpr * self.rows_per_group;
        self.block_rows = block_rows;
        let rb = self
            .forced
            .blocks
            .filter(|b| (1..=16).contains(b))
            .unwrap_or_else(|| row_blocks_per_workgroup(self.all_rows.div_ceil(block_rows)));
        // An expert gate/up product handing two-level rows off takes whole 32-row blocks a
        // workgroup, so that the down product stages them as they are, without rounding each
        // half of a block again from both levels. On an H200 (`bench`, GPT-OSS-20B, two
        // rounds) four row blocks of 8 decoded 397.8 / 397.6 tok/s against 386.3 / 385.8 with
        // the two of the product that reads its input itself.
        let rb = if opts.experts.is_some()
            && self.forced.blocks.is_none()
            && self.handoff_out.is_some_and(|(h, _)| h.levels == 2)
        {
            let mut whole = rb;
            while !(whole * block_rows).is_multiple_of(32) && whole * 2 <= 16 {
                whole *= 2;
            }
            whole
        } else {
            rb
        };
        self.rb = rb;
        // The writer keeps its rows, their squares and the gains in workgroup memory.
        if !(rb * block_rows).is_multiple_of(16) || rb * block_rows > HANDOFF_MAX_ROWS {
            self.handoff_out = None;
        }
        // Rows a workgroup quantizes together (see matvec_handoff.wgsl).
        self.out_block = if (rb * block_rows).is_multiple_of(32) {
            32
        } else {
            16
        };
        // x through its vec4 view too, wherever x is read (merged attention replaces it): rows
        // staged in workgroup memory load four inputs at a time as well. On an H200 (`bench`,
        // f16 weights, whose rows of 2048 are staged) SmolLM2-1.7B decoded 603-606 tok/s
        // against 598, Qwen2.5-1.5B 559-560 against 557, Llama-3.2-1B level at 864.
        self.x_vec4 = self.rows_of_vec4s && opts.combine.is_none() && self.handoff_in.is_none();
        // Loading a trip ahead pays only in the normed products that take no gate (QKV), whose
        // lanes take the row in one trip: their weights arrive while the row and its norm
        // statistics are staged. On an H200
        // (`bench`, 504-token prompt, each product alone with `BACKPACK_MATVEC_OUTPUTS`) the QKV
        // product that way decoded SmolLM2-1.7B Q8_0 at 790-791 tok/s against 773-776, Q4_K
        // 874-875 against 855-856, Llama-3.2-1B Q8_0 1,091 against 1,074-1,077; the gate/up
        // product lost 6 % (729-730), the down product 2 % (760) and the output product,
        // which merges attention first, 1 % (767-769). With it on everywhere, rows of several
        // trips included, SmolLM2-1.7B Q4_K had decoded 709 against 736.
        self.pipeline = int8
            && unroll > 0
            && self.forced.pipeline.unwrap_or(
                opts.norm.is_some()
                    && !opts.glu
                    && !self.fine
                    && opts.combine.is_none()
                    && self.lane_units.is_some_and(|n| rb * n <= unroll),
            );
        self.trips = self.lane_units.map_or(0, |n| rb * n / unroll.max(1));
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
        self.routed_sg = (routing.is_some() || routes.is_some()) && !self.subgroups;
        if opts.experts.is_some() && k_quant(w) && !int8 {
            return Err(GpuError::Device(
                "K-quant expert rows take int8 inputs, which this layout turns off".into(),
            ));
        }
        Ok(())
    }

    /// Workgroups of one dispatch (one expert slot's, for expert products).
    pub(super) fn workgroups(&self) -> u32 {
        self.n.div_ceil(self.block_rows * self.rb)
    }
}

/// Output rows per slot and in the whole dispatch, and the options' consistency.
fn rows_of(w: &Matrix, opts: &MatVecOptions<'_>) -> Result<(u32, u32), GpuError> {
    let n = match (&opts.experts, opts.glu) {
        (Some(e), _) => e.rows,
        (None, true) => w.rows / 2,
        (None, false) => w.rows,
    };
    let all_rows = n * opts.experts.as_ref().map_or(1, |e| e.slots);
    if opts.experts.is_some() && (w.quant.is_none() || opts.residual || opts.combine.is_some()) {
        return Err(GpuError::Device(
            "expert decode products take block-format weights and a plain or handed-off input"
                .into(),
        ));
    }
    if opts.glu && opts.gelu.is_some_and(|g| g != Gelu::Tanh) {
        return Err(GpuError::Device(
            "a gated product takes SiLU or tanh GELU only".into(),
        ));
    }
    if opts.combine.is_some() && opts.norm.is_some() {
        return Err(GpuError::Device(
            "a norm cannot be fused into a product that merges split attention".into(),
        ));
    }
    Ok((n, all_rows))
}

/// A fixed subgroup size, which lets a row's lanes reduce with shuffles inside one subgroup.
fn fixed_subgroup(caps: &GpuCaps) -> Option<u32> {
    (caps.subgroups
        && caps.subgroup_min_size == caps.subgroup_max_size
        && caps.subgroup_min_size.is_power_of_two()
        && caps.subgroup_min_size >= 4)
        .then_some(caps.subgroup_min_size)
}

/// Lanes per row, rows per lane group, and whether the input is staged, as the shape and the
/// device choose them (before anything forced).
fn default_lanes(
    caps: &GpuCaps,
    w: &Matrix,
    all_rows: u32,
    fixed_subgroup: Option<u32>,
) -> (u32, u32, bool) {
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
    let mut xcache = stages_input(caps, w.cols);
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
        xcache = input_fits(caps, w.cols);
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
    (tpr, rows_per_group, xcache)
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
pub(super) fn stages_input(caps: &GpuCaps, cols: u32) -> bool {
    u64::from(Matrix::padded_cols(cols)) * 4 <= XCACHE_MAX_BYTES && input_fits(caps, cols)
}

/// Whether the int8 input of `cols` (a byte per value, 8 bytes of scale and sum per 32),
/// and the f32 input too where it is staged first (merged attention), fit the device's
/// workgroup memory.
fn int8_fits(caps: &GpuCaps, cols: u32, staged_f32: bool, levels: u64) -> bool {
    let cols = u64::from(Matrix::padded_cols(cols));
    let f32_stage = if staged_f32 { cols * 4 } else { 0 };
    f32_stage + levels * (cols + cols / 4) + u64::from(WG) * 4 + 64 + 8 * 1024
        <= u64::from(caps.max_workgroup_storage)
}

/// Whether the staged input of `cols` fits the device's workgroup memory.
fn input_fits(caps: &GpuCaps, cols: u32) -> bool {
    let x_bytes = u64::from(Matrix::padded_cols(cols)) * 4;
    // The input, the reduction array of the largest workgroup, the norm statistics.
    x_bytes + u64::from(WG) * 4 + 64 + 8 * 1024 <= u64::from(caps.max_workgroup_storage)
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

/// Block formats the decode product takes with int8 inputs: those of
/// [`super::matvec::int8_input`] and MXFP4, whose codes become int8 values in registers
/// (e2m1_i8 in quant.wgsl).
pub(super) fn decode_int8_input(w: &Matrix) -> bool {
    super::matvec::int8_input(w) || matches!(w.quant, Some((GgmlType::Mxfp4, _)))
}
