use bytemuck::{Pod, Zeroable};

use super::matvec_plan::{self, Plan, decode_int8_input};
use super::{Gelu, MatVecLayout, Matrix, NormKind, bind};
use crate::gpu::{Gpu, GpuCaps, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};
use crate::load::GgmlType;

pub(super) const SOURCE: &str = concat!(
    include_str!("../../../shaders/matvec.wgsl"),
    include_str!("../../../shaders/matvec_handoff.wgsl"),
    include_str!("../../../shaders/route.wgsl")
);
/// The most invocations a product handing its output off may take per workgroup to make its
/// rows whole blocks. On an H200 a down product of K-quant rows grown to 1,024 (8 rows per 256
/// invocations) lost what the QKV product reading its output gained.
pub const HANDOFF_MAX_WORKGROUP: u32 = 512;
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
    pub(super) buffer: StorageBuffer,
    pub(super) len: u32,
    /// Rows: one, or an expert slot's each.
    pub(super) rows: u32,
    /// Int8 levels: 1, or 2 for readers with two-level inputs (`int8_fine`).
    pub(super) levels: u32,
}

impl Int8Handoff {
    /// A handoff of one row of `len` values, a multiple of 32 (whole int8 blocks), in one level.
    pub fn new(gpu: &Gpu, len: u32) -> Result<Self, GpuError> {
        Self::with_rows(gpu, len, 1, 1)
    }

    /// A handoff of `rows` rows (expert slots' inputs) of `len` values in `levels` int8 levels.
    pub fn with_rows(gpu: &Gpu, len: u32, rows: u32, levels: u32) -> Result<Self, GpuError> {
        if len == 0 || !len.is_multiple_of(32) || rows == 0 || !(1..=2).contains(&levels) {
            return Err(GpuError::Device(format!(
                "an int8 handoff takes whole 32-value blocks in one or two levels; {rows} rows of {len} in {levels} are not"
            )));
        }
        // Per level the int8 words, then two words of statistics per 16 values (see the shader).
        let words = u64::from(rows) * u64::from(levels) * u64::from(len / 4 + len / 8);
        Ok(Self {
            buffer: gpu.storage("int8 handoff", words * 4)?,
            len,
            rows,
            levels,
        })
    }

