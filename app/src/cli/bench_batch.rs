//! `bench --parallel`: decoding several sequences at once in one forward pass a step (the
//! server's continuous batching), each in a cache slot of its own after the same prompt.

use std::time::Instant;

use anyhow::Result;
use backpack_engine::models::{BatchRow, DecoderModel};

/// Decode speed with `n` sequences decoding together.
pub struct BatchRun {
    pub sequences: u32,
    /// Tokens of all sequences together per second.
    pub tokens_per_s: f64,
    pub step_ms: f64,
}

/// The best of `repeats` runs of `generate` batched steps over `n` sequences, for each `n`
/// of `counts` (the model holds at least as many slots).
pub fn measure(
    model: &mut DecoderModel,
    prompt: &[u32],
    generate: u32,
    counts: &[u32],
    repeats: u32,
) -> Result<Vec<BatchRun>> {
    let mut out = Vec::new();
    for &n in counts {
        anyhow::ensure!(
            n >= 1 && n <= model.slots(),
            "--parallel {n}: the model holds {} sequences",
            model.slots()
        );
        let rows: Vec<BatchRow<'_>> = (0..n).map(|slot| BatchRow { slot, mask: None }).collect();
        let mut best = f64::MAX;
        // One unmeasured run first: pipelines, clocks.
        for _ in 0..=repeats.max(1) {
            for slot in 0..n {
                model.select_slot(slot)?;
                model.prefill(prompt)?;
            }
            let t = Instant::now();
            for _ in 1..generate.max(2) {
                model.decode_batch(&rows)?;
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let steps = f64::from(generate.max(2) - 1);
        out.push(BatchRun {
            sequences: n,
            tokens_per_s: f64::from(n) * steps / best,
            step_ms: best * 1e3 / steps,
        });
    }
    model.select_slot(0)?;
    Ok(out)
}

impl BatchRun {
    pub fn print(&self) {
        println!(
            "batched      {:>3} sequences: {:>9.1} tok/s in all, {:.2} ms a step",
            self.sequences, self.tokens_per_s, self.step_ms
        );
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "sequences": self.sequences,
            "tokens_per_s": self.tokens_per_s,
            "step_ms": self.step_ms,
        })
    }
}
