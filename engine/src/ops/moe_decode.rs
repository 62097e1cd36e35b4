//! A decoded token's routed experts as decode products (shaders/matvec.wgsl EXPERTS) over the
//! chosen experts' rows, where the weights are in a block format.

use super::{ExpertWeights, Experts, MoeBuffers};
use crate::gpu::{Gpu, GpuError, StorageBuffer, UniformBuffer};
use crate::load::{GgmlType, MoeSpec, RouterWeights};
use crate::ops::matvec::k_quant;
use crate::ops::{
    ExpertSlots, Int8Handoff, MatVec, MatVecLayout, MatVecOptions, Matrix, NormKind, SlotRouting,
};

/// A decoded token's expert products through the decode product (shaders/matvec.wgsl
/// EXPERTS): its staged int8 input, loads in flight and shuffle reductions, which the
/// general expert kernel (a loop over each expert's assignments) lacks. On an H200
/// (`bench --profile`, random weights) that kernel took 66 µs a layer for GPT-OSS-20B's
/// gate/up product over 35 MB of MXFP4 rows and 29 µs for Qwen3-30B-A3B's over 14 MB of Q4_K.
pub(super) struct DecodeProducts {
    /// Whether the gate/up product normalises the residual stream itself (no normed row).
    pub(super) normed: bool,
    pub(super) route: DecodeRouting,
    pub(super) gate_up: MatVec,
    pub(super) down: MatVec,
    /// The gate/up product's input as the router's product hands it off (see
    /// [`ExpertDecode::input_handoff`]), where the gate/up product reads it.
    pub(super) input: Option<Int8Handoff>,
    /// The slots' hidden rows as the gate/up product hands them to the down product.
    pub(super) hidden_rows: Option<Int8Handoff>,
}

/// How a decoded token is routed for the decode products; none of them lists the
/// assignments by expert.
pub(super) enum DecodeRouting {
    /// Inside the gate/up product: every workgroup routes the token itself (adapters with
    /// subgroups), one dispatch fewer a layer.
    InProduct,
    /// By `route_prompt`'s one workgroup (adapters without subgroups).
    Workgroup,
    /// By a dispatch of one subgroup-wide workgroup (moe.wgsl ROUTE_SG), no barriers.
    Subgroup(super::Dispatch),
    /// By the router's product, computed in one workgroup (see [`Experts::route_in_router`]);
    /// a prompt's one-token step, whose router is a tiled product, takes the routing dispatch
    /// kept here (None: `route_prompt`'s workgroup).
    InRouter(Option<super::Dispatch>),
}

/// Whether a decoded token routed by a dispatch of its own takes the subgroup kernel
/// (`BACKPACK_MOE_DECODE=route-workgroup` keeps the workgroup one, for measuring).
pub(super) fn routes_by_subgroup(gpu: &Gpu, decode: &DecodeProducts) -> bool {
    matches!(decode.route, DecodeRouting::Workgroup)
        && gpu.caps().subgroups
        && std::env::var("BACKPACK_MOE_DECODE").ok().as_deref() != Some("route-workgroup")
}

/// The most workgroups a decoded token's gate/up product may take and still route the
/// token itself (see `decode_products`).
const IN_PRODUCT_ROUTING_MAX_WORKGROUPS: u32 = 512;

/// A norm as a decode product fuses it: kind, gains, bias, epsilon.
pub type DecodeNorm<'a> = (NormKind, &'a StorageBuffer, Option<&'a StorageBuffer>, f32);

/// How a decoded token's expert products are built.
#[derive(Clone, Copy, Default)]
pub struct ExpertDecode<'a> {
    /// The norm that makes the normed rows from the residual stream: with it the products
    /// may normalise the stream themselves (see [`Experts::decode_normed`]).
    pub norm: Option<DecodeNorm<'a>>,
    /// The decode products' layout (f32 models keep float inputs).
    pub layout: MatVecLayout,
    /// Whether the gate/up product routes the token itself (adapters with subgroups) or a
    /// dispatch of its own does; unset: by the product's workgroups (see `decode_products`).
    pub route_in_product: Option<bool>,
    /// Whether the gate/up product may read its input as int8 blocks that the router's decode
    /// product hands off ([`Experts::input_handoff`]): the caller then builds that product
    /// with it, and records it before every decoded token's experts. Otherwise each of the
    /// gate/up product's workgroups reads the f32 row (and normalises it) itself.
    pub input_handoff: bool,
}

impl Experts {
    /// Whether the router's product should route a decoded token wherever it fits, even on a
    /// CPU adapter (`BACKPACK_MOE_DECODE=router`, for testing).
    pub fn router_routing_forced() -> bool {
        std::env::var("BACKPACK_MOE_DECODE").is_ok_and(|v| v == "router")
    }

