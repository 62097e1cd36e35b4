// Declarations shared by every kernel; prepended to each shader family.

// Where the current submission is in the sequence: the absolute position of its first
// token, how many tokens it processes, and the sequence length after it (where the sampler
// writes the next token). Mirrors `StepParams` in engine/src/ops/mod.rs.
struct Step {
    pos0: u32,
    n_tokens: u32,
    seq_len: u32,
    _pad: u32,
}
