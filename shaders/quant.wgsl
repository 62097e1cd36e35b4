// Dequantization of GGML block formats inside kernels. Weights keep their file's bits, repacked
// at load into two u32-aligned regions of one buffer: every block's payload (quants, and for
// the K formats their packed sub-block scales) as whole words, then the f16 block scales
// (d, and m or dmin where the format has one) at word `scales`. A row is a whole number of
// blocks, decoded in 32-element sub-blocks: `q_dot` (decode products) multiplies one with the
// inputs as it decodes, `q_pair` (prompt products) yields eight of its weights.
//
// Defines: one of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4, with Q5 also set for Q5_0/Q5_1
// and KQ for Q4_K/Q5_K; SUBS (sub-blocks per row);
// QDOT (the including kernel provides xin4, and gets q_dot: decode fused into the product,
// with no per-invocation array, which GPUs would keep in slow local memory).

@group(0) @binding(3) var<storage, read> qw: array<u32>;

fn nib_lo(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(w & 0xFu, (w >> 8u) & 0xFu, (w >> 16u) & 0xFu, (w >> 24u) & 0xFu));
}

fn nib_hi(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>((w >> 4u) & 0xFu, (w >> 12u) & 0xFu, (w >> 20u) & 0xFu, w >> 28u));
}

// The nibble at bit `shift` (0 or 4) of each byte of w.
fn nib_at(w: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(shift, shift + 8u, shift + 16u, shift + 24u)) & vec4<u32>(0xFu));
}

fn bytes_i8(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(
        i32(w << 24u) >> 24u, i32(w << 16u) >> 24u, i32(w << 8u) >> 24u, i32(w) >> 24u));
}

// Bit `shift + 8c` of w for c = 0..3.
fn bits4(w: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(
        (w >> shift) & 1u, (w >> (shift + 8u)) & 1u, (w >> (shift + 16u)) & 1u,
        (w >> (shift + 24u)) & 1u));
}

// Bits first .. first + 3 of w.
fn bit_run(w: u32, first: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(first, first + 1u, first + 2u, first + 3u)) & vec4<u32>(1u));
}

// The two bits at `shift` of each byte of w.
fn two_bits(w: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(shift, shift + 8u, shift + 16u, shift + 24u)) & vec4<u32>(3u));
}

// The doubled e2m1 values of the nibbles at bit `shift` (0 or 4) of each byte of w (MXFP4,
// ggml's `kvalues_mxfp4`): bit 3 the sign, bits 1-2 the exponent, bit 0 the mantissa.
fn e2m1_at(w: u32, shift: u32) -> vec4<f32> {
    let n = (vec4<u32>(w) >> vec4<u32>(shift, shift + 8u, shift + 16u, shift + 24u)) & vec4<u32>(0xFu);
    let e = (n >> vec4<u32>(1u)) & vec4<u32>(3u);
    let m = vec4<f32>(n & vec4<u32>(1u));
    let normal = vec4<f32>(vec4<u32>(1u) << e) * (1.0 + 0.5 * m);
    let mag = select(m, normal, e > vec4<u32>(0u));
    return select(mag, -mag, (n & vec4<u32>(8u)) != vec4<u32>(0u));
}

// Half the e8m0 scale of MXFP4 block `index` (its exponent bytes are packed four a word),
// 2^(e - 128) built from its bits as ggml does (subnormal below e = 2).
fn scale_e8m0(scales: u32, index: u32) -> f32 {
    return e8m0_half((qw[scales + index / 4u] >> (8u * (index % 4u))) & 0xFFu);
}

// Half of 2^(e - 127) for an e8m0 exponent byte e.
fn e8m0_half(e: u32) -> f32 {
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}

fn scale_half(scales: u32, index: u32) -> f32 {
    return unpack2x16float(qw[scales + index / 2u])[index % 2u];
}

// Byte k of the 12 packed 6-bit scales of a Q4_K/Q5_K block, held in three words.
fn k_scale_byte(w0: u32, w1: u32, w2: u32, k: u32) -> u32 {
    let word = select(select(w2, w1, k < 8u), w0, k < 4u);
    return (word >> (8u * (k % 4u))) & 0xFFu;
}

// (scale, min) of sub-block j of the Q4_K / Q5_K block whose payload starts at word `base`.
fn scale_min_k4(base: u32, j: u32) -> vec2<f32> {
    return scale_min_words(qw[base + 1u], qw[base + 2u], qw[base + 3u], j);
}

