//! A layer's MLP kernels: a dense MLP's prompt products beside its decode products, or a
//! sparse layer's router, routed experts and shared expert.

use super::super::super::family::{MlpWeights, SharedExpertWeights};
use super::super::super::{FusedNorm, LayerMlp, SharedExpert};
use super::{LayerContext, ROUTER_ROUTES_MAX_ROWS};
use crate::Error;
use crate::ops::{
    ExpertDecode, Experts, Glu, GluKind, MatMul, MatMulOptions, MatVec, MatVecLayout,
    MatVecOptions, OutputGate, WeightDType,
};

impl LayerContext<'_> {
    /// A layer's MLP kernels: the dense prompt products beside the decode products made
    /// before, or the router and experts.
    pub(super) fn mlp(
        &self,
        w: &MlpWeights,
        shared: Option<&SharedExpertWeights>,
        dense_mvs: Option<(MatVec, MatVec)>,
        mlp_norm: FusedNorm<'_>,
    ) -> Result<LayerMlp, Error> {
        let a = self.acts;
        let (out, residual) = self.branch_out();
        match (w, dense_mvs) {
            (
                MlpWeights::Dense {
                    up,
                    up_bias,
                    down,
                    down_bias,
                },
                Some((up_mv, down_mv)),
            ) => {
                let glu = self.glu();
                // Without the gate/up buffer the product gates its own output.
                let up_out = a.gate_up.as_ref().unwrap_or(&a.h);
                Ok(LayerMlp::Dense {
                    up_mv,
                    down_mv,
                    up_mm: self.prompt_product(
                        up,
                        &a.xn,
                        up_out,
                        MatMulOptions {
                            bias: up_bias.as_ref(),
                            gelu: self.gelu(),
                            glu: glu.filter(|_| a.gate_up.is_none()),
                            ..Default::default()
                        },
                    )?,
                    glu: match (&a.gate_up, glu) {
                        (Some(gu), Some(kind)) => Some(Glu::new(
                            self.gpu,
                            kind,
                            self.spec.intermediate,
                            gu,
                            &a.h,
                            self.step,
                        )?),
                        _ => None,
                    },
                    down_mm: self.prompt_product(
                        down,
                        &a.h,
                        out,
                        MatMulOptions {
                            bias: down_bias.as_ref(),
                            residual,
                            ..Default::default()
                        },
                    )?,
                })
            }
            (MlpWeights::Experts(experts), None) => {
                let (Some(moe), Some(bufs)) = (&self.spec.moe, &a.moe) else {
                    return Err(Error::Invalid("experts without a routing spec".into()));
                };
                let router = MatMul::new(
                    self.gpu,
                    &experts.router,
                    &a.xn,
                    &bufs.logits,
                    self.step,
                    MatMulOptions {
                        bias: experts.router_bias.as_ref(),
                        ..Default::default()
                    },
                )?;
                // A decoded token's products normalise the residual stream themselves where
                // nothing else reads the normed row (a shared expert would).
                let mut routed = Experts::new(
                    self.gpu,
                    moe,
                    experts,
                    bufs,
                    (&a.xn, &a.x),
                    ExpertDecode {
                        norm: shared.is_none().then_some(mlp_norm),
                        layout: self.decode_layout,
                        route_in_product: None,
                        input_handoff: true,
                    },
                    self.step,
                )?;
                let decode_normed = routed.decode_normed();
                // Decoding's router product: one row, where a tiled product would spend its
                // whole k loop in one workgroup.
                let router_mv = |routes, layout| {
                    MatVec::new(
                        self.gpu,
                        &experts.router,
                        if decode_normed { &a.x } else { &a.xn },
                        &bufs.logits,
                        self.step,
                        MatVecOptions {
                            norm: decode_normed.then_some(mlp_norm),
                            bias: experts.router_bias.as_ref(),
                            routes,
                            layout,
                            // The gate/up product after it may read its input so.
                            handoff_input: routed.input_handoff(),
                            ..Default::default()
                        },
                    )
                };
                // A row a workgroup (off CPU adapters): with 32 lanes a row GPT-OSS-20B's 32
                // router rows ran in four workgroups, 11.6 µs a layer on an H200.
                let row_a_workgroup = MatVecLayout {
                    lanes: (!self.gpu.is_software()).then_some(256),
                    ..MatVecLayout::for_dtype(WeightDType::F32)
                };
                let rows = experts.router.rows;
                let in_router = routed.routes_by_dispatch()
                    && rows <= ROUTER_ROUTES_MAX_ROWS
                    && (!self.gpu.is_software() || Experts::router_routing_forced());
                let one_workgroup = MatVecLayout {
                    lanes: Some(32),
                    rows: Some(1),
                    workgroup: Some(1024),
                    blocks: Some(rows.div_ceil(32)),
                    ..MatVecLayout::for_dtype(WeightDType::F32)
                };
                // Where the rows do not fit one workgroup on this adapter the product refuses
                // to route, and a routing dispatch stays.
                let routing_router = in_router
                    .then(|| router_mv(Some(bufs.token_routing(moe)), one_workgroup).ok())
                    .flatten();
                let routes_token = routing_router.is_some();
                let router_mv = match routing_router {
                    Some(mv) => mv,
                    None => router_mv(None, row_a_workgroup)?,
                };
                if routes_token {
                    routed.route_in_router();
                }
                Ok(LayerMlp::Experts {
                    router,
                    router_mv,
                    experts: routed,
                    decode_normed,
                    shared: shared.map(|s| self.shared_expert(s)).transpose()?,
                })
            }
            _ => Err(Error::Invalid(
                "a dense MLP without its decode products".into(),
            )),
        }
    }

    /// A shared expert's products over the normed rows the router reads: gate/up with SwiGLU
    /// into the hidden row, its one-row gate, the hidden row scaled by the gate's sigmoid, and
    /// the down product added to the residual stream (as the routed experts' sum is).
    fn shared_expert(&self, w: &SharedExpertWeights) -> Result<SharedExpert, Error> {
        let (gpu, a, step) = (self.gpu, self.acts, self.step);
        let Some(gate_out) = &a.shared_gate else {
            return Err(Error::Invalid(
                "a shared expert without its gate buffer".into(),
            ));
        };
        let width = self.spec.intermediate;
        let (out, residual) = self.branch_out();
        let up_out = a.gate_up.as_ref().unwrap_or(&a.h);
        Ok(SharedExpert {
            up_mv: MatVec::new(
                gpu,
                &w.up,
                &a.xn,
                &a.h,
                step,
                MatVecOptions {
                    glu: true,
                    layout: self.decode_layout,
                    ..Default::default()
                },
            )?,
            gate_mv: MatVec::new(
                gpu,
                &w.gate,
                &a.xn,
                gate_out,
                step,
                MatVecOptions {
                    layout: MatVecLayout::for_dtype(WeightDType::F32),
                    ..Default::default()
                },
            )?,
            down_mv: MatVec::new(
                gpu,
                &w.down,
                &a.h,
                out,
                step,
                MatVecOptions {
                    residual,
                    layout: self.decode_layout,
                    ..Default::default()
                },
            )?,
            up_mm: self.prompt_product(
                &w.up,
                &a.xn,
                up_out,
                MatMulOptions {
                    glu: Some(GluKind::Silu).filter(|_| a.gate_up.is_none()),
                    ..Default::default()
                },
            )?,
            glu: a
                .gate_up
                .as_ref()
                .map(|gu| Glu::new(gpu, GluKind::Silu, width, gu, &a.h, step))
                .transpose()?,
            gate_mm: MatMul::new(
                gpu,
                &w.gate,
                &a.xn,
                gate_out,
                step,
                MatMulOptions::default(),
            )?,
            scale: OutputGate::rows(gpu, width, gate_out, &a.h, step)?,
            down_mm: self.prompt_product(
                &w.down,
                &a.h,
                out,
                MatMulOptions {
                    residual,
                    ..Default::default()
                },
            )?,
        })
    }
}