    /// Whether a decoded token would be routed by a dispatch of its own, which a router
    /// product computed in one workgroup can take over (`BACKPACK_MOE_DECODE=route` or
    /// `=route-workgroup` keeps the dispatch, `=router` asks for the router's product wherever
    /// it fits, for measuring and testing).
    pub fn routes_by_dispatch(&self) -> bool {
        let forced = std::env::var("BACKPACK_MOE_DECODE").ok();
        self.decode.as_ref().is_some_and(|d| {
            matches!(
                d.route,
                DecodeRouting::Subgroup(_) | DecodeRouting::Workgroup
            )
        }) && !matches!(forced.as_deref(), Some("route" | "route-workgroup"))
    }

    /// The router's product routes a decoded token itself (its `routes` option, writing the
    /// ids and weights these products read): no routing dispatch.
    pub fn route_in_router(&mut self) {
        if let Some(d) = self.decode.as_mut() {
            let dispatch = match std::mem::replace(&mut d.route, DecodeRouting::InProduct) {
                DecodeRouting::Subgroup(dispatch) => Some(dispatch),
                _ => None,
            };
            d.route = DecodeRouting::InRouter(dispatch);
        }
    }

    /// The handoff the router's decode product must write (`handoff_input`), where the decoded
    /// token's gate/up product reads its input from it (see [`ExpertDecode::input_handoff`]).
    pub fn input_handoff(&self) -> Option<&Int8Handoff> {
        self.decode.as_ref().and_then(|d| d.input.as_ref())
    }

    /// Whether a decoded token's gate/up product reads the router's handed-off input, and
    /// whether it hands the slots' hidden rows off to the down product.
    pub fn decode_handoffs(&self) -> (bool, bool) {
        self.decode.as_ref().map_or((false, false), |d| {
            (d.input.is_some(), d.hidden_rows.is_some())
        })
    }

    /// Bytes of expert weights a decoded token leaves unread: every expert but its top-k.
    pub fn unread_bytes_per_token(&self) -> u64 {
        self.unread_bytes
    }

    /// Whether a decoded token's products normalise the residual stream themselves, so that
    /// decoding needs no normed row (the router's product must then fuse the norm too).
    pub fn decode_normed(&self) -> bool {
        self.decode.as_ref().is_some_and(|d| d.normed)
    }

    /// Where a decoded token's products run as decode products (block formats), the levels
    /// of their gate/up and down products' int8 inputs (0: float inputs; with 1 their results
    /// match a reference fed `int8_rounded_input`); None where the general expert kernel runs
    /// them.
    pub fn decode_int8_levels(&self) -> Option<(u32, u32)> {
        self.decode
            .as_ref()
            .map(|d| (d.gate_up.int8_levels(), d.down.int8_levels()))
    }
}

