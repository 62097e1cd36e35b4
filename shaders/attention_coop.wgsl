enable f16;
enable wgpu_cooperative_matrix;

// Attention over a prompt on tensor cores (cooperative matrices), appended to attention.wgsl
// (whose bindings, cache readers and masks it uses, causal or FULL). A workgroup of
// SUBGROUPS subgroups of 32 takes FQ = 16·SUBGROUPS queries of one head, 16 per subgroup, and
// walks the keys in blocks of FK with an online softmax:
// - the block's keys and values are staged in workgroup memory as f16 (loaded into registers
//   while the previous block is multiplied);
// - each subgroup multiplies its queries (f16, pre-scaled, held in fragments) by the keys into
//   16×FK f32 scores, which it stores to workgroup memory;
// - two lanes per query read its scores as vec4s (alternate quads each, so that the eight
//   lanes of a 16-byte access phase touch eight different bank groups), mask them, keep the
//   running max and sum (combined by a shuffle) and write the probabilities back as f16;
// - the probabilities times the values are added to the block's 16×HD outputs, which stay in
//   fragments (f32) for the whole walk. A row's reference max moves only when a block's max
//   passes it by more than RESCALE_MARGIN; then (rarely after the first block) every subgroup
//   passes its outputs through workgroup memory once to rescale them. The probabilities stay
//   below e^RESCALE_MARGIN, well inside f16. Outputs pass through workgroup memory in PASSES
//   slices of the head.
// Scalar reads with both lanes of a query in one bank cost four times the accesses: on an
// H200, Whisper large-v3-turbo's encoder attention took 11.1 ms that way.
// Heads wider than 128 (Gemma 3's and Qwen3.5's 256) hold their queries and outputs in 3·HD/16
// fragments, which leave no registers for the next block's keys and values: they load each
// block right before staging it (PREFETCH off).
// Defines: those of attention.wgsl, HD (a multiple of 16 up to 64, or of 32 up to 256),
// SUBGROUPS, FQ, FK, KF = FK / 16, DF = HD / 16 (fragments across a head), PASSES, DFP = DF /
// PASSES (fragments of one pass), OQP = 2·DFP (output quads each lane takes in a pass), LDS4
// (score and output rows in vec4s), KVQ = FK·HD / (8·FQ) (quads of a block's keys and of its
// values each invocation stages), SQ = FK / 8 (score quads each lane takes), KV_WORDS (an f16
// or q8_0 cache, or HALVES rows, kept as their own words until staged), QROWS, PREFETCH.

const FQ: u32 = {{FQ}}u;
const FK: u32 = {{FK}}u;
const FLASH_THREADS: u32 = {{FQ}}u * 2u;
// Staged rows of HD + 8 halves in units of four (whole 16-byte words for the fragment loads,
// and consecutive rows in different memory banks).
const LDH: u32 = {{HD}}u / 4u + 2u;
// Probability rows of FK + 8 halves, in units of four.
const LDP: u32 = FK / 4u + 2u;
// How far past a row's reference max a block's max may go before the outputs are rescaled.
const RESCALE_MARGIN: f32 = 8.0;
// Score and output rows (f32, in vec4s): FK scores or a pass's outputs (at most 64), padded
// by 8 so that the rows of four queries start in different bank groups (by 4 for heads wider
// than 128, whose staged keys and values leave no room for more).
const LDS4: u32 = {{LDS4}}u;
// Where the values start in `kv_tile`.
const V_AT: u32 = FK * LDH;

// The queries (first, all FQ rows, unless read straight), then each block's keys and its
// values, [key][dim].
var<workgroup> kv_tile: array<vec4<f16>, 2u * FK * LDH>;
// Per subgroup: 16 rows of scores, or of outputs being rescaled or written.
var<workgroup> fs: array<vec4<f32>, FQ * LDS4>;
// Per subgroup: 16 rows of probabilities.
var<workgroup> fp: array<vec4<f16>, FQ * LDP>;
// Per subgroup: whether a row's reference max moved in this block.
var<workgroup> moved: array<u32, {{SUBGROUPS}}>;

fn to_half(v: vec4<f32>) -> vec4<f16> {
    // Saturate rather than overflow to infinity.
    return vec4<f16>(clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0)));
}

