//! The batched decode step's own kernels against a plain CPU reference: each row of a step is
//! the next token of the sequence in its own cache slot, at its own position, with its own
//! history and seen-token set (a `BatchRows` table). Rows whose slots and positions are out of
//! order, two rows of one slot, and a row at position 0 check that every row reads and writes
//! its own sequence's places: the embedding gather, RoPE with the KV cache store, and the
//! sampler (greedy, with a grammar mask and a repetition penalty per slot).

mod common;

use backpack_engine::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use backpack_engine::load::{RopeScaling, RopeSpec};
use backpack_engine::ops::{
    BatchRows, BatchSample, CacheShape, Embed, KvDType, MAX_BATCH_ROWS, Matrix, RopeKv, RopeTable,
    SamplerParams, StepParams, WeightDType,
};
use common::{Rng, assert_close, gpu};

/// Slots, positions a slot's cache holds, and the rows of the step: (position, slot).
const SLOTS: u32 = 3;
const CAPACITY: u32 = 23;
const ROWS: [(u32, u32); 5] = [(7, 2), (22, 0), (0, 1), (13, 2), (5, 1)];
/// The sampler's rows: one a slot, as in a real step (rows of one slot would race on its seen
/// set).
const SAMPLED_ROWS: [(u32, u32); 3] = [(7, 2), (22, 0), (0, 1)];

fn step(gpu: &Gpu, n: u32) -> UniformBuffer {
    gpu.uniform("step", &StepParams::new(0, n))
}

fn read_f32(gpu: &Gpu, b: &StorageBuffer, n: usize) -> Vec<f32> {
    gpu.read(&b.buffer, 0, n as u64).expect("read back")
}

fn read_u32(gpu: &Gpu, b: &StorageBuffer, n: usize) -> Vec<u32> {
    gpu.read(&b.buffer, 0, n as u64).expect("read back")
}

/// The step's table: each row's position, slot, history start and seen-set start, the
/// histories `CAPACITY + 1` tokens a slot and the seen sets `seen_words` words a slot.
fn rows_table(gpu: &Gpu, rows: &[(u32, u32)], seen_words: u32) -> UniformBuffer {
    let mut table = BatchRows {
        rows: [[0; 4]; MAX_BATCH_ROWS as usize],
    };
    for (t, &(pos, slot)) in rows.iter().enumerate() {
        table.rows[t] = [pos, slot, slot * (CAPACITY + 1), slot * seen_words];
    }
    gpu.uniform("batch rows", &table)
}

/// Every slot's history of random tokens.
fn histories(rng: &mut Rng, vocab: u32) -> Vec<u32> {
    (0..SLOTS * (CAPACITY + 1))
        .map(|_| rng.below(vocab))
        .collect()
}

#[test]
fn batched_embedding_gathers_each_rows_token_from_its_own_history() {
    let gpu = gpu();
    let mut rng = Rng::new(61);
    let (vocab, dim) = (45u32, 20u32);
    let table = rng.vec((vocab * dim) as usize, 1.0);
    let positions = rng.vec((CAPACITY * dim) as usize, 1.0);
    let tm = Matrix::from_f32(&gpu, "table", &table, vocab, dim, WeightDType::F32).expect("table");
    let pb = gpu
        .storage_from("positions", &positions)
        .expect("positions");
    let history = histories(&mut rng, vocab);
    let hb = gpu.storage_from("history", &history).expect("history");
    let seen_words = vocab.div_ceil(32);
    let seen = gpu
        .storage_from("seen", &vec![0u32; (SLOTS * seen_words) as usize])
        .expect("seen");
    let x = gpu
        .storage("x", (ROWS.len() as u32 * dim) as u64 * 4)
        .expect("x");
    let (st, rows) = (
        step(&gpu, ROWS.len() as u32),
        rows_table(&gpu, &ROWS, seen_words),
    );
    let scale = 1.5;
    let op = Embed::batched(&gpu, &tm, Some(&pb), [&hb, &seen, &x], &st, &rows, scale)
        .expect("batched embedding");
    let mut rec = Recorder::new(&gpu);
    op.encode(&mut rec, ROWS.len() as u32);
    rec.submit();
    let got = read_f32(&gpu, &x, ROWS.len() * dim as usize);
    let d = dim as usize;
    let mut want = Vec::new();
    let mut want_seen = vec![0u32; (SLOTS * seen_words) as usize];
    for &(pos, slot) in &ROWS {
        let token = history[(slot * (CAPACITY + 1) + pos) as usize] as usize;
        for j in 0..d {
            want.push((table[token * d + j] + positions[pos as usize * d + j]) * scale);
        }
        want_seen[(slot * seen_words) as usize + token / 32] |= 1 << (token % 32);
    }
    assert_close(
        "batched embedding",
        &got,
        &want,
        &vec![1.0; want.len()],
        1e-6,
        0.0,
    );
    let got_seen = read_u32(&gpu, &seen, want_seen.len());
    assert_eq!(
        got_seen, want_seen,
        "each row's token in its own slot's seen set"
    );
}

