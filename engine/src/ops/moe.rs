//! Routed experts (shaders/moe.wgsl): routing the step's tokens to their top-k experts,
//! grouping them by expert, the experts' gate/up and down products over their own tokens, and
//! the weighted sum back into the residual stream. Expert ids stay on the GPU.

use bytemuck::{Pod, Zeroable};

use super::{Matrix, bind, flag, groups_of_64};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};
use crate::load::{ExpertActivation, MoeSpec, RouterWeights};

const SOURCE: &str = include_str!("../../../shaders/moe.wgsl");
/// Invocations of the expert product's workgroups (`WG` in the shader).
const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct Params {
    experts: u32,
    rows: u32,
    cols: u32,
    expert_stride: u32,
    row_step: u32,
    up_offset: u32,
    q_scales: u32,
    max_assignments: u32,
    alpha: f32,
    limit: f32,
    _pad0: u32,
    _pad1: u32,
}

/// Where a gate/up matrix keeps expert e's gate row r and the up row beside it: gate row
/// `e·expert_stride + r·row_step`, its up row `up_offset` rows further.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateUpRows {
    pub expert_stride: u32,
    pub row_step: u32,
    pub up_offset: u32,
}

impl GateUpRows {
    /// Each expert's gate rows then its up rows (transformers' fused `gate_up_proj`, per-expert
    /// tensors stacked in that order).
    pub fn per_expert(intermediate: u32) -> Self {
        Self {
            expert_stride: 2 * intermediate,
            row_step: 1,
            up_offset: intermediate,
        }
    }

    /// Every expert's gate rows, then every expert's up rows (GGUF's `ffn_gate_exps` and
    /// `ffn_up_exps`).
    pub fn gates_then_ups(experts: u32, intermediate: u32) -> Self {
        Self {
            expert_stride: intermediate,
            row_step: 1,
            up_offset: experts * intermediate,
        }
    }

    /// Gate and up rows alternating within each expert (GPT-OSS's published `gate_up_proj`).
    pub fn interleaved(intermediate: u32) -> Self {
        Self {
            expert_stride: 2 * intermediate,
            row_step: 2,
            up_offset: 1,
        }
    }
}

/// The routing state of one step: buffers sized for `tokens` tokens, shared by every sparse
/// layer (they run one after another).
pub struct MoeBuffers {
    pub tokens: u32,
    /// Router logits `[tokens][experts]`.
    pub logits: StorageBuffer,
    ids: StorageBuffer,
    weights: StorageBuffer,
    order: StorageBuffer,
    offsets: StorageBuffer,
    live: StorageBuffer,
    /// Expert hidden rows `[assignments][intermediate]`.
    hidden: StorageBuffer,
    /// Expert outputs `[assignments][hidden width]`.
    outputs: StorageBuffer,
}

impl MoeBuffers {
    pub fn new(gpu: &Gpu, moe: &MoeSpec, hidden: u32, tokens: u32) -> Result<Self, GpuError> {
        let words = |n: u64| n * 4;
        let assignments = u64::from(tokens) * u64::from(moe.top_k);
        let experts = u64::from(moe.experts);
        Ok(Self {
            tokens,
            logits: gpu.storage("router logits", words(u64::from(tokens) * experts))?,
            ids: gpu.storage("expert ids", words(assignments))?,
            weights: gpu.storage("expert weights", words(assignments))?,
            order: gpu.storage("assignments by expert", words(assignments))?,
            offsets: gpu.storage("expert runs", words(experts + 1))?,
            live: gpu.storage("experts with tokens", words(experts + 1))?,
            hidden: gpu.storage(
                "expert hidden rows",
                words(assignments * u64::from(moe.intermediate)),
            )?,
            outputs: gpu.storage("expert outputs", words(assignments * u64::from(hidden)))?,
        })
    }
}

