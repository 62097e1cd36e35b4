// Full attention (every query sees every key, or keys up to its own position with CAUSAL) for
// CPU adapters, as three passes over a scores buffer laid out like matmul_cpu.wgsl's tiles:
// one subgroup of 8 lanes per workgroup, no workgroup memory, each lane loading a vec4 for 4
// of the tile's rows (handed to every lane with subgroupBroadcast) and a vec4 for each of its 4
// columns per step. Such a driver loads a value that differs between lanes one lane at a time,
// so the query-block kernel of attention.wgsl, which reads workgroup memory in its inner
// loops, runs there at a tenth of this speed.
//
// `scores`: S[g][i][j] = scale · q_i · k_j for the dispatch's heads g (32 queries × 32 keys a
// workgroup). `stats`: each row's maximum and the reciprocal of its sum of exponentials (one
// workgroup a row). `values`: out_i = Σ_j exp(S[i][j] − max_i) · v_j / sum_i (32 queries × 32
// dims a workgroup). Keys and values come from a token-major buffer as in attention.wgsl FULL.
//
// Defines: HD (head_dim, a multiple of 4), CAUSAL.

struct Params {
    heads: u32,
    kv_heads: u32,
    keys: u32,
    // Floats between consecutive queries and between consecutive keys.
    q_stride: u32,
    scale: f32,
    kv_stride: u32,
    k_off: u32,
    // The dispatch's first head: its heads are head0 + workgroup z.
    head0: u32,
    // Query rows the scores buffer holds per head, and its row stride in floats (the keys
    // rounded up to whole vec4 words).
    rows: u32,
    row_stride: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> kv: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> s: array<vec4<f32>>;
// Per scores row: (maximum, 1 / sum of exponentials).
@group(0) @binding(5) var<storage, read_write> stats: array<vec2<f32>>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;

const QUADS: u32 = {{HD}}u / 4u;
const NEG_BIG: f32 = -3.0e38;

// acc + x[0]·c0 + … + x[3]·c3: one row's step of four against this lane's four columns.
fn madd(acc: vec4<f32>, x: vec4<f32>, c0: vec4<f32>, c1: vec4<f32>, c2: vec4<f32>,
    c3: vec4<f32>) -> vec4<f32> {
    return acc + x.x * c0 + x.y * c1 + x.z * c2 + x.w * c3;
}

fn kv_head(head: u32) -> u32 {
    return head / (p.heads / p.kv_heads);
}

// Keys query `row` sees.
fn visible(row: u32) -> u32 {
#if CAUSAL
    return min(p.keys, row + 1u);
#else
    return p.keys;
#endif
}

// This lane's keys are j0 + 4·lane + c: its scores are one vec4 of a scores row.
@compute @workgroup_size(8)
fn scores(@builtin(subgroup_invocation_id) lane: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = p.head0 + wid.z;
    let i0 = wid.y * 32u;
    let j0 = wid.x * 32u;
    // Rows and keys past the ends are clamped to the last ones; they are never stored or
    // never read.
#for i in 0..4
    let q{{i}} = (min(i0 + {{i}}u * 8u + lane, step.n_tokens - 1u) * p.q_stride + head * {{HD}}u) / 4u;
#endfor
#for c in 0..4
    let k{{c}} = (min(j0 + 4u * lane + {{c}}u, p.keys - 1u) * p.kv_stride + p.k_off
        + kv_head(head) * {{HD}}u) / 4u;
#endfor
#for i in 0..4
#for l in 0..8
    var acc{{i}}_{{l}} = vec4<f32>(0.0);
#endfor
#endfor
    for (var d = 0u; d < QUADS; d++) {
#for i in 0..4
        let x{{i}} = q[q{{i}} + d];
#endfor
#for c in 0..4
        let w{{c}} = kv[k{{c}} + d];
#endfor
        let d0 = vec4<f32>(w0.x, w1.x, w2.x, w3.x);
        let d1 = vec4<f32>(w0.y, w1.y, w2.y, w3.y);
        let d2 = vec4<f32>(w0.z, w1.z, w2.z, w3.z);
        let d3 = vec4<f32>(w0.w, w1.w, w2.w, w3.w);
#for i in 0..4
#for l in 0..8
        acc{{i}}_{{l}} = madd(acc{{i}}_{{l}}, subgroupBroadcast(x{{i}}, {{l}}u), d0, d1, d2, d3);
#endfor
#endfor
    }
    // A vec4 that starts inside a row lies inside it (the stride is whole vec4 words).
    let col = j0 + 4u * lane;
    if (col >= p.row_stride) {
        return;
    }
#for i in 0..4
#for l in 0..8
    if (i0 + {{i}}u * 8u + {{l}}u < step.n_tokens) {
        s[((wid.z * p.rows + i0 + {{i}}u * 8u + {{l}}u) * p.row_stride + col) / 4u] =
            acc{{i}}_{{l}} * p.scale;
    }
#endfor
#endfor
}

// Row wid.x of head wid.z: an online maximum and sum per lane over its vec4 words, then
// combined across the subgroup.
@compute @workgroup_size(8)
fn stats_pass(@builtin(subgroup_invocation_id) lane: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.x;
    let base = (wid.z * p.rows + row) * p.row_stride / 4u;
    let seen = visible(row);
    var m = NEG_BIG;
    var sum = 0.0;
    for (var w = lane; w * 4u < seen; w += 8u) {
        let inside = vec4<u32>(4u * w) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(seen);
        let v = select(vec4<f32>(NEG_BIG), s[base + w], inside);
        let m_new = max(m, max(max(v.x, v.y), max(v.z, v.w)));
        let e = select(vec4<f32>(0.0), exp(v - m_new), inside);
        sum = sum * exp(m - m_new) + e.x + e.y + e.z + e.w;
        m = m_new;
    }
    let top = subgroupMax(m);
    let total = subgroupAdd(sum * exp(m - top));
    if (lane == 0u) {
        stats[wid.z * p.rows + row] = vec2<f32>(top, 1.0 / total);
    }
}

// This lane's dims are d0 + 4·lane ..: for each key one vec4 of its value row, which is
// already the step's vector across the lane's four columns.
@compute @workgroup_size(8)
fn values(@builtin(subgroup_invocation_id) lane: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = p.head0 + wid.z;
    let i0 = wid.y * 32u;
    let quad = wid.x * 8u + lane;
    let v_base = (p.k_off + (p.kv_heads + kv_head(head)) * {{HD}}u) / 4u + min(quad, QUADS - 1u);
    let v_row = p.kv_stride / 4u;
#for i in 0..4
    let r{{i}} = min(i0 + {{i}}u * 8u + lane, step.n_tokens - 1u);
    let s{{i}} = (wid.z * p.rows + r{{i}}) * p.row_stride / 4u;
    let st{{i}} = stats[wid.z * p.rows + r{{i}}];
    let seen{{i}} = vec4<u32>(visible(r{{i}}));
#endfor
#for i in 0..4
#for l in 0..8
    var acc{{i}}_{{l}} = vec4<f32>(0.0);
#endfor
#endfor
    for (var w = 0u; w * 4u < p.keys; w++) {
        let j = 4u * w;
        let inside = vec4<u32>(j) + vec4<u32>(0u, 1u, 2u, 3u);
#for i in 0..4
        let x{{i}} = select(vec4<f32>(0.0), exp(s[s{{i}} + w] - st{{i}}.x), inside < seen{{i}});
#endfor
#for t in 0..4
        let v{{t}} = kv[min(j + {{t}}u, p.keys - 1u) * v_row + v_base];
#endfor
#for i in 0..4
#for l in 0..8
        acc{{i}}_{{l}} = madd(acc{{i}}_{{l}}, subgroupBroadcast(x{{i}}, {{l}}u), v0, v1, v2, v3);
#endfor
#endfor
    }
    let out_row = p.heads * QUADS;
#for i in 0..4
#for l in 0..8
    {
        // Every lane takes part in the broadcast; the store is this lane's if its dims exist.
        let inv = subgroupBroadcast(st{{i}}.y, {{l}}u);
        if (quad < QUADS && i0 + {{i}}u * 8u + {{l}}u < step.n_tokens) {
            out[(i0 + {{i}}u * 8u + {{l}}u) * out_row + head * QUADS + quad] = acc{{i}}_{{l}} * inv;
        }
    }
#endfor
#endfor
}