/// Decoding's expert products as decode products, where the weights are in a block format the
/// decode product reads by row (K-quant rows only with int8 inputs, which its layout may turn
/// off); `BACKPACK_MOE_DECODE=experts` keeps the general expert kernel, `=route` a routing
/// dispatch of its own, `=route-workgroup` the one-workgroup routing dispatch, `=router` the
/// router's product in one workgroup (for measuring and testing).
pub(super) fn decode_products(
    gpu: &Gpu,
    moe: &MoeSpec,
    w: &ExpertWeights,
    bufs: &MoeBuffers,
    (xn, x): (&StorageBuffer, &StorageBuffer),
    decode: ExpertDecode<'_>,
    step: &UniformBuffer,
) -> Result<Option<DecodeProducts>, GpuError> {
    let ExpertDecode {
        norm,
        layout,
        route_in_product,
        input_handoff,
    } = decode;
    let clamp = super::clamp_of(moe.activation);
    let blocks = w.gate_up.quant.is_some() && w.down.quant.is_some();
    let forced = std::env::var("BACKPACK_MOE_DECODE").ok();
    if !blocks || forced.as_deref() == Some("experts") {
        return Ok(None);
    }
    let caps = gpu.caps();
    let routes_itself = caps.subgroups
        && !matches!(
            forced.as_deref(),
            Some("route" | "route-workgroup" | "router")
        );
    let hidden = w.down.rows / moe.experts;
    let rows = w.gate_up_rows;
    let slots =
        |rows: u32, stride: u32, row_step: u32, up_offset: u32, per_slot: bool| ExpertSlots {
            ids: &bufs.ids,
            slots: moe.top_k,
            experts: moe.experts,
            rows,
            expert_stride: stride,
            row_step,
            up_offset,
            input_per_slot: per_slot,
            clamp: None,
            route: None,
        };
    let product = |m: &Matrix, x: &StorageBuffer, y: &StorageBuffer, opts: MatVecOptions<'_>| {
        match MatVec::new(gpu, m, x, y, step, opts) {
            Ok(mv) => Ok(Some(mv)),
            // K-quant rows whose layout turns int8 inputs off stay with the expert kernel.
            Err(_) if k_quant(m) => Ok(None),
            Err(e) => Err(e),
        }
    };
    // MXFP4 rows (published GPT-OSS checkpoints, whose greedy answers the f16 path should
    // keep) take the int8 input in two levels, as LM heads do: one level moved the tiny
    // GPT-OSS fixture's logits by up to 0.094 over six greedy steps, against 0.03 for the
    // float input. The second level costs speed: on an H200 (`bench`, GPT-OSS-20B) one level
    // decoded 393.1 / 392.7 tok/s against 366 / 362 with two.
    let layout = match w.gate_up.quant {
        Some((GgmlType::Mxfp4, _)) => MatVecLayout {
            int8_fine: layout.int8_fine.or(Some(true)),
            ..layout
        },
        _ => layout,
    };
    // Handoffs in the levels the products take their int8 inputs in (a reader taking another
    // number of levels reads its f32 row instead).
    let levels = if layout.int8_fine == Some(true) { 2 } else { 1 };
    let input_q = input_handoff
        .then(|| Int8Handoff::with_rows(gpu, w.gate_up.cols, 1, levels))
        .transpose()?;
    let hidden_q = Int8Handoff::with_rows(gpu, w.down.cols, moe.top_k, levels)?;
    let down_opts = |handoff_in| MatVecOptions {
        layout,
        experts: Some(slots(hidden, hidden, 1, 0, true)),
        handoff_in,
        ..Default::default()
    };
    // The gate/up product hands the slots' hidden rows off where the down product reads them.
    let hand_hidden_off = MatVec::would_read_handoff(gpu, &w.down, &down_opts(Some(&hidden_q)));
    let gate_up_opts = |route, input: Option<_>| {
        // With the norm (and no handoff) the gate/up product reads the residual stream and
        // normalises it itself; a handed-off input is the router's, normalised already.
        MatVecOptions {
            norm: norm.filter(|_| input.is_none()),
            layout,
            bias: w.gate_up_bias.as_ref(),
            glu: true,
            experts: Some(ExpertSlots {
                clamp,
                route,
                ..slots(
                    moe.intermediate,
                    rows.expert_stride,
                    rows.row_step,
                    rows.up_offset,
                    false,
                )
            }),
            handoff_in: input,
            handoff_out: hand_hidden_off.then_some((&hidden_q, None)),
            ..Default::default()
        }
    };
    let reads_input = input_q
        .as_ref()
        .is_some_and(|h| MatVec::would_read_handoff(gpu, &w.gate_up, &gate_up_opts(None, Some(h))));
    let input = input_q.as_ref().filter(|_| reads_input);
    let x = if norm.is_some() { x } else { xn };
    let gate_up_with = |route| product(&w.gate_up, x, &bufs.hidden, gate_up_opts(route, input));
    let mut gate_up = gate_up_with(None)?;
    // Routing inside the product delays every workgroup's first weight load, once per wave of
    // workgroups: it pays where they are few. On an H200 (`bench`, random weights)
    // Qwen3-30B-A3B's 384 workgroups decoded 307.6 tok/s against 277.0 with a routing dispatch;
    // GPT-OSS-20B's 720 343.6 against 351.3.
    let routes_itself = routes_itself
        && route_in_product.unwrap_or_else(|| {
            gate_up
                .as_ref()
                .is_some_and(|mv| mv.grid_workgroups() <= IN_PRODUCT_ROUTING_MAX_WORKGROUPS)
        });
    if routes_itself {
        gate_up = gate_up_with(Some(SlotRouting {
            logits: &bufs.logits,
            weights: &bufs.weights,
            softmax_all: moe.weights == RouterWeights::SoftmaxOfAll,
        }))?;
    }
    let reads_hidden = gate_up.as_ref().is_some_and(MatVec::hands_off);
    let down = product(
        &w.down,
        &bufs.hidden,
        &bufs.outputs,
        down_opts(reads_hidden.then_some(&hidden_q)),
    )?;
    let (Some(gate_up), Some(down)) = (gate_up, down) else {
        return Ok(None);
    };
    let route = if routes_itself {
        DecodeRouting::InProduct
    } else {
        DecodeRouting::Workgroup
    };
    Ok(Some(DecodeProducts {
        normed: norm.is_some(),
        route,
        gate_up,
        down,
        input: input_q.filter(|_| reads_input),
        hidden_rows: reads_hidden.then_some(hidden_q),
    }))
}
