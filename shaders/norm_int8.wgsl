// A norm and the int8 quantization of its output in one dispatch, for a few-row int8 product
// that reads the normed rows next (few_rows_int8.wgsl): RMSNorm, or LayerNorm with LAYER, of
// each of the step's rows, written to y as norm.wgsl writes it (the float products and any
// other reader of the rows still find them there), and quantized as quant_rows.wgsl
// quantizes (one level, in the order the product reads). Apart, the two were two small
// dispatches in each half of every layer of a batched step, each waiting on the one before.
//
// One workgroup per row: the lanes sum the row's squares (and values, for LayerNorm) over
// whole 32-value blocks, add them over the workgroup, then each normalises and quantizes its
// blocks, which it reads again (from the cache: the row was just read).
//
// Defines: K (a multiple of 32, and of 64 with UNIT_WORDS 16), UNIT_WORDS, WG, SUBGROUP,
// LAYER.

struct Params {
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> xv: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> weight: array<f32>;
#if LAYER
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
@group(0) @binding(7) var<storage, read_write> xq: array<u32>;
@group(0) @binding(9) var<storage, read_write> xqd: array<vec2<f32>>;

const BLOCKS: u32 = {{K}}u / 32u;

var<workgroup> partial: array<f32, {{WG}}>;

// Where word w of a row goes (quant_rows.wgsl's slot).
fn slot(w: u32) -> u32 {
    return (w % {{UNIT_WORDS}}u) * ({{K}}u / 4u / {{UNIT_WORDS}}u) + w / {{UNIT_WORDS}}u;
}

// `v` summed over the workgroup; every invocation calls it alike.
fn row_total(tid: u32, v: f32, sg_lane: u32, sg_size: u32) -> f32 {
#if SUBGROUP
    // Subgroups of consecutive invocations, as the decode products' wg_sum takes them.
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        partial[tid / sg_size] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < {{WG}}u / sg_size; i++) {
        total += partial[i];
    }
#else
    partial[tid] = v;
    workgroupBarrier();
    for (var half = {{WG}}u / 2u; half > 0u; half >>= 1u) {
        if (tid < half) {
            partial[tid] += partial[tid + half];
        }
        workgroupBarrier();
    }
    let total = partial[0];
#endif
    // The next call rewrites `partial`.
    workgroupBarrier();
    return total;
}

fn gain4(k: u32) -> vec4<f32> {
    return vec4<f32>(weight[k], weight[k + 1u], weight[k + 2u], weight[k + 3u]);
}

#if LAYER
fn bias4(k: u32) -> vec4<f32> {
    return vec4<f32>(bias[k], bias[k + 1u], bias[k + 2u], bias[k + 3u]);
}
#endif

@compute @workgroup_size({{WG}})
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
#if SUBGROUP
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
#if !SUBGROUP
    let sg_lane = 0u;
    let sg_size = 1u;
#endif
    let row = wid.x;
    if (row >= step.n_tokens) {
        return;
    }
    let base = row * ({{K}}u / 4u);
#if LAYER
    var s = 0.0;
    for (var b = tid; b < BLOCKS; b += {{WG}}u) {
#for j in 0..8
        s += dot(xv[base + 8u * b + {{j}}u], vec4<f32>(1.0));
#endfor
    }
    let mean = row_total(tid, s, sg_lane, sg_size) / f32({{K}}u);
    var sq = 0.0;
    for (var b = tid; b < BLOCKS; b += {{WG}}u) {
#for j in 0..8
        {
            let d = xv[base + 8u * b + {{j}}u] - vec4<f32>(mean);
            sq += dot(d, d);
        }
#endfor
    }
#else
    var sq = 0.0;
    for (var b = tid; b < BLOCKS; b += {{WG}}u) {
#for j in 0..8
        {
            let v = xv[base + 8u * b + {{j}}u];
            sq += dot(v, v);
        }
#endfor
    }
#endif
    let inv = inverseSqrt(row_total(tid, sq, sg_lane, sg_size) / f32({{K}}u) + p.eps);
    for (var b = tid; b < BLOCKS; b += {{WG}}u) {
#for j in 0..8
        let k{{j}} = 32u * b + 4u * {{j}}u;
#if LAYER
        let v{{j}} = (xv[base + 8u * b + {{j}}u] - vec4<f32>(mean)) * inv * gain4(k{{j}}) + bias4(k{{j}});
#else
        let v{{j}} = xv[base + 8u * b + {{j}}u] * inv * gain4(k{{j}});
#endif
        y[base + 8u * b + {{j}}u] = v{{j}};
#endfor
        let m = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))),
                    max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
        let amax = max(max(m.x, m.y), max(m.z, m.w));
        let scale = select(0.0, 127.0 / amax, amax > 0.0);
        var total = vec4<i32>(0);
#for j in 0..8
        {
            let q = vec4<i32>(round(v{{j}} * scale));
            total += q;
            xq[base + slot(8u * b + {{j}}u)] = pack4xI8(q);
        }
#endfor
        let d = amax / 127.0;
        xqd[row * BLOCKS + b] = vec2<f32>(d, d * f32(total.x + total.y + total.z + total.w));
    }
}
