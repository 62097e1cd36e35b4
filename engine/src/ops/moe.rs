//! Routed experts (shaders/moe.wgsl): routing the step's tokens to their top-k experts,
//! grouping them by expert, the experts' gate/up and down products over their own tokens, and
//! the weighted sum back into the residual stream. Expert ids stay on the GPU.

use bytemuck::{Pod, Zeroable};

use std::sync::LazyLock;

use super::{Matrix, TokenRouting, bind, flag, groups_of_64};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};
use crate::load::{ExpertActivation, MoeSpec, RouterWeights};

#[path = "moe_decode.rs"]
mod decode;
pub use decode::{DecodeNorm, ExpertDecode};
use decode::{DecodeProducts, DecodeRouting, decode_products, routes_by_subgroup};
#[path = "moe_product.rs"]
mod product;

use product::{Form, ProductSide, expert_product, forced_tile, lanes_per_row, prompt_form};

pub(super) const SOURCE: &str = concat!(
    include_str!("../../../shaders/moe.wgsl"),
    include_str!("../../../shaders/route.wgsl")
);
/// The prompts' expert products on tensor cores: moe.wgsl's shared product section, then
/// moe_coop.wgsl.
pub(super) static COOP_SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{SOURCE}\n{}",
        include_str!("../../../shaders/moe_coop.wgsl")
    )
});
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

impl MoeBuffers {
    /// Assignments per expert of the last routing listed by expert: after a prompt, its last
    /// sparse layer's. A tool's view of how evenly a prompt spreads over the experts, which
    /// sets how full the prompts' expert tiles are.
    pub fn expert_counts(&self, gpu: &Gpu, experts: u32) -> Result<Vec<u32>, GpuError> {
        let offsets: Vec<u32> = gpu.read(&self.offsets.buffer, 0, u64::from(experts) + 1)?;
        Ok(offsets
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
            .collect())
    }

    /// Where a router's product that routes a decoded token itself writes the route.
    pub fn token_routing(&self, moe: &MoeSpec) -> TokenRouting<'_> {
        TokenRouting {
            ids: &self.ids,
            weights: &self.weights,
            top_k: moe.top_k,
            softmax_all: moe.weights == RouterWeights::SoftmaxOfAll,
        }
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
    /// Listing a prompt's assignments by expert.
    group: Dispatch,
    /// The products for one token (decoding) and as tiles over each expert's tokens
    /// (prompts: SIMT tiles, or tensor-core tiles where the adapter has them).
    gate_up: Dispatch,
    down: Dispatch,
    gate_up_tiled: Dispatch,
    down_tiled: Dispatch,
    /// Output rows and assignments of one tile of each prompt product.
    up_tile: (u32, u32),
    down_tile: (u32, u32),
    combine: Dispatch,
    /// Decoding's expert products as decode products over the chosen experts' rows (block
    /// formats), with the input as int8 where the format takes it; else `gate_up` / `down`.
    decode: Option<DecodeProducts>,
    /// Bytes of expert weights a decoded token does not read (the experts it does not pick).
    unread_bytes: u64,
    experts: u32,
    top_k: u32,
    hidden: u32,
    up_blocks: u32,
    down_blocks: u32,
    width: u32,
}

/// Lanes that route one token (`LANES` in moe.wgsl). On an H200 (Qwen3-30B-A3B's 128
/// experts, top-8, `bench_llamacpp.sh`) routing one decoded token with 32 lanes took its
/// decode from 120.7 to 185.4 tok/s. A prompt's tokens take 32 lanes each too, eight tokens
/// a workgroup: one workgroup routing all of a 504-token prompt had taken 9.0 ms of its 48
/// layers with 4 lanes a token (the fastest in one workgroup).
const ROUTE_LANES: u32 = 32;

