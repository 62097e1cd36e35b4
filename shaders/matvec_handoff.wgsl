// The int8 handoff between decode products (appended to matvec.wgsl). A product whose output
// row is the next product's input (the residual stream before a normed product, the MLP's
// hidden row before its down product) quantizes that row once, into the 32-value blocks the
// int8 products take (XQ8_OUT); the next product stages those blocks (XQ8_IN). Otherwise each
// of the next product's hundreds of workgroups reads the whole f32 row, and the norm's gains,
// and quantizes them itself, all before its first weight load. A product may hand off its
// input instead (HAND_INPUT: a router's product, whose one workgroup normalises the row the
// experts' gate/up product reads next).
//
// The handoff buffer of an n-value row, in words, per level: the int8 words (values 4i..4i+3
// in word i) [n/4], then per 16 values (scale, sum of squares of the unscaled values) [n/8].
// A second level (OUT_FINE, read with XQ8_FINE) follows the first: each value's rounding
// remainder quantized again, with (scale, 0) per 16 values. Expert slots' rows follow each
// other. A writer whose workgroups take whole 32-value blocks gives both halves of a block its
// scale; one whose workgroups take 16 rows scales each half alone (OUT_BLOCK). With a fused
// RMSNorm in the next product the blocks hold the row times its gains: the norm's scale is
// one number, applied to the row sums (RMS_LATE), from the sums of squares.

#if XQ8_IN
@group(0) @binding(14) var<storage, read> handoff_in: array<vec4<u32>>;

// One level of a handed-off row, in vec4 words: its int8 words, then its scales.
const IN_LEVEL_VEC4S: u32 = {{ROW_VECS}}u / 4u + {{ROW_VECS}}u / 8u;

// Per 16 values and level, the sum of their int8 values as staged.
var<workgroup> half_sums: array<i32, {{ROW_VECS}}u / 4u * LEVELS>;

// The scale of half h (0, 1) of block b in level `level` of the row from vec4 `at`, and the
// block's: the larger of its halves'.
fn handoff_scales(at: u32, level: u32, b: u32, h: u32) -> vec2<f32> {
    let halves = bitcast<vec4<f32>>(handoff_in[at + level * IN_LEVEL_VEC4S + {{ROW_VECS}}u / 4u + b]);
    return vec2<f32>(select(halves.x, halves.z, h == 1u), max(halves.x, halves.z));
}