/// One sparse layer's expert weights on the GPU.
pub struct ExpertWeights {
    /// `[experts][hidden]` router (dense).
    pub router: Matrix,
    pub router_bias: Option<StorageBuffer>,
    /// Every expert's gate and up rows, `2·experts·intermediate` rows of `hidden`, placed as
    /// `gate_up_rows` says.
    pub gate_up: Matrix,
    pub gate_up_rows: GateUpRows,
    /// Biases in the order of the gate/up rows.
    pub gate_up_bias: Option<StorageBuffer>,
    /// Every expert's down rows, `experts·hidden` rows of `intermediate`.
    pub down: Matrix,
    /// `[experts][hidden]`.
    pub down_bias: Option<StorageBuffer>,
}

struct Dispatch {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    _params: UniformBuffer,
}

/// The kernels of one sparse layer after its router product: routing (with grouping by
/// expert), the two expert products and the weighted sum into `x`: four dispatches.
pub struct Experts {
    /// Routing and grouping: for one token (decoding), and for prompts.
    route: Dispatch,
    route_prompt: Dispatch,
    /// The products for one token (decoding) and as tiles over each expert's tokens
    /// (prompts).
    gate_up: Dispatch,
    down: Dispatch,
    gate_up_tiled: Dispatch,
    down_tiled: Dispatch,
    combine: Dispatch,
    experts: u32,
    top_k: u32,
    hidden: u32,
    up_blocks: u32,
    down_blocks: u32,
    width: u32,
}

/// Output rows and assignments of one tile of the prompts' expert products (`BR`, `BT` in
/// the shader).
const TILE_ROWS: u32 = 64;
const TILE_ASSIGNMENTS: u32 = 32;

