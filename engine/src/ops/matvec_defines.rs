//! A decode product's shader defines (shaders/matvec.wgsl), from its [`Plan`]: the layout's
//! (lanes, rows, trips, the input's form) and what the options add (norms, handoffs, merged
//! attention, experts and routing).

use super::Plan;
use crate::ops::matvec::{MatVecOptions, k_quant};
use crate::ops::{Matrix, NormKind, flag, gelu_flags};

impl<'a> Plan<'a> {
    /// The shader's defines for this layout.
    pub(in crate::ops) fn defines(
        &self,
        w: &Matrix,
        opts: &MatVecOptions<'a>,
    ) -> Vec<(&'static str, String)> {
        let mut defines = w.defines();
        defines.push(("QDOT", "1".into()));
        defines.extend(gelu_flags(opts.gelu));
        defines.extend(self.layout_defines(w, opts));
        defines.extend(self.handoff_defines(opts));
        defines.extend(merge_defines(opts));
        defines.extend(expert_defines(opts, self.routed_sg));
        defines
    }

    /// Lanes, rows and trips, and the input's form.
    fn layout_defines(&self, w: &Matrix, opts: &MatVecOptions<'a>) -> Vec<(&'static str, String)> {
        vec![
            ("WG", self.wg.to_string()),
            ("ROW_VECS", self.row_vecs.to_string()),
            flag("XCACHE", self.xcache),
            flag("XVEC4", self.x_vec4),
            flag(
                "GAIN4",
                self.rows_of_vec4s && opts.norm.is_some() && self.handoff_in.is_none(),
            ),
            ("TPR", self.tpr.to_string()),
            ("RB", self.rb.to_string()),
            ("NR", self.rows_per_group.to_string()),
            ("UNROLL", self.unroll.to_string()),
            ("UNITS", self.units.to_string()),
            ("LANE_UNITS", self.lane_units.unwrap_or(0).to_string()),
            flag("UNIT_TAIL", self.unit_tail && self.unroll > 0),
            flag("SUBGROUP", self.subgroups),
            flag("SGX", self.shuffle_reduce),
            flag("NORM", opts.norm.is_some()),
            flag(
                "NORM_LAYER",
                matches!(opts.norm, Some((NormKind::Layer, ..))),
            ),
            flag("BIAS", opts.bias.is_some()),
            flag("GLU", opts.glu),
            flag("RESIDUAL", opts.residual),
            flag("KPAIR", self.k_pairs),
            flag("XQ8", self.int8),
            flag("XQ8_FINE", self.int8_levels == 2),
            ("LEVELS", self.int8_levels.max(1).to_string()),
            flag("PIPE", self.pipeline),
            flag("PIPE_NEXT", self.pipeline && self.trips > 1),
            flag("XQ8_VIEW", self.int8 && !k_quant(w)),
            flag(
                "RMS_LATE",
                self.int8 && matches!(opts.norm, Some((NormKind::Rms, ..))),
            ),
        ]
    }

    /// The int8 rows read from the product before and handed to the one after.
    fn handoff_defines(&self, opts: &MatVecOptions<'a>) -> Vec<(&'static str, String)> {
        let (handoff_in, handoff_out) = (self.handoff_in, self.handoff_out);
        let written = handoff_out.map(|(h, _)| h).or(self.hand_input);
        vec![
            flag("XQ8_IN", handoff_in.is_some()),
            flag("XQ8_OUT", handoff_out.is_some()),
            flag("HAND_INPUT", self.hand_input.is_some()),
            flag("HANDS_OFF", written.is_some()),
            ("OUT_LEVELS", written.map_or(1, |h| h.levels).to_string()),
            flag("OUT_FINE", written.is_some_and(|h| h.levels == 2)),
            flag("OUT_GAIN", handoff_out.is_some_and(|(_, g)| g.is_some())),
            ("OUT_BLOCK", self.out_block.to_string()),
            flag(
                "IN_PER_SLOT",
                opts.experts.is_some_and(|e| e.input_per_slot),
            ),
        ]
    }
}

/// Split attention merged while the input is staged.
fn merge_defines(opts: &MatVecOptions<'_>) -> Vec<(&'static str, String)> {
    let combine = opts.combine.as_ref();
    vec![
        flag("COMBINE", combine.is_some()),
        flag("GATED", combine.is_some_and(|c| c.gate.is_some())),
        flag("SINKS", combine.is_some_and(|c| c.sinks.is_some())),
        (
            "WINDOW",
            combine
                .and_then(|c| c.window)
                .unwrap_or(u32::MAX)
                .to_string(),
        ),
        ("MIN_SPLIT", crate::ops::attention::MIN_SPLIT.to_string()),
        ("MAX_SPLITS", crate::ops::attention::MAX_SPLITS.to_string()),
    ]
}

/// A decoded token's chosen experts, and routing in the product or the router's product.
fn expert_defines(opts: &MatVecOptions<'_>, routed_sg: bool) -> Vec<(&'static str, String)> {
    let routing = opts.experts.and_then(|e| e.route);
    let routes = opts.routes;
    vec![
        flag("EXPERTS", opts.experts.is_some()),
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
    ]
}