// Stages the handed-off row from vec4 `at` as 32-value blocks, and the RMSNorm statistics: an
// invocation per 16 values. Where the halves of a block have different scales, the one with
// the smaller scale is rounded again to the larger (so its values may be one step further
// from exact than stage_int8 leaves them); with two levels, from the value both levels give.
fn stage_handoff(tid: u32, sg_lane: u32, sg_size: u32, at: u32) {
    var squares = 0.0;
    for (var i = tid; i < {{ROW_VECS}}u / 4u; i += {{WG}}u) {
        let scales = handoff_scales(at, 0u, i / 2u, i % 2u);
        var words = handoff_in[at + i];
#if XQ8_FINE
        var fine = handoff_in[at + IN_LEVEL_VEC4S + i];
        if (scales.x != scales.y) {
            let d2 = handoff_scales(at, 1u, i / 2u, i % 2u).x;
            // The block's scale is the larger, so it is not zero here.
            let inv = 1.0 / scales.y;
            for (var c = 0u; c < 4u; c++) {
                let v = vec4<f32>(unpack4xI8(words[c])) * scales.x
                    + vec4<f32>(unpack4xI8(fine[c])) * d2;
                let q = clamp(vec4<i32>(round(v * inv)), vec4<i32>(-127), vec4<i32>(127));
                words[c] = pack4xI8(q);
                fine[c] = pack4xI8(clamp(vec4<i32>(round((v - vec4<f32>(q) * scales.y) * (254.0 * inv))),
                                         vec4<i32>(-127), vec4<i32>(127)));
            }
        }
        var total2 = 0;
        for (var c = 0u; c < 4u; c++) {
            xq[xq_at(1u, 4u * i + c)] = fine[c];
            total2 += dot4I8Packed(fine[c], 0x01010101u);
        }
        half_sums[{{ROW_VECS}}u / 4u + i] = total2;
#else
        if (scales.x != scales.y) {
            let rescale = scales.x / scales.y;
            for (var c = 0u; c < 4u; c++) {
                words[c] = pack4xI8(vec4<i32>(round(vec4<f32>(unpack4xI8(words[c])) * rescale)));
            }
        }
#endif
        var total = 0;
        for (var c = 0u; c < 4u; c++) {
            xq[xq_slot(4u * i + c)] = words[c];
            total += dot4I8Packed(words[c], 0x01010101u);
        }
        half_sums[i] = total;
        squares += bitcast<f32>(handoff_in[at + {{ROW_VECS}}u / 4u + i / 2u][1u + 2u * (i % 2u)]);
    }
#if RMS_LATE
    set_rms_stats(tid, squares, sg_lane, sg_size);
#else
    workgroupBarrier();
#endif
    for (var b = tid; b < {{ROW_VECS}}u / 8u; b += {{WG}}u) {
        let d = handoff_scales(at, 0u, b, 0u).y;
        xqd[b] = vec2<f32>(d, d * f32(half_sums[2u * b] + half_sums[2u * b + 1u]));
#if XQ8_FINE
        // The second level's scale follows the block's first (stage_int8's d / 254).
        let d2 = d / 254.0;
        let sum2 = half_sums[{{ROW_VECS}}u / 4u + 2u * b] + half_sums[{{ROW_VECS}}u / 4u + 2u * b + 1u];
        xqd[{{ROW_VECS}}u / 8u + b] = vec2<f32>(d2, d2 * f32(sum2));
#endif
    }
    workgroupBarrier();
}
#endif

#if HANDS_OFF
@group(0) @binding(15) var<storage, read_write> handoff_out: array<u32>;

// The first word of this workgroup's handed-off row (an expert slot's, past the slots before).
var<private> handoff_row0: u32;

// Words of one level of a handed-off row of `len` values.
fn handoff_level_words(len: u32) -> u32 {
    return len / 4u + len / 8u;
}

// Writes values 16h..16h+15 of a row of `len` (v0..v3) at scale amax / 127, in every level
// the handoff takes, with their sum of squares `squares`.
fn write_half(len: u32, h: u32, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>,
              amax: f32, squares: f32) {
    let inv = select(0.0, 127.0 / amax, amax > 0.0);
    let d = amax / 127.0;
    let stats = handoff_row0 + len / 4u + 2u * h;
    handoff_out[stats] = bitcast<u32>(d);
    handoff_out[stats + 1u] = bitcast<u32>(squares);
#if OUT_FINE
    // Remainders are at most d / 2: the second level's scale is d / 254, as in stage_int8.
    let fine = handoff_row0 + handoff_level_words(len);
    let inv2 = select(0.0, 254.0 / d, amax > 0.0);
    handoff_out[fine + len / 4u + 2u * h] = bitcast<u32>(d / 254.0);
    handoff_out[fine + len / 4u + 2u * h + 1u] = 0u;
#endif
#for j in 0..4
    {
        let q = vec4<i32>(round(v{{j}} * inv));
        handoff_out[handoff_row0 + 4u * h + {{j}}u] = pack4xI8(q);
#if OUT_FINE
        let q2 = clamp(vec4<i32>(round((v{{j}} - vec4<f32>(q) * d) * inv2)), vec4<i32>(-127), vec4<i32>(127));
        handoff_out[fine + 4u * h + {{j}}u] = pack4xI8(q2);
#endif
    }
#endfor
}
#endif