#if QROWS
// QROWS (FULL with HALVES, at least FQ queries): the queries as f16 values (the buffer bound
// as `q`), read straight into fragments.
@group(0) @binding(12) var<storage, read> q_halves: array<vec4<f16>>;
#endif

// Where query `row`'s head vector starts in q.
fn query_at(row: u32, head: u32) -> u32 {
#if FULL
    return row * p.q_stride + head * {{HD}}u;
#else
    return (row * p.heads + head) * {{HD}}u;
#endif
}

// What fetch_kv loads of a quad (KvLoad) and keeps until stage_kv stages it as f16 (KvKept).
// f16 and q8_0 caches keep their own words: converting right after the loads would wait for
// them there; kept raw, they stay in flight while the current block is multiplied. On an H200
// (`bench --profile`, 504-token prompts, f16 caches) SmolLM2-1.7B's prompt attention went from
// 1.47 to 1.01 ms, Qwen2.5-1.5B's from 2.16 to 1.91 (1.07 and 1.40 in a later run, infinities
// clamped as they are staged). f16 rows (HALVES) keep their words too: Whisper
// large-v3-turbo's encoder attention went from 7.68 ms on f32 rows to 5.75. f32 sources (f32
// rows, f32 caches) are converted once loaded: kept as f32 they take twice the registers, and
// that encoder attention went from 7.75 to 8.35 ms (11.6 with the conversion inside the bounds
// check).
#if KV_WORDS
alias KvLoad = vec2<u32>;
alias KvKept = vec2<u32>;
fn keep(r: KvLoad) -> KvKept {
    return r;
}
#if Q8
// The word of four int8 values and its block's scale.
fn k_load(i: u32) -> KvLoad {
    return vec2<u32>(k_cache[i], k_cache[p.scale_base + i / 8u]);
}
fn v_load(i: u32) -> KvLoad {
    return vec2<u32>(v_cache[i], v_cache[p.scale_base + i / 8u]);
}
fn kept_half(r: KvKept) -> vec4<f16> {
    return to_half(q8_unpack(r.x) * bitcast<f32>(r.y));
}
#else
#if !FULL
fn k_load(i: u32) -> KvLoad {
    return k_cache[i];
}
fn v_load(i: u32) -> KvLoad {
    return v_cache[i];
}
#endif
fn kept_half(r: KvKept) -> vec4<f16> {
    // Through f32 and to_half: a cache word may hold an infinity (a value past f16's range
    // when stored), staged as f16's largest value as everywhere in this kernel.
    return to_half(vec4<f32>(unpack2x16float(r.x), unpack2x16float(r.y)));
}
#endif
#else
alias KvLoad = vec4<f32>;
alias KvKept = vec4<f16>;
fn keep(r: KvLoad) -> KvKept {
    return to_half(r);
}
fn kept_half(r: KvKept) -> vec4<f16> {
    return r;
}
#if !FULL
fn k_load(i: u32) -> KvLoad {
    return k_cache[i];
}
fn v_load(i: u32) -> KvLoad {
    return v_cache[i];
}
#endif
#endif
#if FULL
// Quads of an encoder's QKV rows (f16 words with HALVES).
fn k_load(i: u32) -> KvLoad {
    return kv[i];
}
fn v_load(i: u32) -> KvLoad {
    return kv[i];
}
#endif

// The next block's keys and values this invocation stages (KVQ quads of each), loaded while the
// current block is multiplied (with PREFETCH).
#for c in 0..KVQ
var<private> kn{{c}}: KvKept;
var<private> vn{{c}}: KvKept;
#endfor

// Loads this invocation's quads of the keys and values of the block from key `k0` (zeros past
// the keys' end).
fn fetch_kv(k0: u32, keys_end: u32, k_base: u32, v_base: u32, row_quads: u32, tid: u32) {
#for c in 0..KVQ
    {
        let i = tid + {{c}}u * FLASH_THREADS;
        let j = k0 + i / QUADS;
        var kq = KvLoad();
        var vq = KvLoad();
        if (j < keys_end) {
            kq = k_load(k_base + cache_row(j) * row_quads + i % QUADS);
            vq = v_load(v_base + cache_row(j) * row_quads + i % QUADS);
        }
        kn{{c}} = keep(kq);
        vn{{c}} = keep(vq);
    }
#endfor
}

