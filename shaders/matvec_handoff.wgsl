// The int8 handoff between decode products (appended to matvec.wgsl). A product whose output
// row is the next product's input (the residual stream before a normed product, the MLP's
// hidden row before its down product) quantizes that row once, into the 32-value blocks the
// int8 products take (XQ8_OUT); the next product stages those blocks (XQ8_IN). Otherwise each
// of the next product's hundreds of workgroups reads the whole f32 row, and the norm's gains,
// and quantizes them itself, all before its first weight load.
//
// The handoff buffer of an n-value row, in words: the int8 words (values 4i..4i+3 in word i)
// [n/4], then per 16 values (scale, sum of squares of the unscaled values) [n/8]. A writer
// whose workgroups take whole 32-value blocks gives both halves of a block its scale; one whose
// workgroups take 16 rows scales each half alone (OUT_BLOCK). With a fused RMSNorm in the next
// product the blocks hold the row times its gains: the norm's scale is one number, applied to
// the row sums (RMS_LATE), from the sums of squares.

#if XQ8_IN
@group(0) @binding(14) var<storage, read> handoff_in: array<vec4<u32>>;

// Per 16 values, the sum of their int8 values as staged.
var<workgroup> half_sums: array<i32, {{ROW_VECS}}u / 4u>;

// The scale of half h (0, 1) of block b, and the block's: the larger of its halves'.
fn handoff_scales(b: u32, h: u32) -> vec2<f32> {
    let halves = bitcast<vec4<f32>>(handoff_in[{{ROW_VECS}}u / 4u + b]);
    return vec2<f32>(select(halves.x, halves.z, h == 1u), max(halves.x, halves.z));
}

// Stages the handed-off row as 32-value blocks, and the RMSNorm statistics: an invocation per
// 16 values. Where the halves of a block have different scales, the one with the smaller scale
// is rounded again to the larger (so its values may be one step further from exact than
// stage_int8 leaves them).
fn stage_handoff(tid: u32, sg_lane: u32, sg_size: u32) {
    var squares = 0.0;
    for (var i = tid; i < {{ROW_VECS}}u / 4u; i += {{WG}}u) {
        let scales = handoff_scales(i / 2u, i % 2u);
        var words = handoff_in[i];
        if (scales.x != scales.y) {
            let rescale = scales.x / scales.y;
            for (var c = 0u; c < 4u; c++) {
                words[c] = pack4xI8(vec4<i32>(round(vec4<f32>(unpack4xI8(words[c])) * rescale)));
            }
        }
        var total = 0;
        for (var c = 0u; c < 4u; c++) {
            xq[xq_slot(4u * i + c)] = words[c];
            total += dot4I8Packed(words[c], 0x01010101u);
        }
        half_sums[i] = total;
        squares += bitcast<f32>(handoff_in[{{ROW_VECS}}u / 4u + i / 2u][1u + 2u * (i % 2u)]);
    }
#if RMS_LATE
    set_rms_stats(tid, squares, sg_lane, sg_size);
#else
    workgroupBarrier();
#endif
    for (var b = tid; b < {{ROW_VECS}}u / 8u; b += {{WG}}u) {
        let d = handoff_scales(b, 0u).y;
        xqd[b] = vec2<f32>(d, d * f32(half_sums[2u * b] + half_sums[2u * b + 1u]));
    }
    workgroupBarrier();
}
#endif

#if XQ8_OUT
@group(0) @binding(15) var<storage, read_write> handoff_out: array<u32>;
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
            quantize_out_block(first / OUT_BLOCK + b, OUT_BLOCK * b);
        }
    }
}

// Block b (of OUT_BLOCK values) from out_vals[at..]: its words, then each 16 values' (scale,
// sum of squares).
fn quantize_out_block(b: u32, at: u32) {
    var amax = 0.0;
    for (var i = 0u; i < OUT_BLOCK; i++) {
        amax = max(amax, abs(out_vals[at + i]));
    }
    let inv = select(0.0, 127.0 / amax, amax > 0.0);
    let d = amax / 127.0;
    for (var j = 0u; j < OUT_BLOCK / 4u; j++) {
        let v = vec4<f32>(out_vals[at + 4u * j], out_vals[at + 4u * j + 1u],
                          out_vals[at + 4u * j + 2u], out_vals[at + 4u * j + 3u]);
        handoff_out[OUT_BLOCK / 4u * b + j] = pack4xI8(vec4<i32>(round(v * inv)));
    }
    for (var h = 0u; h < OUT_BLOCK / 16u; h++) {
        var squares = 0.0;
        for (var i = 0u; i < 16u; i++) {
            squares += out_squares[at + 16u * h + i];
        }
        let stats = p.n / 4u + 2u * (OUT_BLOCK / 16u * b + h);
        handoff_out[stats] = bitcast<u32>(d);
        handoff_out[stats + 1u] = bitcast<u32>(squares);
    }
}
#endif
