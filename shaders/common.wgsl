// Declarations shared by every kernel; prepended to each shader family.

// Where the current submission is in the sequence: the absolute position of its first
// token, how many tokens it processes, and the sequence length after it (where the sampler
// writes the next token), and the first row of the RoPE table this submission reads (past 0
// where a model switches tables by length: longrope). `slot` is the sequence's KV cache slot,
// with its token history from word `history_base` and its seen-token set from word
// `seen_base`. A batched decode step (kernels built with BATCH) instead takes one token of
// each of several sequences: row t's position, slot, history base and seen base are
// `batch.rows[t]`, a uniform of its own (kept out of Step, which every kernel reads: a software
// adapter copied the whole struct at each read). Mirrors `StepParams` and `BatchRows` in
// engine/src/ops/mod.rs.
struct Step {
    pos0: u32,
    n_tokens: u32,
    seq_len: u32,
    rope_row: u32,
    slot: u32,
    history_base: u32,
    seen_base: u32,
    _pad: u32,
}

#if BATCH
struct BatchRows {
    rows: array<vec4<u32>, 64>,
}

@group(0) @binding(20) var<uniform> batch: BatchRows;
#endif

#if STEP_BOUND
// The position of the step's token t.
fn token_pos(t: u32) -> u32 {
#if BATCH
    return batch.rows[t].x;
#else
    return step.pos0 + t;
#endif
}

// The KV cache slot of the step's token t.
fn token_slot(t: u32) -> u32 {
#if BATCH
    return batch.rows[t].y;
#else
    return step.slot;
#endif
}

// Where the token history of token t's sequence starts.
fn token_history(t: u32) -> u32 {
#if BATCH
    return batch.rows[t].z;
#else
    return step.history_base;
#endif
}

// Where the seen-token set of token t's sequence starts.
fn token_seen(t: u32) -> u32 {
#if BATCH
    return batch.rows[t].w;
#else
    return step.seen_base;
#endif
}
#endif

// GELU with the tanh approximation (GPT-2's "gelu_new"); tanh's argument is clamped so large
// inputs cannot overflow inside tanh.
fn gelu_tanh(v: f32) -> f32 {
    let c = 0.7978845608028654;
    let inner = clamp(c * (v + 0.044715 * v * v * v), -15.0, 15.0);
    return 0.5 * v * (1.0 + tanh(inner));
}

// erf to within 1.5e-7 (Abramowitz & Stegun 7.1.26): WGSL has no erf.
fn erf_approx(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
        + 0.254829592) * t;
    let y = 1.0 - poly * exp(-x * x);
    return select(-y, y, x >= 0.0);
}

// Exact GELU, x·Φ(x) (PyTorch's default "gelu").
fn gelu_erf(v: f32) -> f32 {
    return 0.5 * v * (1.0 + erf_approx(v * 0.7071067811865476));
}