impl Experts {
    /// Kernels over `w` for the normed input `xn` (`[tokens][hidden]`), adding into `x`;
    /// `decode` shapes a decoded token's products.
    pub fn new(
        gpu: &Gpu,
        moe: &MoeSpec,
        w: &ExpertWeights,
        bufs: &MoeBuffers,
        (xn, x): (&StorageBuffer, &StorageBuffer),
        decode: ExpertDecode<'_>,
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
        let lists = [(6, &bufs.order), (7, &bufs.offsets), (8, &bufs.live)];
        let route_with = |split: bool, by_subgroup: bool| {
            let mut entries = vec![(2, &bufs.logits), (4, &bufs.ids), (5, &bufs.weights)];
            if !split {
                entries.extend(lists);
            }
            let defines = [
                flag("ROUTE", true),
                flag("IDS", true),
                flag("SPLIT", split),
                flag("ROUTE_SG", by_subgroup),
                flag("ROUTING", by_subgroup),
                flag("GROUPING", !split),
                ("TOP_K", top_k.clone()),
                ("EXPERTS", moe.experts.to_string()),
                ("LANES", ROUTE_LANES.to_string()),
                flag("SOFTMAX_ALL", moe.weights == RouterWeights::SoftmaxOfAll),
            ];
            let kernel = gpu.kernel("moe route", SOURCE, "main", &defines)?;
            // One decoded token's routing reads no step: its logits are the router's one row.
            finish(gpu, kernel, base, (!by_subgroup).then_some(step), &entries)
        };
        let route = route_with(false, false)?;
        let route_prompt = route_with(true, false)?;
        let route_decode = |by_subgroup| route_with(true, by_subgroup);
        let mut group_entries = vec![(4, &bufs.ids)];
        group_entries.extend(lists);
        let group = dispatch(
            gpu,
            "moe group",
            vec![
                flag("GROUP", true),
                flag("IDS", true),
                flag("GROUPING", true),
                ("TOP_K", top_k.clone()),
                ("EXPERTS", moe.experts.to_string()),
            ],
            base,
            step,
            &group_entries,
        )?;
        let clamp = clamp_of(moe.activation);
        let (alpha, limit) = clamp.unwrap_or((0.0, 0.0));
        let clamped = clamp.is_some();
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
            form: Form::Decode { tpr },
        };
        let forced = forced_tile();
        // Each product in decoding's form and in the prompts' form, with the latter's tile.
        let both = |m: &Matrix,
                    side: ProductSide<'_>,
                    params: Params,
                    input: &StorageBuffer,
                    bias: Option<&StorageBuffer>,
                    out: &StorageBuffer|
         -> Result<(Dispatch, Dispatch, (u32, u32)), GpuError> {
            let prompt = ProductSide {
                form: prompt_form(gpu.caps(), side.glu, forced.as_deref()),
                ..side
            };
            Ok((
                expert_product(gpu, m, &side, params, input, bias, bufs, out)?,
                expert_product(gpu, m, &prompt, params, input, bias, bufs, out)?,
                prompt.form.tile(),
            ))
        };
        let (gate_up, gate_up_tiled, up_tile) = both(
            &w.gate_up,
            up_side,
            up_params,
            xn,
            w.gate_up_bias.as_ref(),
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
            form: Form::Decode { tpr: down_tpr },
        };
        let (down, down_tiled, down_tile) = both(
            &w.down,
            down_side,
            down_params,
            &bufs.hidden,
            None,
            &bufs.outputs,
        )?;
        let mut decode = decode_products(gpu, moe, w, bufs, (xn, x), decode, step)?;
        if let Some(d) = decode.as_mut().filter(|d| routes_by_subgroup(gpu, d)) {
            d.route = DecodeRouting::Subgroup(route_decode(true)?);
        }
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
                ("TOP_K", top_k.clone()),
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
            group,
            gate_up,
            down,
            gate_up_tiled,
            down_tiled,
            up_tile,
            down_tile,
            combine,
            decode,
            unread_bytes: (w.gate_up.buffer.size + w.down.buffer.size)
                * u64::from(moe.experts.saturating_sub(moe.top_k))
                / u64::from(moe.experts.max(1)),
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
        self.encode_with(rec, n_tokens, false);
    }

    /// Records a decoded token's experts after the router's decode product, which may have
    /// routed the token itself (see [`Experts::route_in_router`]).
    pub fn encode_decode(&self, rec: &mut Recorder<'_>) {
        self.encode_with(rec, 1, true);
    }

    fn encode_with(&self, rec: &mut Recorder<'_>, n_tokens: u32, after_router_mv: bool) {
        let run = |rec: &mut Recorder<'_>, d: &Dispatch, grid: [u32; 3]| {
            rec.dispatch_xyz(&d.kernel, &d.bind_group, grid);
        };
        // At most one workgroup row per expert that can have tokens.
        let active = self.experts.min(n_tokens * self.top_k);
        // A one-token prompt step whose gate/up product would read the input the router's
        // decode product hands off, without that product before it, takes the general kernels.
        if let (1, Some(decode)) = (n_tokens, &self.decode)
            && (after_router_mv || decode.input.is_none())
        {
            match &decode.route {
                DecodeRouting::InProduct => {}
                DecodeRouting::InRouter(_) if after_router_mv => {}
                DecodeRouting::Workgroup | DecodeRouting::InRouter(None) => {
                    run(rec, &self.route_prompt, [1, 1, 1])
                }
                DecodeRouting::Subgroup(route) | DecodeRouting::InRouter(Some(route)) => {
                    run(rec, route, [1, 1, 1])
                }
            }
            decode.gate_up.encode(rec);
            decode.down.encode(rec);
        } else if n_tokens == 1 {
            run(rec, &self.route, [1, 1, 1]);
            run(rec, &self.gate_up, [self.up_blocks, active, 1]);
            run(rec, &self.down, [self.down_blocks, active, 1]);
        } else {
            run(
                rec,
                &self.route_prompt,
                [n_tokens.div_ceil(256 / ROUTE_LANES), 1, 1],
            );
            run(rec, &self.group, [1, 1, 1]);
            // No expert has more assignments than there are tokens.
            let grid = |rows: u32, (tile_rows, tile_assignments): (u32, u32)| {
                [
                    rows.div_ceil(tile_rows),
                    active,
                    n_tokens.div_ceil(tile_assignments),
                ]
            };
            run(rec, &self.gate_up_tiled, grid(self.width, self.up_tile));
            run(rec, &self.down_tiled, grid(self.hidden, self.down_tile));
        }
        run(
            rec,
            &self.combine,
            [groups_of_64(n_tokens * self.hidden), 1, 1],
        );
    }
}

/// GPT-OSS's clamped SwiGLU's (alpha, limit); None for plain SwiGLU.
fn clamp_of(activation: ExpertActivation) -> Option<(f32, f32)> {
    match activation {
        ExpertActivation::SwiGlu => None,
        ExpertActivation::ClampedSwiGlu { alpha, limit } => Some((alpha, limit)),
    }
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