    /// Int8 levels of the handed-off rows.
    pub fn levels(&self) -> u32 {
        self.levels
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
    /// int8 inputs in as many levels (the caller makes sure that product writes it); expert
    /// slots reading rows of their own read a row each.
    pub handoff_in: Option<&'a Int8Handoff>,
    /// Hand the input off as this product reads it (normalised, where it fuses a norm), from
    /// its first workgroup: products taking float inputs only.
    pub handoff_input: Option<&'a Int8Handoff>,
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
        let plan = Plan::new(gpu.caps(), gpu.is_software(), w, &opts)?;
        let defines = plan.defines(w, &opts);
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
                n: plan.n,
                k: w.cols,
                row_vecs: plan.row_vecs,
                glu_offset: plan.n * plan.row_vecs,
                eps: opts.norm.map_or(0.0, |n| n.3),
                heads: opts.combine.as_ref().map_or(1, |c| c.heads),
                head_dim: opts.combine.as_ref().map_or(1, |c| c.head_dim),
                q_scales: w.q_scales(),
                expert_stride: opts.experts.map_or(0, |e| e.expert_stride),
                row_step: opts.experts.map_or(1, |e| e.row_step),
                up_offset: opts.experts.map_or(0, |e| e.up_offset),
                experts: match (opts.experts, opts.routes) {
                    (Some(e), _) => e.experts,
                    (None, Some(_)) => plan.n,
                    (None, None) => 1,
                },
                alpha: opts.experts.and_then(|e| e.clamp).map_or(0.0, |c| c.0),
                limit: opts.experts.and_then(|e| e.clamp).map_or(0.0, |c| c.1),
                _pad: [0; 2],
            },
        );
        let entries = bindings(&plan, (w, x, y, step, &params.buffer), &opts)?;
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Self {
            kernel,
            bind_group,
            workgroups: plan.workgroups(),
            int8: plan.int8,
            int8_levels: plan.int8_levels,
            reads_handoff: plan.handoff_in.is_some(),
            hands_off: plan.handoff_out.is_some() || plan.hand_input.is_some(),
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
    /// whole blocks of 16 or 32 rows, with at most [`HANDOFF_MAX_WORKGROUP`] invocations; or
    /// the input (`handoff_input`).
    pub fn hands_off(&self) -> bool {
        self.hands_off
    }

    /// Whether a product of `w` with `opts` would read the handoff it is offered
    /// (`handoff_in`), without building it.
    pub fn would_read_handoff(gpu: &Gpu, w: &Matrix, opts: &MatVecOptions<'_>) -> bool {
        Plan::new(gpu.caps(), gpu.is_software(), w, opts).is_ok_and(|p| p.handoff_in.is_some())
    }

    /// Workgroups of one dispatch (every expert slot's, for expert products).
    pub fn grid_workgroups(&self) -> u32 {
        self.workgroups * self.slots.unwrap_or(1)
    }

    /// Levels of the int8 input: 0 (float input), 1, or 2 (`int8_fine`).
    pub fn int8_levels(&self) -> u32 {
        self.int8_levels
    }

    /// Whether rows of `cols` inputs are staged in workgroup memory on this device (see
    /// [`matvec_plan::stages_input`]).
    pub fn stages_input(gpu: &Gpu, cols: u32) -> bool {
        matvec_plan::stages_input(gpu.caps(), cols)
    }

    /// The shader defines (sorted, as kernel labels show them) of the product of `w` with
    /// `opts` on a GPU adapter with `caps`, without building it: the layouts chosen for
    /// adapters the tests do not run on can be pinned to those the measurements used.
    pub fn layout_defines(
        caps: &GpuCaps,
        w: &Matrix,
        opts: &MatVecOptions<'_>,
    ) -> Result<Vec<(&'static str, String)>, GpuError> {
        let mut defines = Plan::new(caps, false, w, opts)?.defines(w, opts);
        defines.sort();
        Ok(defines)
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

/// The kernel's bindings for `plan`: the matrix, input, output, step and parameters, then
/// what the options add.
fn bindings<'b>(
    plan: &Plan<'b>,
    (w, x, y, step, params): (
        &'b Matrix,
        &'b StorageBuffer,
        &'b StorageBuffer,
        &'b UniformBuffer,
        &'b wgpu::Buffer,
    ),
    opts: &MatVecOptions<'b>,
) -> Result<Vec<(u32, &'b wgpu::Buffer)>, GpuError> {
    let mut entries = vec![
        (0, params),
        // Sub-block pairs read the blocks only through their vec4 view.
        (if plan.k_pairs { 11 } else { 3 }, &w.buffer.buffer),
        (4, &y.buffer),
    ];
    if plan.int8 && !plan.k_pairs {
        // The int8 products load whole blocks through the vec4 view, scales through words.
        entries.push((11, &w.buffer.buffer));
    }
    // Merged attention runs, or a handed-off row, replace x entirely.
    if opts.combine.is_none() && plan.handoff_in.is_none() {
        entries.push((2, &x.buffer));
    }
    if let Some(h) = plan.handoff_in {
        entries.push((14, &h.buffer.buffer));
    }
    if let Some((h, gain)) = plan.handoff_out {
        entries.push((15, &h.buffer.buffer));
        if let Some(g) = gain {
            entries.push((16, &g.buffer));
        }
    }
    if let Some(h) = plan.hand_input {
        entries.push((15, &h.buffer.buffer));
    }
    if let Some(b) = opts.bias {
        entries.push((5, &b.buffer));
    }
    if plan.x_vec4 {
        entries.push((8, &x.buffer));
    }
    if let Some(e) = &opts.experts {
        entries.push((18, &e.ids.buffer));
    }
    if let Some(r) = opts.experts.and_then(|e| e.route) {
        entries.extend([(20, &r.logits.buffer), (21, &r.weights.buffer)]);
    }
    if let Some(r) = opts.routes {
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
    if let Some((kind, weight, bias, _)) = opts.norm.filter(|_| plan.handoff_in.is_none()) {
        entries.push((6, &weight.buffer));
        // The gains' vec4 view: on an H200 (`bench`, 504-token prompt) reading them four at a
        // time decoded SmolLM2-1.7B Q4_K at 789 tok/s against 739, Q4_0 856 against 791,
        // Q8_0 735 against 694; Llama-3.2-1B Q4_K 1,098 against 1,045; Qwen2.5-1.5B Q4_K
        // 636 against 609: every normed product's workgroups stage the whole row.
        if plan.rows_of_vec4s {
            entries.push((13, &weight.buffer));
        }
        if kind == NormKind::Layer {
            let bias = bias.ok_or_else(|| {
                GpuError::Device("LayerNorm fused into a product needs its bias".into())
            })?;
            entries.push((7, &bias.buffer));
        }
    }
    Ok(entries)
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

/// Q4_K / Q5_K weights, decoded by sub-block pairs through a vec4 view (q_dot_pairs).
pub(super) fn k_quant(w: &Matrix) -> bool {
    matches!(w.quant, Some((GgmlType::Q4K | GgmlType::Q5K, _)))
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