impl Experts {
    /// Kernels over `w` for the normed input `xn` (`[tokens][hidden]`), adding into `x`.
    pub fn new(
        gpu: &Gpu,
        moe: &MoeSpec,
        w: &ExpertWeights,
        bufs: &MoeBuffers,
        xn: &StorageBuffer,
        x: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let hidden = w.down.rows / moe.experts;
        let expected = (
            2 * moe.experts * moe.intermediate,
            moe.experts * hidden,
            moe.intermediate,
        );
        if (w.gate_up.rows, w.down.rows, w.down.cols) != expected || w.gate_up.cols != hidden {
            return Err(GpuError::Device(format!(
                "expert matrices of {}×{} and {}×{} do not fit {} experts of width {}",
                w.gate_up.rows,
                w.gate_up.cols,
                w.down.rows,
                w.down.cols,
                moe.experts,
                moe.intermediate
            )));
        }
        let top_k = moe.top_k.to_string();
        let base = Params {
            experts: moe.experts,
            max_assignments: bufs.tokens * moe.top_k,
            ..Default::default()
        };
        let route_with = |lanes: u32| {
            dispatch(
                gpu,
                "moe route",
                vec![
                    flag("ROUTE", true),
                    ("TOP_K", top_k.clone()),
                    ("EXPERTS", moe.experts.to_string()),
                    ("LANES", lanes.to_string()),
                    flag("SOFTMAX_ALL", moe.weights == RouterWeights::SoftmaxOfAll),
                ],
                base,
                step,
                &[
                    (2, &bufs.logits),
                    (4, &bufs.ids),
                    (5, &bufs.weights),
                    (6, &bufs.order),
                    (7, &bufs.offsets),
                    (8, &bufs.live),
                ],
            )
        };
        // On an H200 (Qwen3-30B-A3B's 128 experts, top-8, `bench_llamacpp.sh`) routing one
        // decoded token with 32 lanes took its decode from 120.7 to 185.4 tok/s; over a
        // 504-token prompt's 48 layers, routing took 11.8 ms with one lane a token, 28.9 with
        // 32 and 9.0 with 4.
        let route = route_with(32)?;
        let route_prompt = route_with(4)?;
        let (alpha, limit, clamped) = match moe.activation {
            ExpertActivation::SwiGlu => (0.0, 0.0, false),
            ExpertActivation::ClampedSwiGlu { alpha, limit } => (alpha, limit, true),
        };
        let rows = w.gate_up_rows;
        let up_params = Params {
            rows: moe.intermediate,
            cols: hidden,
            expert_stride: rows.expert_stride,
            row_step: rows.row_step,
            up_offset: rows.up_offset,
            q_scales: w.gate_up.q_scales(),
            alpha,
            limit,
            ..base
        };
        let tpr = lanes_per_row(gpu, &w.gate_up);
        let up_side = ProductSide {
            glu: true,
            clamped,
            per_token: true,
            top_k: &top_k,
            tpr,
            tiled: false,
        };
        let gate_up = expert_product(
            gpu,
            &w.gate_up,
            &up_side,
            up_params,
            xn,
            w.gate_up_bias.as_ref(),
            bufs,
            &bufs.hidden,
        )?;
        let gate_up_tiled = expert_product(
            gpu,
            &w.gate_up,
            &ProductSide {
                tiled: true,
                ..up_side
            },
            up_params,
            xn,
            w.gate_up_bias.as_ref(),
            bufs,
            &bufs.hidden,
        )?;
        let down_params = Params {
            rows: hidden,
            cols: moe.intermediate,
            expert_stride: hidden,
            row_step: 1,
            up_offset: 0,
            q_scales: w.down.q_scales(),
            ..base
        };
        let down_tpr = lanes_per_row(gpu, &w.down);
        let down_side = ProductSide {
            glu: false,
            clamped: false,
            per_token: false,
            top_k: &top_k,
            tpr: down_tpr,
            tiled: false,
        };
        let down = expert_product(
            gpu,
            &w.down,
            &down_side,
            down_params,
            &bufs.hidden,
            None,
            bufs,
            &bufs.outputs,
        )?;
        let down_tiled = expert_product(
            gpu,
            &w.down,
            &ProductSide {
                tiled: true,
                ..down_side
            },
            down_params,
            &bufs.hidden,
            None,
            bufs,
            &bufs.outputs,
        )?;
        let mut entries = vec![(5, &bufs.weights), (9, &bufs.outputs), (11, x)];
        // The ids pick each expert's bias.
        if let Some(b) = &w.down_bias {
            entries.extend([(4, &bufs.ids), (10, b)]);
        }
        let combine = dispatch(
            gpu,
            "moe combine",
            vec![
                flag("COMBINE", true),
                ("TOP_K", top_k),
                flag("BIAS", w.down_bias.is_some()),
            ],
            Params {
                rows: hidden,
                ..base
            },
            step,
            &entries,
        )?;
        Ok(Self {
            route,
            route_prompt,
            gate_up,
            down,
            gate_up_tiled,
            down_tiled,
            combine,
            experts: moe.experts,
            top_k: moe.top_k,
            hidden,
            up_blocks: moe.intermediate.div_ceil(WG / tpr),
            down_blocks: hidden.div_ceil(WG / down_tpr),
            width: moe.intermediate,
        })
    }

    /// Records routing, the expert products and the sum for `n_tokens` tokens whose router
    /// logits are in the buffers.
    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        let run = |rec: &mut Recorder<'_>, d: &Dispatch, grid: [u32; 3]| {
            rec.dispatch_xyz(&d.kernel, &d.bind_group, grid);
        };
        // At most one workgroup row per expert that can have tokens.
        let active = self.experts.min(n_tokens * self.top_k);
        if n_tokens == 1 {
            run(rec, &self.route, [1, 1, 1]);
            run(rec, &self.gate_up, [self.up_blocks, active, 1]);
            run(rec, &self.down, [self.down_blocks, active, 1]);
        } else {
            run(rec, &self.route_prompt, [1, 1, 1]);
            // No expert has more assignments than there are tokens.
            let runs = n_tokens.div_ceil(TILE_ASSIGNMENTS);
            let tiles = |rows: u32| rows.div_ceil(TILE_ROWS);
            run(rec, &self.gate_up_tiled, [tiles(self.width), active, runs]);
            run(rec, &self.down_tiled, [tiles(self.hidden), active, runs]);
        }
        run(
            rec,
            &self.combine,
            [groups_of_64(n_tokens * self.hidden), 1, 1],
        );
    }
}

