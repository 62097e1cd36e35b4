// A token's route from its router logits, by subgroups (ROUTING): shared by the router's
// product that routes the token itself and the decode products that do (matvec.wgsl ROUTES,
// ROUTED), and by decoding's routing dispatch (moe.wgsl ROUTE_SG). The including file defines
// NO_EXPERT, `p.experts` and `router_logit(e)`.
#if ROUTING
// A token's chosen experts in the order of choice, and their weights.
struct TokenRoute {
    experts: array<u32, {{TOP_K}}>,
    weights: array<f32, {{TOP_K}}>,
}

// Whether expert e with logit v is chosen before expert be with logit bv: larger logits
// first, ties to the lower expert (NO_EXPERT: none yet).
fn chosen_before(v: f32, e: u32, bv: f32, be: u32) -> bool {
    return be == NO_EXPERT || v > bv || (v == bv && e < be);
}

// The token's TOP_K experts, in every invocation of each subgroup (`lane` of `size`, so that
// the subgroup operations stay in uniform control flow): one subgroup maximum per choice, no
// workgroup memory and no barriers.
fn route_token(lane: u32, size: u32) -> TokenRoute {
    var route: TokenRoute;
    var chosen: array<f32, {{TOP_K}}>;
    var prev_v = 0.0;
    var prev_e = NO_EXPERT;
    for (var j = 0u; j < {{TOP_K}}u; j++) {
        // Lanes without a candidate hold -inf, so that any real logit wins over them.
        var bv = bitcast<f32>(0xFF800000u);
        var be = NO_EXPERT;
        for (var e = lane; e < p.experts; e += size) {
            let v = router_logit(e);
            let after_prev = prev_e == NO_EXPERT || chosen_before(prev_v, prev_e, v, e);
            if (after_prev && chosen_before(v, e, bv, be)) {
                bv = v;
                be = e;
            }
        }
        let top = subgroupMax(select(bitcast<f32>(0xFF800000u), bv, be != NO_EXPERT));
        prev_e = subgroupMin(select(NO_EXPERT, be, be != NO_EXPERT && bv == top));
        prev_v = top;
        chosen[j] = top;
        route.experts[j] = prev_e;
    }
    let top = chosen[0];
    var total = 0.0;
#if SOFTMAX_ALL
    var part = 0.0;
    for (var e = lane; e < p.experts; e += size) {
        part += exp(router_logit(e) - top);
    }
    total = subgroupAdd(part);
#else
    for (var j = 0u; j < {{TOP_K}}u; j++) {
        total += exp(chosen[j] - top);
    }
#endif
    for (var j = 0u; j < {{TOP_K}}u; j++) {
        route.weights[j] = exp(chosen[j] - top) / total;
    }
    return route;
}
#endif
