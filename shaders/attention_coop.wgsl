enable f16;
enable wgpu_cooperative_matrix;

// Attention over a prompt on tensor cores (cooperative matrices), appended to attention.wgsl
// (whose bindings, cache readers and masks it uses, causal or FULL). A workgroup of four
// subgroups of 32 takes 64 queries of one head, 16 per subgroup, and walks the keys in blocks
// of FK (64, or 32 for heads wider than 64) with an online softmax:
// - the block's keys and values are staged in workgroup memory as f16 (loaded into registers
//   while the previous block is multiplied);
// - each subgroup multiplies its queries (f16, pre-scaled, held in fragments) by the keys into
//   16×FK f32 scores, which it stores to workgroup memory;
// - two lanes per query mask the scores, keep the running max and sum (combined by a shuffle)
//   and write the probabilities back as f16;
// - the probabilities times the values give the block's 16×HD outputs, which the same two
//   lanes add to the outputs they hold, rescaled by the change of the running max. Heads wider
//   than 64 pass them through workgroup memory in two halves (TWO_PASS), each lane taking its
//   half of the dims in one.
// Defines: those of attention.wgsl, HD (a multiple of 16 up to 64, or of 32 up to 128), FK,
// KF = FK / 16, DF = HD / 16 (fragments across a head), DFP (those of one pass), OQ = HD / 8
// (output quads each lane holds), KVQ = FK·HD / 512 (quads of a block's keys and of its values
// each invocation stages), TWO_PASS.

const FQ: u32 = 64u;
const FK: u32 = {{FK}}u;
const FLASH_THREADS: u32 = 128u;
// Staged rows of HD + 8 halves in units of four (whole 16-byte words for the fragment loads,
// and consecutive rows in different memory banks).
const LDH: u32 = {{HD}}u / 4u + 2u;
// Probability rows of FK + 8 halves, in units of four.
const LDP: u32 = FK / 4u + 2u;
// Score and output-block rows of one subgroup (f32): at most 64 values, padded.
const LDS: u32 = 68u;
// Where the values start in `kv_tile`.
const V_AT: u32 = FK * LDH;

// The queries (first, all 64 rows), then each block's keys and its values, [key][dim].
var<workgroup> kv_tile: array<vec4<f16>, 2u * FK * LDH>;
// Per subgroup: 16 rows of scores, then of the block's outputs.
var<workgroup> fs: array<f32, 64u * LDS>;
// Per subgroup: 16 rows of probabilities.
var<workgroup> fp: array<vec4<f16>, 64u * LDP>;

fn to_half(v: vec4<f32>) -> vec4<f16> {
    // Saturate rather than overflow to infinity.
    return vec4<f16>(clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0)));
}

// Where query `row`'s head vector starts in q.
fn query_at(row: u32, head: u32) -> u32 {
#if FULL
    return row * p.q_stride + head * {{HD}}u;
#else
    return (row * p.heads + head) * {{HD}}u;
#endif
}

#for c in 0..OQ
var<private> o{{c}}: vec4<f32>;
#endfor
// The next block's keys and values this invocation stages (KVQ quads of each), loaded while the
// current block is multiplied.
#for c in 0..KVQ
var<private> kn{{c}}: vec4<f16>;
var<private> vn{{c}}: vec4<f16>;
#endfor

// Loads this invocation's quads of the keys and values of the block from key `k0`.
fn fetch_kv(k0: u32, keys_end: u32, k_base: u32, v_base: u32, row_quads: u32, tid: u32) {
#for c in 0..KVQ
    {
        let i = tid + {{c}}u * FLASH_THREADS;
        let j = k0 + i / QUADS;
        var kq = vec4<f32>(0.0);
        var vq = vec4<f32>(0.0);
        if (j < keys_end) {
            kq = k_quad(k_base + cache_row(j) * row_quads + i % QUADS);
            vq = v_quad(v_base + cache_row(j) * row_quads + i % QUADS);
        }
        kn{{c}} = to_half(kq);
        vn{{c}} = to_half(vq);
    }
#endfor
}

fn stage_kv(tid: u32) {
#for c in 0..KVQ
    {
        let i = tid + {{c}}u * FLASH_THREADS;
        kv_tile[(i / QUADS) * LDH + i % QUADS] = kn{{c}};
        kv_tile[V_AT + (i / QUADS) * LDH + i % QUADS] = vn{{c}};
    }
#endfor
}

@compute @workgroup_size(FLASH_THREADS)
fn flash(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let q0 = wid.y * FQ;
    let n_queries = step.n_tokens;
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
    let k_base = kv_head * p.capacity * QUADS;
    let row_quads = QUADS;
    let v_base = k_base;
    let keys_end = step.pos0 + min(q0 + FQ, n_queries);
    let visible = step.pos0 + row + 1u;
    let keys_start = first_visible(step.pos0 + q0);
    let lowest = first_visible(step.pos0 + row);
#endif
    // The block's queries, scaled, staged in kv_tile and loaded into fragments.
    for (var i = tid; i < FQ * QUADS; i += FLASH_THREADS) {
        let qr = q0 + i / QUADS;
        var v = vec4<f32>(0.0);
        if (qr < n_queries) {
            let b = query_at(qr, head) + 4u * (i % QUADS);
            v = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]) * p.scale;
        }
        kv_tile[(i / QUADS) * LDH + i % QUADS] = to_half(v);
    }
    workgroupBarrier();
