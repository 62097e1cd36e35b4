// Rows of x quantized to int8 for the few-row int8 products (few_rows_int8.wgsl), once per
// product rather than in each of its workgroups: per 32-value block, symmetric, scale
// max |x| / 127 and rounded to even, as the decode products stage their input (stage_int8 in
// matvec.wgsl). With LEVELS = 2 a second level carries each value's rounding remainder,
// quantized again at scale d / 254, so that x = d·q + d₂·q₂ (LM heads, whose logits pick
// tokens).
//
// Out: xq [row][level][K / 4] words of four int8 values, each level's words in the order its
// product reads them: word j of unit u (UNIT_WORDS words: a sub-block's 8 or a sub-block pair's
// 16) at j·(K / 4 / UNIT_WORDS) + u; xqd [row][level][K / 32] (scale, scale × the block's
// integer sum), the sum being what the offsets and mins of the block formats multiply. Rows:
// step.n_tokens. Defines: K (a multiple of 32, and of 64 with UNIT_WORDS 16), LEVELS,
// UNIT_WORDS.

@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> xv: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> xq: array<u32>;
@group(0) @binding(9) var<storage, read_write> xqd: array<vec2<f32>>;

const BLOCKS: u32 = {{K}}u / 32u;
const LEVELS: u32 = {{LEVELS}}u;

// Where word w of a level goes.
fn slot(w: u32) -> u32 {
    return (w % {{UNIT_WORDS}}u) * ({{K}}u / 4u / {{UNIT_WORDS}}u) + w / {{UNIT_WORDS}}u;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    if (id >= step.n_tokens * BLOCKS) {
        return;
    }
    let row = id / BLOCKS;
    let b = id % BLOCKS;
    let first = (row * {{K}}u + 32u * b) / 4u;
#for j in 0..8
    let v{{j}} = xv[first + {{j}}u];
#endfor
    let m = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))),
                max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
    let amax = max(max(m.x, m.y), max(m.z, m.w));
    let inv = select(0.0, 127.0 / amax, amax > 0.0);
    let d = amax / 127.0;
    let level0 = row * LEVELS;
    var total = vec4<i32>(0);
#if LEVELS_2
    let d2 = d / 254.0;
    let inv2 = select(0.0, 254.0 / d, amax > 0.0);
    var total2 = vec4<i32>(0);
#endif
#for j in 0..8
    {
        let q = vec4<i32>(round(v{{j}} * inv));
        total += q;
        xq[level0 * ({{K}}u / 4u) + slot(8u * b + {{j}}u)] = pack4xI8(q);
#if LEVELS_2
        let q2 = clamp(vec4<i32>(round((v{{j}} - vec4<f32>(q) * d) * inv2)), vec4<i32>(-127), vec4<i32>(127));
        total2 += q2;
        xq[(level0 + 1u) * ({{K}}u / 4u) + slot(8u * b + {{j}}u)] = pack4xI8(q2);
#endif
    }
#endfor
    xqd[level0 * BLOCKS + b] = vec2<f32>(d, d * f32(total.x + total.y + total.z + total.w));
#if LEVELS_2
    xqd[(level0 + 1u) * BLOCKS + b] = vec2<f32>(d2, d2 * f32(total2.x + total2.y + total2.z + total2.w));
#endif
}