#[test]
fn batched_rope_rotates_at_each_rows_position_and_stores_in_its_slot() {
    let gpu = gpu();
    let mut rng = Rng::new(62);
    let (heads, kv_heads, hd) = (4u32, 2u32, 12u32);
    let hdu = hd as usize;
    let spec = RopeSpec {
        theta: 10000.0,
        scaling: RopeScaling::None,
    };
    let inv_freq = spec.inv_freq(hd);
    let table = RopeTable::new(&gpu, &inv_freq, CAPACITY).expect("table");
    let mut shape = CacheShape::new(heads, kv_heads, hd, CAPACITY, KvDType::F32);
    shape.slots = SLOTS;
    let row_width = ((heads + 2 * kv_heads) * hd) as usize;
    let qkv = rng.vec(ROWS.len() * row_width, 2.0);
    let qkvb = gpu.storage_from("qkv", &qkv).expect("qkv");
    let q = gpu
        .storage("q", (ROWS.len() as u32 * heads * hd) as u64 * 4)
        .expect("q");
    // The caches start with a marker value, so that stores into the wrong place show.
    let cache_len = (SLOTS * kv_heads * CAPACITY * hd) as usize;
    let k_cache = gpu.storage_from("k", &vec![9.0f32; cache_len]).expect("k");
    let v_cache = gpu.storage_from("v", &vec![9.0f32; cache_len]).expect("v");
    let (st, rows) = (step(&gpu, ROWS.len() as u32), rows_table(&gpu, &ROWS, 1));
    let op = RopeKv::batched(
        &gpu,
        shape,
        Some(&table),
        [&qkvb, &q, &k_cache, &v_cache],
        &st,
        &rows,
    )
    .expect("batched rope");
    let mut rec = Recorder::new(&gpu);
    op.encode(&mut rec, ROWS.len() as u32);
    rec.submit();
    let rotate = |v: &[f32], pos: u32| -> Vec<f32> {
        let h = hdu / 2;
        let mut out = v.to_vec();
        for i in 0..h {
            let (s, c) = f64::from(pos as f32 * inv_freq[i]).sin_cos();
            let (a, b) = (f64::from(v[i]), f64::from(v[i + h]));
            out[i] = (a * c - b * s) as f32;
            out[i + h] = (b * c + a * s) as f32;
        }
        out
    };
    let mut want_q = Vec::new();
    let mut want_k = vec![9.0f32; cache_len];
    let mut want_v = vec![9.0f32; cache_len];
    for (t, &(pos, slot)) in ROWS.iter().enumerate() {
        let row = &qkv[t * row_width..][..row_width];
        for h in 0..heads as usize {
            want_q.extend(rotate(&row[h * hdu..][..hdu], pos));
        }
        for g in 0..kv_heads as usize {
            let at =
                ((slot as usize * kv_heads as usize + g) * CAPACITY as usize + pos as usize) * hdu;
            let k = &row[(heads as usize + g) * hdu..][..hdu];
            let v = &row[(heads as usize + kv_heads as usize + g) * hdu..][..hdu];
            want_k[at..at + hdu].copy_from_slice(&rotate(k, pos));
            want_v[at..at + hdu].copy_from_slice(v);
        }
    }
    let close = |label: &str, b: &StorageBuffer, want: &[f32]| {
        let got = read_f32(&gpu, b, want.len());
        assert_close(label, &got, want, &vec![1.0; want.len()], 2e-6, 0.0);
    };
    close("batched rope: queries", &q, &want_q);
    close("batched rope: key cache", &k_cache, &want_k);
    close("batched rope: value cache", &v_cache, &want_v);
}