// The same from the block's three packed scale words.
fn scale_min_words(w0: u32, w1: u32, w2: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(k_scale_byte(w0, w1, w2, j) & 63u),
                         f32(k_scale_byte(w0, w1, w2, j + 4u) & 63u));
    }
    let hi = k_scale_byte(w0, w1, w2, j + 4u);
    let sc = (hi & 0xFu) | ((k_scale_byte(w0, w1, w2, j - 4u) >> 6u) << 4u);
    let m = (hi >> 4u) | ((k_scale_byte(w0, w1, w2, j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

// The decoding of one 32-weight sub-block `s` of row `row`, written once: every
// `EMIT(j; value);` line gives weights 4j..4j+3 as a vec4. The engine expands it into `q_dot`
// (decode products: multiplied with the inputs as they are decoded, using the including
// kernel's xin4), so that it keeps no per-invocation array, which GPUs would place in slow
// local memory; `q_store` (expansion to dense f16 for prompt products) and `q_gather`
// (embedding rows). `q_pair` (prompt-product tiles: eight weights at a time) decodes only the
// words it needs, so it is written out per format below.
struct QPair {
    a: vec4<f32>,
    b: vec4<f32>,
}

#if XQ8_VIEW
// The blocks as 16-byte words (the same buffer), for whole-block loads: Q8_0 blocks are two
// such words, Q4_0 / Q4_1 payloads one; Q6_K blocks (208 bytes) start on one.
@group(0) @binding(11) var<storage, read> qw4: array<vec4<u32>>;
#endif

#if KQ
// Q4_K: 144-byte blocks = 36 words: d|dmin, 12 scale bytes, 128 quant bytes.
// Q5_K: 176-byte blocks = 44 words: the same with 32 high-bit bytes before the quants.
#if Q5_K
const K_WORDS: u32 = 44u;
const K_QUANTS: u32 = 12u;
#else
const K_WORDS: u32 = 36u;
const K_QUANTS: u32 = 4u;
#endif

// The blocks again, as 16-byte words (the same buffer): K-quant blocks are 144 or 176 bytes,
// so every block, and its quants, start on such a word.
@group(0) @binding(11) var<storage, read> qw4: array<vec4<u32>>;

// Sub-blocks 2·sp and 2·sp + 1 of a Q4_K / Q5_K row share their 32 quant bytes (low and high
// nibbles): one invocation decodes both from whole-word loads (header, quants, and for Q5_K
// the high bits) — q_dot_pairs for decode products; q_word decodes one 16-byte word of a
// pair for the f16 expansion.
struct KPair {
    // Per sub-block (x: 2·sp, y: 2·sp + 1): weight = scale · q - shift.
    scale: vec2<f32>,
    shift: vec2<f32>,
    pair: u32,
    q: array<u32, 8>,
    // Q5_K's fifth bits (zero for Q4_K).
    h: array<u32, 8>,
}

// The words of sub-block pair `sp` of row `row` as loaded: decoding them waits for the loads,
// so kernels that request the next weights before using the current ones keep the two apart.
struct KPairWords {
    head: vec4<u32>,
    qa: vec4<u32>,
    qb: vec4<u32>,
    ha: vec4<u32>,
    hb: vec4<u32>,
    pair: u32,
}

fn k_pair_words(row: u32, sp: u32) -> KPairWords {
    let base = (row * ({{SUBS}}u / 8u) + sp / 4u) * K_WORDS;
    let pair = sp % 4u;
#if Q5_K
    let ha = qw4[base / 4u + 1u];
    let hb = qw4[base / 4u + 2u];
#else
    let ha = vec4<u32>(0u);
    let hb = vec4<u32>(0u);
#endif
    return KPairWords(qw4[base / 4u], qw4[(base + K_QUANTS) / 4u + 2u * pair],
                      qw4[(base + K_QUANTS) / 4u + 2u * pair + 1u], ha, hb, pair);
}

fn k_pair_of(w: KPairWords) -> KPair {
    let dd = unpack2x16float(w.head.x);
    let sm_lo = scale_min_words(w.head.y, w.head.z, w.head.w, 2u * w.pair);
    let sm_hi = scale_min_words(w.head.y, w.head.z, w.head.w, 2u * w.pair + 1u);
    return KPair(
        dd.x * vec2<f32>(sm_lo.x, sm_hi.x),
        dd.y * vec2<f32>(sm_lo.y, sm_hi.y),
        w.pair,
        array<u32, 8>(w.qa.x, w.qa.y, w.qa.z, w.qa.w, w.qb.x, w.qb.y, w.qb.z, w.qb.w),
        array<u32, 8>(w.ha.x, w.ha.y, w.ha.z, w.ha.w, w.hb.x, w.hb.y, w.hb.z, w.hb.w));
}

fn k_pair(row: u32, sp: u32) -> KPair {
    return k_pair_of(k_pair_words(row, sp));
}

// The quants (before scale and shift) in word `q` of the pair's bytes, for sub-block
// 2·sp + half (`h`: the matching word of Q5_K's fifth bits). Callers pass the words by
// constant index: a runtime index into a by-value array would go through local memory.
fn k_quants(q: u32, h: u32, pair: u32, half: u32) -> vec4<f32> {
#if Q5_K
    return nib_at(q, 4u * half) + 16.0 * bits4(h, 2u * pair + half);
#else
    return nib_at(q, 4u * half);
#endif
}
#endif

#if QSTORE
#if KQ
// Word t (0..7) of the f16 expansion of sub-blocks 2·sp and 2·sp + 1 of row `row`: weights
// 4j..4j+7 (j = 2·(t % 4)) of sub-block 2·sp + t / 4, eight halves to a 16-byte word.
fn q_word(row: u32, sp: u32, t: u32) -> vec4<u32> {
    let half = t / 4u;
    let j = t % 4u;
    let base = (row * ({{SUBS}}u / 8u) + sp / 4u) * K_WORDS;
    let pair = sp % 4u;
    let head = qw4[base / 4u];
    let dd = unpack2x16float(head.x);
    let sm = scale_min_words(head.y, head.z, head.w, 2u * pair + half);
    let scale = dd.x * sm.x;
    let shift = dd.y * sm.y;
    let qv = qw4[(base + K_QUANTS) / 4u + 2u * pair + j / 2u];
    let odd = j % 2u == 1u;
    let q0 = select(qv.x, qv.z, odd);
    let q1 = select(qv.y, qv.w, odd);
#if Q5_K
    let hv = qw4[base / 4u + 1u + j / 2u];
    let h0 = select(hv.x, hv.z, odd);
    let h1 = select(hv.y, hv.w, odd);
#else
    let h0 = 0u;
    let h1 = 0u;
#endif
    let a = scale * k_quants(q0, h0, pair, half) - shift;
    let b = scale * k_quants(q1, h1, pair, half) - shift;
    return vec4<u32>(
        pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy), pack2x16float(b.zw));
}
#else
// Writes the 32 weights of sub-block `s` of row `row` as f16 pairs from word `out` of the
// including kernel's workgroup array `staged`.
fn q_store(row: u32, s: u32, scales: u32, out: u32) {
Q_DECODE_STORE
}
#endif
#else
#if QGATHER
// Writes the 32 weights of sub-block `s` of row `row` as f32 from element `out` of `x`.
fn q_gather(row: u32, s: u32, scales: u32, out: u32) {
Q_DECODE_GATHER
}
#else
#if QDOT
fn q_dot(row: u32, s: u32, scales: u32, xbase: u32) -> f32 {
    var acc = 0.0;
Q_DECODE_DOT
    return acc;
}
#if KPAIR
// Sub-blocks 2·sp and 2·sp + 1 of NR rows (first, first + ROW_STEP, …, clamped to `last`)
// against the inputs: each input is read once for all rows, and each sub-block's scale and
// min are applied once to its sums rather than to every weight. Row r's dot is component r.
fn q_dot_pairs(first: u32, last: u32, sp: u32, xbase: u32) -> vec4<f32> {
#for r in 0..NR
    let kp{{r}} = k_pair(min(first + {{r}}u * ROW_STEP, last), sp);
    var dots{{r}} = vec2<f32>(0.0);
#endfor
    let x0 = 64u * sp;
    var sums = vec2<f32>(0.0);
#for j in 0..8
    {
        let x_lo = xin4(xbase, x0 + 4u * {{j}}u);
        let x_hi = xin4(xbase, x0 + 32u + 4u * {{j}}u);
        sums += vec2<f32>(dot(x_lo, vec4<f32>(1.0)), dot(x_hi, vec4<f32>(1.0)));
#for r in 0..NR
        dots{{r}} += vec2<f32>(dot(k_quants(kp{{r}}.q[{{j}}], kp{{r}}.h[{{j}}], kp{{r}}.pair, 0u), x_lo),
                             dot(k_quants(kp{{r}}.q[{{j}}], kp{{r}}.h[{{j}}], kp{{r}}.pair, 1u), x_hi));
#endfor
    }
#endfor
    var out = vec4<f32>(0.0);
#for r in 0..NR
    out[{{r}}] = dot(kp{{r}}.scale, dots{{r}}) - dot(kp{{r}}.shift, sums);
#endfor
    return out;
}
#endif
#if XQ8
// The same products against the input quantized to int8 in 32-value blocks (xq, xqd: staged by
// matvec.wgsl): four weight integers times four input integers per packed dot product, the
// block scales applied once per sub-block. This replaces most of the per-weight conversions and
// multiplies, which bound the float path on block formats; xqd[b].y is the block's dequantized
// sum, so the whole product equals W·x̃ with x̃ the int8 input, offsets and mins included.
const NIBBLES: u32 = 0x0F0F0F0Fu;

#if KPAIR
// A unit of an int8 product is a sub-block pair (see k_pair).
alias QFetch = KPairWords;

fn q_fetch8(row: u32, sp: u32, scales: u32) -> QFetch {
    return k_pair_words(row, sp);
}

// Sub-blocks 2·sp and 2·sp + 1 of one row, from its loaded words.
fn q_dot8_fetched(words: QFetch, sp: u32, level: u32) -> f32 {
    let kp = k_pair_of(words);
    let x_lo = xqd_at(level, 2u * sp);
    let x_hi = xqd_at(level, 2u * sp + 1u);
    var lo = 0;
    var hi = 0;
#for j in 0..8
    lo += dot4I8Packed(k_quants8(kp.q[{{j}}], kp.h[{{j}}], kp.pair, 0u), xq[xq_at(level, 16u * sp + {{j}}u)]);
    hi += dot4I8Packed(k_quants8(kp.q[{{j}}], kp.h[{{j}}], kp.pair, 1u), xq[xq_at(level, 16u * sp + 8u + {{j}}u)]);
#endfor
    return kp.scale.x * x_lo.x * f32(lo) + kp.scale.y * x_hi.x * f32(hi)
        - (kp.shift.x * x_lo.y + kp.shift.y * x_hi.y);
}

// Four quants of k_quants as packed bytes (0..31).
fn k_quants8(q: u32, h: u32, pair: u32, half: u32) -> u32 {
#if Q5_K
    return ((q >> (4u * half)) & NIBBLES) | (((h >> (2u * pair + half)) & 0x01010101u) << 4u);
#else
    return (q >> (4u * half)) & NIBBLES;
#endif
}
#else
// The words one sub-block's product needs, as loaded: quant words (w0..w3), the word holding
// its f16 scale (sw), Q6_K's word of 8-bit sub-scales (xw), and the block the scale belongs to.
struct QWords8 {
    w0: vec4<u32>,
    w1: vec4<u32>,
    w2: vec4<u32>,
    w3: vec4<u32>,
    sw: u32,
    xw: u32,
    block: u32,
}

alias QFetch = QWords8;

// Loads sub-block s of row `row`; q_dot8_fetched decodes it.
fn q_fetch8(row: u32, s: u32, scales: u32) -> QFetch {
    var f = QWords8(vec4<u32>(0u), vec4<u32>(0u), vec4<u32>(0u), vec4<u32>(0u), 0u, 0u, 0u);
    let blk = row * {{SUBS}}u + s;
#if Q6_K
    let blk6 = row * ({{SUBS}}u / 8u) + s / 8u;
    let base = blk6 * 52u;
    let sub = s % 8u;
    let half_ = sub / 4u;
    let part = sub % 4u;
    let ql = (base + 16u * half_ + 8u * (part % 2u)) / 4u;
    let qh = (base + 32u + 8u * half_) / 4u;
    f.w0 = qw4[ql];
    f.w1 = qw4[ql + 1u];
    f.w2 = qw4[qh];
    f.w3 = qw4[qh + 1u];
    // The sub-block's two scale bytes: an even index, so both sit in one word.
    f.xw = qw[base + 48u + (8u * half_ + 2u * part) / 4u];
    f.sw = qw[scales + blk6 / 2u];
    f.block = blk6;
#endif
#if Q8_0
    f.w0 = qw4[2u * blk];
    f.w1 = qw4[2u * blk + 1u];
    f.sw = qw[scales + blk / 2u];
    f.block = blk;
#endif
#if Q4_0
    f.w0 = qw4[blk];
    f.sw = qw[scales + blk / 2u];
    f.block = blk;
#endif
#if Q4_1
    f.w0 = qw4[blk];
    f.sw = qw[scales + blk];
#endif
#if MXFP4
    f.w0 = qw4[blk];
    f.sw = qw[scales + blk / 4u];
    f.block = blk;
#endif
    return f;
}

// Sub-block s against the int8 input, from its loaded words.
fn q_dot8_fetched(f: QFetch, s: u32, level: u32) -> f32 {
    let xd = xqd_at(level, s);
#if Q6_K
    // As the float template: low nibbles, two high bits, a signed scale per 16 values.
    let sub = s % 8u;
    let part = sub % 4u;
    let nshift = select(4u, 0u, part < 2u);
    let hshift = 2u * part;
    let ia = dot4I8Packed(q6_bytes(f.w0.x, f.w2.x, nshift, hshift), xq[xq_at(level, 8u * s)])
        + dot4I8Packed(q6_bytes(f.w0.y, f.w2.y, nshift, hshift), xq[xq_at(level, 8u * s + 1u)])
        + dot4I8Packed(q6_bytes(f.w0.z, f.w2.z, nshift, hshift), xq[xq_at(level, 8u * s + 2u)])
        + dot4I8Packed(q6_bytes(f.w0.w, f.w2.w, nshift, hshift), xq[xq_at(level, 8u * s + 3u)]);
    let ib = dot4I8Packed(q6_bytes(f.w1.x, f.w3.x, nshift, hshift), xq[xq_at(level, 8u * s + 4u)])
        + dot4I8Packed(q6_bytes(f.w1.y, f.w3.y, nshift, hshift), xq[xq_at(level, 8u * s + 5u)])
        + dot4I8Packed(q6_bytes(f.w1.z, f.w3.z, nshift, hshift), xq[xq_at(level, 8u * s + 6u)])
        + dot4I8Packed(q6_bytes(f.w1.w, f.w3.w, nshift, hshift), xq[xq_at(level, 8u * s + 7u)]);
    let sc_index = 8u * (sub / 4u) + 2u * part;
    let sa = f32(i32(f.xw << (24u - 8u * (sc_index % 4u))) >> 24u);
    let sb = f32(i32(f.xw << (16u - 8u * (sc_index % 4u))) >> 24u);
    return unpack2x16float(f.sw)[f.block % 2u] * xd.x * (sa * f32(ia) + sb * f32(ib));
#endif
#if Q8_0
    let i = dot4I8Packed(f.w0.x, xq[xq_at(level, 8u * s)]) + dot4I8Packed(f.w0.y, xq[xq_at(level, 8u * s + 1u)])
        + dot4I8Packed(f.w0.z, xq[xq_at(level, 8u * s + 2u)]) + dot4I8Packed(f.w0.w, xq[xq_at(level, 8u * s + 3u)])
        + dot4I8Packed(f.w1.x, xq[xq_at(level, 8u * s + 4u)]) + dot4I8Packed(f.w1.y, xq[xq_at(level, 8u * s + 5u)])
        + dot4I8Packed(f.w1.z, xq[xq_at(level, 8u * s + 6u)]) + dot4I8Packed(f.w1.w, xq[xq_at(level, 8u * s + 7u)]);
    return unpack2x16float(f.sw)[f.block % 2u] * xd.x * f32(i);
#endif
#if Q4_0
    let d = unpack2x16float(f.sw)[f.block % 2u];
    return d * (xd.x * f32(nibble_dot8(f.w0, s, level)) - 8.0 * xd.y);
#endif
#if Q4_1
    let dm = unpack2x16float(f.sw);
    return dm.x * xd.x * f32(nibble_dot8(f.w0, s, level)) + dm.y * xd.y;
#endif
#if MXFP4
    let d = e8m0_half((f.sw >> (8u * (f.block % 4u))) & 0xFFu);
    return d * xd.x * f32(e2m1_dot8(f.w0, s, level));
#endif
}
#endif

// A unit against every level of the int8 input (each product is linear in the input).
fn q_dot8_levels(f: QFetch, unit: u32) -> f32 {
#if XQ8_FINE
#if MXFP4
    return e2m1_dot8_levels(f, unit);
#else
    return q_dot8_fetched(f, unit, 0u) + q_dot8_fetched(f, unit, 1u);
#endif
#else
    return q_dot8_fetched(f, unit, 0u);
#endif
}

// Unit `unit` (a sub-block, or a sub-block pair) of row `row` against the int8 input.
fn q_dot8(row: u32, unit: u32, scales: u32) -> f32 {
    return q_dot8_levels(q_fetch8(row, unit, scales), unit);
}

// Four Q6_K quants minus 32, as packed i8: the nibbles at `nshift` of `lo`, the two bits at
// `hshift` of `hi` above them. For q < 32, q - 32 is q with bits 5..7 set; otherwise q with
// bit 5 cleared.
fn q6_bytes(lo: u32, hi: u32, nshift: u32, hshift: u32) -> u32 {
    let q = ((lo >> nshift) & NIBBLES) | (((hi >> hshift) & 0x03030303u) << 4u);
    let high = (q >> 5u) & 0x01010101u;
    return (q & 0x1F1F1F1Fu) | ((high ^ 0x01010101u) * 0xE0u);
}

// Four e2m1 codes (one in each byte's low nibble) as packed i8 of their doubled values
// (0, 1, 2, 3, 4, 6, 8, 12 and negatives), computed in all four bytes at once: a magnitude code
// m with bit 2 set gains m & 3, and m = 7 two more; negative bytes are negated as 0x100 - v,
// which borrows nothing since -0 (code 8) stays 0.
fn e2m1_i8(q: u32) -> u32 {
    let b2 = (q >> 2u) & 0x01010101u;
    let mag = (q & 0x07070707u) + (q & 0x03030303u & (b2 * 3u)) + ((q & (q >> 1u) & b2) << 1u);
    let nonzero = ((mag + 0x7F7F7F7Fu) >> 7u) & 0x01010101u;
    let neg = (q >> 3u) & nonzero;
    return (mag ^ (neg * 0xFFu)) + neg;
}

// The 16 bytes of an MXFP4 block against the input's sub-block s (laid out as Q4_0's).
fn e2m1_dot8(w: vec4<u32>, s: u32, level: u32) -> i32 {
    return dot4I8Packed(e2m1_i8(w.x & NIBBLES), xq[xq_at(level, 8u * s)])
        + dot4I8Packed(e2m1_i8(w.y & NIBBLES), xq[xq_at(level, 8u * s + 1u)])
        + dot4I8Packed(e2m1_i8(w.z & NIBBLES), xq[xq_at(level, 8u * s + 2u)])
        + dot4I8Packed(e2m1_i8(w.w & NIBBLES), xq[xq_at(level, 8u * s + 3u)])
        + dot4I8Packed(e2m1_i8((w.x >> 4u) & NIBBLES), xq[xq_at(level, 8u * s + 4u)])
        + dot4I8Packed(e2m1_i8((w.y >> 4u) & NIBBLES), xq[xq_at(level, 8u * s + 5u)])
        + dot4I8Packed(e2m1_i8((w.z >> 4u) & NIBBLES), xq[xq_at(level, 8u * s + 6u)])
        + dot4I8Packed(e2m1_i8((w.w >> 4u) & NIBBLES), xq[xq_at(level, 8u * s + 7u)]);
}

#if XQ8_FINE
#if MXFP4
// An MXFP4 block against both levels of the input's sub-block s, each code converted once.
fn e2m1_dot8_levels(f: QFetch, s: u32) -> f32 {
    var coarse = 0;
    var fine = 0;
#for j in 0..8
    {
        let codes = e2m1_i8((f.w0[{{j}}u % 4u] >> (4u * ({{j}}u / 4u))) & NIBBLES);
        coarse += dot4I8Packed(codes, xq[xq_at(0u, 8u * s + {{j}}u)]);
        fine += dot4I8Packed(codes, xq[xq_at(1u, 8u * s + {{j}}u)]);
    }
#endfor
    let d = e8m0_half((f.sw >> (8u * (f.block % 4u))) & 0xFFu);
    return d * (xqd_at(0u, s).x * f32(coarse) + xqd_at(1u, s).x * f32(fine));
}
#endif
#endif

// The 16 bytes of a Q4_0 / Q4_1 sub-block against the input's sub-block s: byte j holds
// value j in its low nibble and value j + 16 in its high one.
fn nibble_dot8(w: vec4<u32>, s: u32, level: u32) -> i32 {
    return dot4I8Packed(w.x & NIBBLES, xq[xq_at(level, 8u * s)])
        + dot4I8Packed(w.y & NIBBLES, xq[xq_at(level, 8u * s + 1u)])
        + dot4I8Packed(w.z & NIBBLES, xq[xq_at(level, 8u * s + 2u)])
        + dot4I8Packed(w.w & NIBBLES, xq[xq_at(level, 8u * s + 3u)])
        + dot4I8Packed((w.x >> 4u) & NIBBLES, xq[xq_at(level, 8u * s + 4u)])
        + dot4I8Packed((w.y >> 4u) & NIBBLES, xq[xq_at(level, 8u * s + 5u)])
        + dot4I8Packed((w.z >> 4u) & NIBBLES, xq[xq_at(level, 8u * s + 6u)])
        + dot4I8Packed((w.w >> 4u) & NIBBLES, xq[xq_at(level, 8u * s + 7u)]);
}
#endif
#else
// Weights 4·j0 .. 4·j0 + 7 (j0 even) of sub-block `s` of row `row`, loading only the words
// that hold them: the template's form would decode the whole sub-block for every eight.
fn q_pair(row: u32, s: u32, scales: u32, j0: u32) -> QPair {
    return q_pair_from(q_pair_raw(row, s, scales, j0), row, s, j0);
}

// The words that q_pair's eight weights decode from, loaded and not yet used: a tile loads
// the next k step's words before the current step's products and decodes them after
// (q_pair_from), so that the loads' latency passes under the products.
struct QRaw {
    a: vec4<u32>,
    b: vec4<u32>,
}

fn q_pair_raw(row: u32, s: u32, scales: u32, j0: u32) -> QRaw {
    var r = QRaw(vec4<u32>(0u), vec4<u32>(0u));
#if MXFP4
    let blk = row * {{SUBS}}u + s;
    let at = blk * 4u + j0 % 4u;
    r.a = vec4<u32>(qw[scales + blk / 4u], qw[at], qw[at + 1u], 0u);
#endif
#if Q8_0
    let blk = row * {{SUBS}}u + s;
    r.a = vec4<u32>(qw[scales + blk / 2u], qw[blk * 8u + j0], qw[blk * 8u + j0 + 1u], 0u);
#endif
#if Q4_0
    let blk = row * {{SUBS}}u + s;
    let at = blk * 4u + j0 % 4u;
    r.a = vec4<u32>(qw[scales + blk / 2u], qw[at], qw[at + 1u], 0u);
#endif
#if Q4_1
    // d and m are halves 2·blk and 2·blk + 1: one word.
    let blk = row * {{SUBS}}u + s;
    let at = blk * 4u + j0 % 4u;
    r.a = vec4<u32>(qw[scales + blk], qw[at], qw[at + 1u], 0u);
#endif
#if Q5
    let blk = row * {{SUBS}}u + s;
    let at = blk * 5u + j0 % 4u;
#if Q5_1
    let scale_word = qw[scales + blk];
#else
    let scale_word = qw[scales + blk / 2u];
#endif
    r.a = vec4<u32>(scale_word, qw[blk * 5u + 4u], qw[at], qw[at + 1u]);
#endif
#if KQ
    let base = (row * ({{SUBS}}u / 8u) + s / 8u) * K_WORDS;
    let sub = s % 8u;
    let at = base + K_QUANTS + 8u * (sub / 2u) + j0;
    r.a = vec4<u32>(qw[base], qw[base + 1u], qw[base + 2u], qw[base + 3u]);
#if Q5_K
    r.b = vec4<u32>(qw[at], qw[at + 1u], qw[base + 4u + j0], qw[base + 5u + j0]);
#else
    r.b = vec4<u32>(qw[at], qw[at + 1u], 0u, 0u);
#endif
#endif
#if Q6_K
    // 208 payload bytes = 52 words: 128 low-nibble bytes, 64 high-bit bytes, 16 i8 scales
    // (one per 16 weights: j0 and j0 + 1 share one).
    let blk = row * ({{SUBS}}u / 8u) + s / 8u;
    let base = blk * 52u;
    let sub = s % 8u;
    let half_ = sub / 4u;
    let part = sub % 4u;
    let ql = base + 16u * half_ + 8u * (part % 2u) + j0;
    let qh = base + 32u + 8u * half_ + j0;
    let sc_index = 8u * half_ + 2u * part + j0 / 4u;
    r.a = vec4<u32>(qw[ql], qw[ql + 1u], qw[qh], qw[qh + 1u]);
    r.b = vec4<u32>(qw[base + 48u + sc_index / 4u], qw[scales + blk / 2u], 0u, 0u);
#endif
    return r;
}

// The eight weights of q_pair_raw's words (the same row, s and j0).
fn q_pair_from(r: QRaw, row: u32, s: u32, j0: u32) -> QPair {
#if MXFP4
    // As Q4_0: weights 0..15 in the low nibbles, 16..31 in the high ones.
    let blk = row * {{SUBS}}u + s;
    let d = e8m0_half((r.a.x >> (8u * (blk % 4u))) & 0xFFu);
    let shift = 4u * (j0 / 4u);
    return QPair(e2m1_at(r.a.y, shift) * d, e2m1_at(r.a.z, shift) * d);
#endif
#if Q8_0
    let d = unpack2x16float(r.a.x)[(row * {{SUBS}}u + s) % 2u];
    return QPair(bytes_i8(r.a.y) * d, bytes_i8(r.a.z) * d);
#endif
#if Q4_0
    // Weights 0..15 are the low nibbles of the sub-block's bytes, 16..31 the high ones.
    let d = unpack2x16float(r.a.x)[(row * {{SUBS}}u + s) % 2u];
    let shift = 4u * (j0 / 4u);
    return QPair((nib_at(r.a.y, shift) - 8.0) * d, (nib_at(r.a.z, shift) - 8.0) * d);
#endif
#if Q4_1
    let dm = unpack2x16float(r.a.x);
    let shift = 4u * (j0 / 4u);
    return QPair(nib_at(r.a.y, shift) * dm.x + dm.y, nib_at(r.a.z, shift) * dm.x + dm.y);
#endif
#if Q5
    // As Q4_0 / Q4_1, and weight e takes bit e of qh as its fifth bit.
#if Q5_1
    let dm = unpack2x16float(r.a.x);
    let d = dm.x;
    let m = dm.y;
#else
    let d = unpack2x16float(r.a.x)[(row * {{SUBS}}u + s) % 2u];
    let m = -16.0 * d;
#endif
    let shift = 4u * (j0 / 4u);
    let qa = nib_at(r.a.z, shift) + 16.0 * bit_run(r.a.y, 4u * j0);
    let qb = nib_at(r.a.w, shift) + 16.0 * bit_run(r.a.y, 4u * j0 + 4u);
    return QPair(qa * d + m, qb * d + m);
#endif
#if KQ
    let sub = s % 8u;
    let dd = unpack2x16float(r.a.x);
    let sm = scale_min_words(r.a.y, r.a.z, r.a.w, sub);
    let scale = dd.x * sm.x;
    let shift = dd.y * sm.y;
    // Even sub-blocks are the low nibbles of their 32 bytes, odd ones the high nibbles.
    let nshift = 4u * (sub % 2u);
#if Q5_K
    let qa = nib_at(r.b.x, nshift) + 16.0 * bits4(r.b.z, sub);
    let qb = nib_at(r.b.y, nshift) + 16.0 * bits4(r.b.w, sub);
#else
    let qa = nib_at(r.b.x, nshift);
    let qb = nib_at(r.b.y, nshift);
#endif
    return QPair(scale * qa - shift, scale * qb - shift);
#endif
#if Q6_K
    let blk = row * ({{SUBS}}u / 8u) + s / 8u;
    let sub = s % 8u;
    let part = sub % 4u;
    let nshift = select(4u, 0u, part < 2u);
    let sc_index = 8u * (sub / 4u) + 2u * part + j0 / 4u;
    let scale = unpack2x16float(r.b.y)[blk % 2u]
        * f32(i32(r.b.x << (24u - 8u * (sc_index % 4u))) >> 24u);
    let qa = nib_at(r.a.x, nshift) + 16.0 * two_bits(r.a.z, 2u * part);
    let qb = nib_at(r.a.y, nshift) + 16.0 * two_bits(r.a.w, 2u * part);
    return QPair(scale * (qa - 32.0), scale * (qb - 32.0));
#endif
}
#endif
#endif
#endif

// Template of the sub-block decoding (see above).
/*Q_DECODE_BEGIN
#if MXFP4
    let blk = row * {{SUBS}}u + s;
    let d = scale_e8m0(scales, blk);
    for (var j = 0u; j < 4u; j++) {
        let w = qw[blk * 4u + j];
        EMIT(j; e2m1_at(w, 0u) * d);
        EMIT(j + 4u; e2m1_at(w, 4u) * d);
    }
#endif
#if Q8_0
    let blk = row * {{SUBS}}u + s;
    let d = scale_half(scales, blk);
    for (var j = 0u; j < 8u; j++) {
        EMIT(j; bytes_i8(qw[blk * 8u + j]) * d);
    }
#endif
#if Q4_0
    let blk = row * {{SUBS}}u + s;
    let d = scale_half(scales, blk);
    for (var j = 0u; j < 4u; j++) {
        let w = qw[blk * 4u + j];
        EMIT(j; (nib_lo(w) - 8.0) * d);
        EMIT(j + 4u; (nib_hi(w) - 8.0) * d);
    }
#endif
#if Q4_1
    let blk = row * {{SUBS}}u + s;
    let d = scale_half(scales, 2u * blk);
    let m = scale_half(scales, 2u * blk + 1u);
    for (var j = 0u; j < 4u; j++) {
        let w = qw[blk * 4u + j];
        EMIT(j; nib_lo(w) * d + m);
        EMIT(j + 4u; nib_hi(w) * d + m);
    }
#endif
#if Q5
    // Q5_0: (q - 16)·d; Q5_1: q·d + m. Element e takes bit e of qh as its fifth bit.
    let blk = row * {{SUBS}}u + s;
#if Q5_1
    let d = scale_half(scales, 2u * blk);
    let m = scale_half(scales, 2u * blk + 1u);
#else
    let d = scale_half(scales, blk);
    let m = -16.0 * d;
#endif
    let qh = qw[blk * 5u + 4u];
    for (var j = 0u; j < 4u; j++) {
        let w = qw[blk * 5u + j];
        let h_lo = vec4<f32>(vec4<u32>((qh >> (4u * j)) & 1u, (qh >> (4u * j + 1u)) & 1u,
                                      (qh >> (4u * j + 2u)) & 1u, (qh >> (4u * j + 3u)) & 1u));
        let h_hi = vec4<f32>(vec4<u32>((qh >> (16u + 4u * j)) & 1u, (qh >> (17u + 4u * j)) & 1u,
                                      (qh >> (18u + 4u * j)) & 1u, (qh >> (19u + 4u * j)) & 1u));
        EMIT(j; (nib_lo(w) + 16.0 * h_lo) * d + m);
        EMIT(j + 4u; (nib_hi(w) + 16.0 * h_hi) * d + m);
    }
#endif
#if KQ
    let words = K_WORDS;
    let quants = K_QUANTS;
    let base = (row * ({{SUBS}}u / 8u) + s / 8u) * words;
    let sub = s % 8u;
    let dd = unpack2x16float(qw[base]);
    let sm = scale_min_k4(base, sub);
    let scale = dd.x * sm.x;
    let shift = dd.y * sm.y;
    let qs = base + quants + 8u * (sub / 2u);
    // Even sub-blocks are the low nibbles of their 32 bytes, odd ones the high nibbles.
    let nshift = 4u * (sub % 2u);
    for (var j = 0u; j < 8u; j++) {
        let w = qw[qs + j];
#if Q5_K
        let q = nib_at(w, nshift) + 16.0 * bits4(qw[base + 4u + j], sub);
#else
        let q = nib_at(w, nshift);
#endif
        EMIT(j; scale * q - shift);
    }
#endif
#if Q6_K
    // 208 payload bytes = 52 words: 128 low-nibble bytes, 64 high-bit bytes, 16 i8 scales.
    let blk = row * ({{SUBS}}u / 8u) + s / 8u;
    let base = blk * 52u;
    let sub = s % 8u;
    let half_ = sub / 4u;
    let part = sub % 4u;
    let d = scale_half(scales, blk);
    let ql = base + 16u * half_ + 8u * (part % 2u);
    let qh = base + 32u + 8u * half_;
    for (var j = 0u; j < 8u; j++) {
        let lo = nib_at(qw[ql + j], select(4u, 0u, part < 2u));
        let h = qw[qh + j];
        let shift = 2u * part;
        let hi = vec4<f32>(vec4<u32>((h >> shift) & 3u, (h >> (shift + 8u)) & 3u,
                                     (h >> (shift + 16u)) & 3u, (h >> (shift + 24u)) & 3u));
        // Scales: one i8 per 16 elements.
        let sc_index = 8u * half_ + 2u * part + j / 4u;
        let sc_word = qw[base + 48u + sc_index / 4u];
        let sc = f32(i32(sc_word << (24u - 8u * (sc_index % 4u))) >> 24u);
        EMIT(j; (d * sc) * (lo + 16.0 * hi - 32.0));
    }
#endif
Q_DECODE_END*/