#for d in 0..DF
    let qa{{d}} = coopLoadT<coop_mat16x16<f16, A>>(&kv_tile[sg * 16u * LDH + {{d}}u * 4u], LDH);
#endfor
#for c in 0..OQ
    o{{c}} = vec4<f32>(0.0);
#endfor
    var run_max = NEG_BIG;
    var run_sum = 0.0;
    let srow = (sg * 16u + r) * LDS;
    fetch_kv(keys_start, keys_end, k_base, v_base, row_quads, tid);
    for (var k0 = keys_start; k0 < keys_end; k0 += FK) {
        // Every subgroup is done with the previous block (or the queries) in kv_tile.
        workgroupBarrier();
        stage_kv(tid);
        workgroupBarrier();
        if (k0 + FK < keys_end) {
            fetch_kv(k0 + FK, keys_end, k_base, v_base, row_quads, tid);
        }
#for j in 0..KF
        {
            var s = coop_mat16x16<f32, C>();
#for d in 0..DF
            s = coopMultiplyAdd(qa{{d}}, coopLoad<coop_mat16x16<f16, B>>(&kv_tile[{{j}}u * 16u * LDH + {{d}}u * 4u], LDH), s);
#endfor
            coopStoreT(s, &fs[sg * 16u * LDS + {{j}}u * 16u], LDS);
        }
#endfor
        workgroupBarrier();
        // The online softmax over this lane's half of the block's keys.
        let key0 = k0 + half * (FK / 2u);
        var block_max = NEG_BIG;
        for (var t = 0u; t < FK / 2u; t++) {
            let key = key0 + t;
            let at = srow + half * (FK / 2u) + t;
            let s = select(NEG_BIG, fs[at], key < visible && key >= lowest && key < keys_end);
            fs[at] = s;
            block_max = max(block_max, s);
        }
        block_max = max(block_max, subgroupShuffleXor(block_max, 1u));
        let new_max = max(run_max, block_max);
        var block_sum = 0.0;
        for (var t = 0u; t < FK / 2u; t += 4u) {
            let at = srow + half * (FK / 2u) + t;
            let e = exp(vec4<f32>(fs[at], fs[at + 1u], fs[at + 2u], fs[at + 3u]) - new_max);
            block_sum += e.x + e.y + e.z + e.w;
            fp[(sg * 16u + r) * LDP + half * (FK / 8u) + t / 4u] = vec4<f16>(e);
        }
        block_sum += subgroupShuffleXor(block_sum, 1u);
        let corr = exp(run_max - new_max);
        run_sum = run_sum * corr + block_sum;
        run_max = new_max;
        workgroupBarrier();
#for j in 0..KF
        let pa{{j}} = coopLoadT<coop_mat16x16<f16, A>>(&fp[sg * 16u * LDP + {{j}}u * 4u], LDP);
#endfor
#if TWO_PASS
#for h in 0..2
#for d in 0..DFP
        {
            var ob = coop_mat16x16<f32, C>();
#for j in 0..KF
            ob = coopMultiplyAdd(pa{{j}}, coopLoadT<coop_mat16x16<f16, B>>(&kv_tile[V_AT + {{j}}u * 16u * LDH + ({{h}}u * {{DFP}}u + {{d}}u) * 4u], LDH), ob);
#endfor
            coopStoreT(ob, &fs[sg * 16u * LDS + {{d}}u * 16u], LDS);
        }
#endfor
        workgroupBarrier();
        if (half == {{h}}u) {
#for c in 0..OQ
            o{{c}} = o{{c}} * corr + vec4<f32>(fs[srow + {{c}}u * 4u], fs[srow + {{c}}u * 4u + 1u], fs[srow + {{c}}u * 4u + 2u], fs[srow + {{c}}u * 4u + 3u]);
#endfor
        }
        workgroupBarrier();
#endfor
#else
#for d in 0..DF
        {
            var ob = coop_mat16x16<f32, C>();
#for j in 0..KF
            ob = coopMultiplyAdd(pa{{j}}, coopLoadT<coop_mat16x16<f16, B>>(&kv_tile[V_AT + {{j}}u * 16u * LDH + {{d}}u * 4u], LDH), ob);
#endfor
            coopStoreT(ob, &fs[sg * 16u * LDS + {{d}}u * 16u], LDS);
        }
#endfor
        workgroupBarrier();
        let dim0 = srow + half * ({{HD}}u / 2u);
#for c in 0..OQ
        o{{c}} = o{{c}} * corr + vec4<f32>(fs[dim0 + {{c}}u * 4u], fs[dim0 + {{c}}u * 4u + 1u], fs[dim0 + {{c}}u * 4u + 2u], fs[dim0 + {{c}}u * 4u + 3u]);
#endfor
#endif
    }
    if (row < n_queries) {
        let inv = 1.0 / run_sum;
        let b = (row * p.heads + head) * {{HD}}u + half * ({{HD}}u / 2u);
#for c in 0..OQ
        out[b + {{c}}u * 4u] = o{{c}}.x * inv;
        out[b + {{c}}u * 4u + 1u] = o{{c}}.y * inv;
        out[b + {{c}}u * 4u + 2u] = o{{c}}.z * inv;
        out[b + {{c}}u * 4u + 3u] = o{{c}}.w * inv;
#endfor
    }
}