/// What distinguishes the gate/up product from the down product.
#[derive(Clone, Copy)]
struct ProductSide<'a> {
    glu: bool,
    clamped: bool,
    per_token: bool,
    top_k: &'a str,
    tpr: u32,
    /// The prompts' tiled form (TILED) rather than decoding's.
    tiled: bool,
}

/// Lanes per row: enough to stride a row's units a few at a time, a power of two (one row per
/// invocation on CPU adapters, where reductions across lanes cost most).
fn lanes_per_row(gpu: &Gpu, w: &Matrix) -> u32 {
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
fn expert_product(
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
    let caps = gpu.caps();
    // A row's lanes reduce by shuffles where they lie in one subgroup of fixed size.
    let shuffles = caps.subgroups
        && caps.subgroup_min_size == caps.subgroup_max_size
        && side.tpr <= caps.subgroup_min_size
        && side.tpr > 1;
    let x_vec4 = params.cols.is_multiple_of(4) && !side.tiled;
    let mut defines = w.defines();
    defines.extend([
        flag("SGX", shuffles),
        flag("XVEC4", x_vec4),
        flag("PRODUCT", true),
        flag("EXPERT", !side.tiled),
        flag("TILED", side.tiled),
        flag("QDOT", !side.tiled),
        flag("QGATHER", side.tiled),
        ("TOP_K", side.top_k.to_owned()),
        ("ROW_VECS", w.row_vecs().to_string()),
        ("UNITS", units_of(w).to_string()),
        ("TPR", side.tpr.to_string()),
        ("TB", "4".into()),
        flag("GLU", side.glu),
        flag("CLAMPED", side.clamped),
        flag("BIAS", bias.is_some()),
        flag("PER_TOKEN", side.per_token),
    ]);
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
    let source: &'static str = if w.quant.is_some() {
        super::quant_source::QUANT_MOE.as_str()
    } else {
        SOURCE
    };
    let kernel = gpu.kernel("moe expert", source, "main", &defines)?;
    // The products read their rows from the routing state, not the step.
    finish(gpu, kernel, params, None, &entries)
}

fn dispatch(
    gpu: &Gpu,
    family: &'static str,
    defines: Vec<(&'static str, String)>,
    params: Params,
    step: &UniformBuffer,
    entries: &[(u32, &StorageBuffer)],
) -> Result<Dispatch, GpuError> {
    let kernel = gpu.kernel(family, SOURCE, "main", &defines)?;
    finish(gpu, kernel, params, Some(step), entries)
}

fn finish(
    gpu: &Gpu,
    kernel: Kernel,
    params: Params,
    step: Option<&UniformBuffer>,
    entries: &[(u32, &StorageBuffer)],
) -> Result<Dispatch, GpuError> {
    let params = gpu.uniform("moe params", &params);
    let mut all = vec![(0, &params.buffer)];
    if let Some(step) = step {
        all.push((1, &step.buffer));
    }
    all.extend(entries.iter().map(|(b, s)| (*b, &s.buffer)));
    let bind_group = bind(gpu, &kernel, &all);
    Ok(Dispatch {
        kernel,
        bind_group,
        _params: params,
    })
}

/// Bytes the routing state takes for `tokens` tokens (the fit check).
pub fn moe_buffer_bytes(moe: &MoeSpec, hidden: u32, tokens: u32) -> u64 {
    let assignments = u64::from(tokens) * u64::from(moe.top_k);
    4 * (u64::from(tokens) * u64::from(moe.experts)
        + 3 * assignments
        + 2 * (u64::from(moe.experts) + 1)
        + assignments * (u64::from(moe.intermediate) + u64::from(hidden)))
}