#[test]
fn batched_sampler_picks_with_each_slots_mask_and_penalty() {
    let gpu = gpu();
    let mut rng = Rng::new(63);
    // A vocabulary that is no multiple of four or 32, whose rows of logits follow one another
    // unpadded (as the LM head writes them), so that rows after the first start mid-vec4.
    let vocab = 101u32;
    let row_len = vocab as usize;
    let seen_words = vocab.div_ceil(32);
    let logits = rng.vec(SAMPLED_ROWS.len() * row_len, 3.0);
    let lb = gpu.storage_from("logits", &logits).expect("logits");
    let history = histories(&mut rng, vocab);
    let hb = gpu.storage_from("history", &history).expect("history");
    // Slot 2 has seen each row's best token, which its penalty pushes down.
    let best = |t: usize| -> usize {
        (0..vocab as usize)
            .max_by(|&a, &b| logits[t * row_len + a].total_cmp(&logits[t * row_len + b]))
            .expect("a token")
    };
    let mut seen = vec![0u32; (SLOTS * seen_words) as usize];
    for (t, &(_, slot)) in SAMPLED_ROWS.iter().enumerate() {
        if slot == 2 {
            let b = best(t);
            seen[(2 * seen_words) as usize + b / 32] |= 1 << (b % 32);
        }
    }
    let sb = gpu.storage_from("seen", &seen).expect("seen");
    let rows = rows_table(&gpu, &SAMPLED_ROWS, seen_words);
    let op = BatchSample::new(&gpu, vocab, SLOTS, [&lb, &hb, &sb], &rows).expect("sampler");
    // Slot 1 may pick only odd tokens; slot 2 penalises what it has seen.
    let odd: Vec<u32> = (0..seen_words).map(|_| 0xAAAA_AAAA).collect();
    let penalty = 4.0;
    op.set(&gpu, 0, &SamplerParams::default(), None);
    op.set(&gpu, 1, &SamplerParams::default(), Some(&odd));
    let penalised = SamplerParams {
        repeat_penalty: penalty,
        ..Default::default()
    };
    op.set(&gpu, 2, &penalised, None);
    let mut rec = Recorder::new(&gpu);
    op.encode(&mut rec, SAMPLED_ROWS.len() as u32);
    rec.submit();
    let got = read_u32(&gpu, &hb, history.len());
    let got_seen = read_u32(&gpu, &sb, seen.len());
    let mut want = history.clone();
    let mut want_seen = seen.clone();
    for (t, &(pos, slot)) in SAMPLED_ROWS.iter().enumerate() {
        let seen_before = |v: usize| seen[(slot * seen_words) as usize + v / 32] >> (v % 32) & 1;
        let score = |v: usize| -> Option<f32> {
            let l = logits[t * row_len + v];
            match slot {
                1 if v.is_multiple_of(2) => None,
                2 if seen_before(v) == 1 => Some(if l > 0.0 { l / penalty } else { l * penalty }),
                _ => Some(l),
            }
        };
        let pick = (0..vocab as usize)
            .filter_map(|v| score(v).map(|s| (v, s)))
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
            .expect("an allowed token")
            .0;
        want[(slot * (CAPACITY + 1) + pos + 1) as usize] = pick as u32;
        want_seen[(slot * seen_words) as usize + pick / 32] |= 1 << (pick % 32);
    }
    assert_eq!(
        got, want,
        "each row's token after its position in its slot's history"
    );
    assert_eq!(
        got_seen, want_seen,
        "each row's token in its slot's seen set"
    );
}

/// Where the driver reports memory (VK_EXT_memory_budget), the free memory falls by about a
/// buffer's size once the buffer is made and used.
#[test]
fn free_memory_falls_as_buffers_are_made() {
    let gpu = gpu();
    let Some(before) = gpu.free_memory() else {
        eprintln!("{}: no memory budget reported", gpu.info().name);
        return;
    };
    let size = 256u64 << 20;
    let buffer = gpu.storage("probe", size).expect("buffer");
    gpu.queue().write_buffer(&buffer.buffer, 0, &[1u8; 4]);
    gpu.wait().expect("wait");
    let after = gpu.free_memory().expect("still reported");
    eprintln!("{}: free {before} then {after}", gpu.info().name);
    assert!(after + size / 2 <= before, "{before} then {after}");
    drop(buffer);
}