#if HAND_INPUT
// The input as this product reads it (normalised, where it fuses a norm), handed off by the
// first workgroup after staging it: an invocation per 32-value block.
fn hand_input_off(tid: u32, base: u32) {
    for (var b = tid; b < p.k / 32u; b += {{WG}}u) {
#for j in 0..8
        let v{{j}} = xin4(base, 32u * b + 4u * {{j}}u);
#endfor
        let m = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))),
                    max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
        let amax = max(max(m.x, m.y), max(m.z, m.w));
        let low = dot(v0, v0) + dot(v1, v1) + dot(v2, v2) + dot(v3, v3);
        let high = dot(v4, v4) + dot(v5, v5) + dot(v6, v6) + dot(v7, v7);
        write_half(p.k, 2u * b, v0, v1, v2, v3, amax, low);
        write_half(p.k, 2u * b + 1u, v4, v5, v6, v7, amax, high);
    }
}
#endif

#if XQ8_OUT
#if OUT_GAIN
@group(0) @binding(16) var<storage, read> out_gain: array<f32>;
#endif

// A workgroup's rows: consecutive from group · OUT_ROWS (see block_row0), whole blocks of
// OUT_BLOCK (32, or 16 where OUT_ROWS is no multiple of 32), which it quantizes itself from
// workgroup memory.
const OUT_ROWS: u32 = {{RB}}u * {{NR}}u * ROW_STEP;
const OUT_BLOCK: u32 = {{OUT_BLOCK}}u;

var<workgroup> out_vals: array<f32, OUT_ROWS>;
var<workgroup> out_squares: array<f32, OUT_ROWS>;
#if OUT_GAIN
var<workgroup> out_gains: array<f32, OUT_ROWS>;
#endif

// The next norm's gains for this workgroup's rows, requested first (and read after the
// barriers that follow), so that their latency is not added at the end.
fn load_out_gains(group: u32, tid: u32) {
#if OUT_GAIN
    for (var i = tid; i < OUT_ROWS; i += {{WG}}u) {
        out_gains[i] = out_gain[min(group * OUT_ROWS + i, p.n - 1u)];
    }
#endif
}

// Keeps an output row for its block (lane 0 of the row, after writing it).
fn hand_off_row(row: u32, v: f32) {
    let at = row % OUT_ROWS;
#if OUT_GAIN
    out_vals[at] = v * out_gains[at];
#else
    out_vals[at] = v;
#endif
    out_squares[at] = v * v;
}

// Quantizes the workgroup's blocks, one invocation each, as stage_int8 does.
fn hand_off(group: u32, tid: u32) {
    workgroupBarrier();
    let first = group * OUT_ROWS;
    for (var b = tid; b < OUT_ROWS / OUT_BLOCK; b += {{WG}}u) {
        if (first + OUT_BLOCK * b < p.n) {
            quantize_out_block(first / 16u + OUT_BLOCK / 16u * b, OUT_BLOCK * b);
        }
    }
}

// The OUT_BLOCK values from out_vals[at..], the 16-value halves of the row from `half0`.
fn quantize_out_block(half0: u32, at: u32) {
    var amax = 0.0;
    for (var i = 0u; i < OUT_BLOCK; i++) {
        amax = max(amax, abs(out_vals[at + i]));
    }
    for (var h = 0u; h < OUT_BLOCK / 16u; h++) {
        let a = at + 16u * h;
        var squares = 0.0;
        for (var i = 0u; i < 16u; i++) {
            squares += out_squares[a + i];
        }
        write_half(p.n, half0 + h,
                   vec4<f32>(out_vals[a], out_vals[a + 1u], out_vals[a + 2u], out_vals[a + 3u]),
                   vec4<f32>(out_vals[a + 4u], out_vals[a + 5u], out_vals[a + 6u], out_vals[a + 7u]),
                   vec4<f32>(out_vals[a + 8u], out_vals[a + 9u], out_vals[a + 10u], out_vals[a + 11u]),
                   vec4<f32>(out_vals[a + 12u], out_vals[a + 13u], out_vals[a + 14u], out_vals[a + 15u]),
                   amax, squares);
    }
}
#endif