fn stage_kv(tid: u32) {
#for c in 0..KVQ
    {
        let i = tid + {{c}}u * FLASH_THREADS;
        kv_tile[(i / QUADS) * LDH + i % QUADS] = kept_half(kn{{c}});
        kv_tile[V_AT + (i / QUADS) * LDH + i % QUADS] = kept_half(vn{{c}});
    }
#endfor
}

@compute @workgroup_size(FLASH_THREADS)
fn flash(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let n_queries = step.n_tokens;
#if QROWS
    // A last partial block of queries is taken as the block that ends at the last query (at
    // least FQ of them): its first rows are computed twice, alike, and written twice.
    let q0 = min(wid.y * FQ, n_queries - FQ);
#else
    let q0 = wid.y * FQ;
#endif
    let kv_head = head / (p.heads / p.kv_heads);
    let sg = tid / 32u;
    let lane = tid % 32u;
    // This lane's query (row r of its subgroup's 16) and its half of the block's keys and of
    // the head's dims.
    let r = lane / 2u;
    let half = lane % 2u;
    let row = q0 + sg * 16u + r;
#if FULL
    let k_base = (p.k_off + kv_head * {{HD}}u) / 4u;
    let row_quads = p.kv_stride / 4u;
    let v_base = k_base + p.kv_heads * QUADS;
    let keys_end = p.keys;
    let visible = p.keys;
    let keys_start = 0u;
    let lowest = 0u;
#else
    let k_base = (step.slot * p.kv_heads + kv_head) * p.capacity * QUADS;
    let row_quads = QUADS;
    let v_base = k_base;
    let keys_end = min(step.pos0 + min(q0 + FQ, n_queries), step.seq_len);
    let visible = min(step.pos0 + row + 1u, step.seq_len);
    let keys_start = first_visible(step.pos0 + q0);
    let lowest = first_visible(step.pos0 + row);
#endif
#if QROWS
    // The subgroup's queries straight from the f16 rows into fragments (scaled in the softmax).
    let q_at = (q0 + sg * 16u) * (p.q_stride / 4u) + head * QUADS;
#for d in 0..DF
    let qa{{d}} = coopLoadT<coop_mat16x16<f16, A>>(&q_halves[q_at + {{d}}u * 4u], p.q_stride / 4u);
#endfor
    let score_scale = p.scale;
#else
    // The block's queries, scaled, staged in kv_tile and loaded into fragments.
    for (var i = tid; i < FQ * QUADS; i += FLASH_THREADS) {
        let qr = q0 + i / QUADS;
        var v = vec4<f32>(0.0);
        if (qr < n_queries) {
            let b = query_at(qr, head) + 4u * (i % QUADS);
            v = q_quad(b) * p.scale;
        }
        kv_tile[(i / QUADS) * LDH + i % QUADS] = to_half(v);
    }
    workgroupBarrier();
#for d in 0..DF
    let qa{{d}} = coopLoadT<coop_mat16x16<f16, A>>(&kv_tile[sg * 16u * LDH + {{d}}u * 4u], LDH);
#endfor
    let score_scale = 1.0;
#endif
#for h in 0..PASSES
#for d in 0..DFP
    var oa{{h}}_{{d}} = coop_mat16x16<f32, C>();
#endfor
#endfor
    var run_max = NEG_BIG;
    var run_sum = 0.0;
    let srow = (sg * 16u + r) * LDS4;
    let prow = (sg * 16u + r) * LDP;
#if PREFETCH
    fetch_kv(keys_start, keys_end, k_base, v_base, row_quads, tid);
#endif
    for (var k0 = keys_start; k0 < keys_end; k0 += FK) {
        // Every subgroup is done with the previous block (or the queries) in kv_tile.
        workgroupBarrier();
#if !PREFETCH
        fetch_kv(k0, keys_end, k_base, v_base, row_quads, tid);
#endif
        stage_kv(tid);
        workgroupBarrier();
#if PREFETCH
        if (k0 + FK < keys_end) {
            fetch_kv(k0 + FK, keys_end, k_base, v_base, row_quads, tid);
        }
#endif
#for j in 0..KF
        {
            var s = coop_mat16x16<f32, C>();
#for d in 0..DF
            s = coopMultiplyAdd(qa{{d}}, coopLoad<coop_mat16x16<f16, B>>(&kv_tile[{{j}}u * 16u * LDH + {{d}}u * 4u], LDH), s);
#endfor
            coopStoreT(s, &fs[sg * 16u * LDS4 + {{j}}u * 4u], LDS4);
        }
#endfor
        workgroupBarrier();
        // The online softmax over this lane's quads of the block's keys (quads half, half + 2,
        // ...), masked as they are read.
        var block_max = NEG_BIG;
#for c in 0..SQ
        let key{{c}} = vec4<u32>(k0 + 4u * (2u * {{c}}u + half)) + vec4<u32>(0u, 1u, 2u, 3u);
        let s{{c}} = select(vec4<f32>(NEG_BIG), fs[srow + 2u * {{c}}u + half] * score_scale, (key{{c}} < vec4<u32>(visible)) & (key{{c}} >= vec4<u32>(lowest)) & (key{{c}} < vec4<u32>(keys_end)));
        block_max = max(block_max, max(max(s{{c}}.x, s{{c}}.y), max(s{{c}}.z, s{{c}}.w)));
#endfor
        block_max = max(block_max, subgroupShuffleXor(block_max, 1u));
        let moves = block_max > run_max + RESCALE_MARGIN;
        let new_max = select(run_max, block_max, moves);
        let corr = exp(run_max - new_max);
        run_max = new_max;
        var block_sum = 0.0;
#for c in 0..SQ
        {
            let e = exp(s{{c}} - run_max);
            block_sum += (e.x + e.y) + (e.z + e.w);
            fp[prow + 2u * {{c}}u + half] = vec4<f16>(e);
        }
#endfor
        block_sum += subgroupShuffleXor(block_sum, 1u);
        run_sum = run_sum * corr + block_sum;
        let any_moved = subgroupAny(moves);
        // The first block's outputs are still zero: nothing to rescale.
        if (lane == 0u) {
            moved[sg] = select(0u, 1u, any_moved && k0 != keys_start);
        }
        // Also the barrier between the probabilities' stores and their loads.
        let moved_now = workgroupUniformLoad(&moved);
        // One expression (a sum in a variable would not be uniform to the translator).
        let moved_any = 0u
#for g in 0..SUBGROUPS
            + moved_now[{{g}}]
#endfor
            ;
        if (moved_any != 0u) {
#for h in 0..PASSES
#for d in 0..DFP
            coopStoreT(oa{{h}}_{{d}}, &fs[sg * 16u * LDS4 + {{d}}u * 4u], LDS4);
#endfor
            workgroupBarrier();
#for c in 0..OQP
            fs[srow + 2u * {{c}}u + half] *= corr;
#endfor
            workgroupBarrier();
#for d in 0..DFP
            oa{{h}}_{{d}} = coopLoadT<coop_mat16x16<f32, C>>(&fs[sg * 16u * LDS4 + {{d}}u * 4u], LDS4);
#endfor
            workgroupBarrier();
#endfor
        }
#for j in 0..KF
        let pa{{j}} = coopLoadT<coop_mat16x16<f16, A>>(&fp[sg * 16u * LDP + {{j}}u * 4u], LDP);
#endfor
#for h in 0..PASSES
#for d in 0..DFP
#for j in 0..KF
        oa{{h}}_{{d}} = coopMultiplyAdd(pa{{j}}, coopLoadT<coop_mat16x16<f16, B>>(&kv_tile[V_AT + {{j}}u * 16u * LDH + ({{h}}u * {{DFP}}u + {{d}}u) * 4u], LDH), oa{{h}}_{{d}});
#endfor
#endfor
#endfor
    }
    // The outputs, a pass at a time through workgroup memory (every subgroup is done with the
    // last block's scores there), divided by the row's sum.
    let inv = normaliser(head, run_max, run_sum);
    let b = (row * p.heads + head) * {{HD}}u;
#for h in 0..PASSES
    workgroupBarrier();
#for d in 0..DFP
    coopStoreT(oa{{h}}_{{d}}, &fs[sg * 16u * LDS4 + {{d}}u * 4u], LDS4);
#endfor
    workgroupBarrier();
    if (row < n_queries) {
#for c in 0..OQP
        {
            let v = fs[srow + 2u * {{c}}u + half] * inv;
            let at = b + ({{h}}u * {{DFP}}u * 4u + 2u * {{c}}u + half) * 4u;
#if HALVES
            store_halves(at, v);
#else
            out[at] = v.x;
            out[at + 1u] = v.y;
            out[at + 2u] = v.z;
            out[at + 3u] = v.w;
#endif
        }
#endfor
    }
#endfor
}
