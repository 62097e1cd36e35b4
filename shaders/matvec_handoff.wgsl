// The int8 handoff between decode products (appended to matvec.wgsl). A product whose output
// row is the next product's input (the residual stream before a normed product, the MLP's
// hidden row before its down product) quantizes that row once, into the 32-value blocks the
// int8 products take (XQ8_OUT); the next product stages those blocks (XQ8_IN). Otherwise each
// of the next product's hundreds of workgroups reads the whole f32 row, and the norm's gains,
// and quantizes them itself, all before its first weight load.
//
// The handoff buffer of an n-value row, in words: the int8 words (values 4i..4i+3 in word i)
// [n/4], then per block (scale, dequantized sum, sum of squares of the unscaled values, 0)
// [n/8]. With a fused RMSNorm in the next product the blocks hold the row times its gains: the
// norm's scale is one number, applied to the row sums (RMS_LATE), from the blocks' sums of
// squares.

#if XQ8_IN
@group(0) @binding(14) var<storage, read> handoff_in: array<vec4<u32>>;

// Stages the handed-off row as stage_int8 would have quantized it, and the RMSNorm statistics.
fn stage_handoff(tid: u32, sg_lane: u32, sg_size: u32) {
    for (var i = tid; i < {{ROW_VECS}}u / 4u; i += {{WG}}u) {
        let words = handoff_in[i];
        xq[xq_slot(4u * i)] = words.x;
        xq[xq_slot(4u * i + 1u)] = words.y;
        xq[xq_slot(4u * i + 2u)] = words.z;
        xq[xq_slot(4u * i + 3u)] = words.w;
    }
    var squares = 0.0;
    for (var b = tid; b < {{ROW_VECS}}u / 8u; b += {{WG}}u) {
        let block = bitcast<vec4<f32>>(handoff_in[{{ROW_VECS}}u / 4u + b]);
        xqd[b] = block.xy;
        squares += block.z;
    }
#if RMS_LATE
    set_rms_stats(tid, squares, sg_lane, sg_size);
#endif
    workgroupBarrier();
}
#endif

#if XQ8_OUT
@group(0) @binding(15) var<storage, read_write> handoff_out: array<u32>;
#if OUT_GAIN
@group(0) @binding(16) var<storage, read> out_gain: array<f32>;
#endif

// A workgroup's rows: consecutive from group · OUT_ROWS (see block_row0), whole blocks (the
// host makes OUT_ROWS a multiple of 32), which it quantizes itself from workgroup memory.
const OUT_ROWS: u32 = {{RB}}u * {{NR}}u * ROW_STEP;

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
    for (var b = tid; b < OUT_ROWS / 32u; b += {{WG}}u) {
        if (first + 32u * b < p.n) {
            quantize_out_block(first / 32u + b, 32u * b);
        }
    }
}

// Block b from out_vals[at..at + 32]: its words, then (scale, dequantized sum, sum of squares).
fn quantize_out_block(b: u32, at: u32) {
    var amax = 0.0;
    var squares = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(out_vals[at + i]));
        squares += out_squares[at + i];
    }
    let inv = select(0.0, 127.0 / amax, amax > 0.0);
    let d = amax / 127.0;
    var total = 0;
    for (var j = 0u; j < 8u; j++) {
        let v = vec4<f32>(out_vals[at + 4u * j], out_vals[at + 4u * j + 1u],
                          out_vals[at + 4u * j + 2u], out_vals[at + 4u * j + 3u]);
        let q = vec4<i32>(round(v * inv));
        total += q.x + q.y + q.z + q.w;
        handoff_out[8u * b + j] = pack4xI8(q);
    }
    let stats = p.n / 4u + 4u * b;
    handoff_out[stats] = bitcast<u32>(d);
    handoff_out[stats + 1u] = bitcast<u32>(d * f32(total));
    handoff_out[stats + 2u] = bitcast<u32>(squares);
}
#endif
