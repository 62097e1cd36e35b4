//! `bench --speculate N,…`: decode speed with speculative decoding at a chosen acceptance rate.
//! The drafts are the model's own greedy answer (from a plain run first), each replaced by
//! another token with probability 1 − acceptance, so the rate is set exactly and the drafting
//! itself costs nothing: what is measured is the verification, the acceptance rule and the
//! commits, against plain decoding of the same answer in the same process.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use backpack_engine::models::DecoderModel;
use backpack_engine::models::speculate::{Draws, argmax};

pub struct SpeculativeResult {
    pub drafts_per_round: u32,
    /// The chance each draft was the model's own token.
    pub acceptance: f64,
    pub plain_tps: f64,
    pub speculative_tps: f64,
    /// Tokens each verification gave (kept drafts plus the model's own).
    pub tokens_per_round: f64,
    /// Mean time of one verification (forward pass over its rows, readback, rule).
    pub verify_ms: f64,
    /// Tokens of the speculative greedy answer that differ from the plain one.
    pub differing: usize,
}

/// Plain greedy decoding of `generate` tokens after `prompt` (best of `repeat`), then
/// speculative decoding of the same answer for each pair of drafts a round and acceptance.
pub fn measure(
    model: &mut DecoderModel,
    prompt: &[u32],
    generate: u32,
    shapes: &[(u32, f64)],
    repeat: u32,
) -> Result<Vec<SpeculativeResult>> {
    for &(k, acceptance) in shapes {
        if !(0.0..=1.0).contains(&acceptance) {
            bail!("--acceptance {acceptance}: give rates from 0 to 1");
        }
        if k == 0 || k > model.max_drafts() {
            bail!(
                "--speculate {k}: one verification takes 1 to {} drafts here",
                model.max_drafts()
            );
        }
    }
    let generate = generate.max(2) as usize;
    let mut plain = Duration::MAX;
    let mut reference = Vec::new();
    for _ in 0..repeat.max(1) {
        let mut answer = vec![model.prefill(prompt)?];
        let t = Instant::now();
        while answer.len() < generate {
            answer.push(model.decode()?);
        }
        plain = plain.min(t.elapsed());
        reference = answer;
    }
    model.set_lookahead(false);
    // The prompt path may resolve near-ties differently from the decode path (block formats
    // decode with int8 activations, and verifications of a few rows take other products than
    // those of more), so drafts come from the answer verifications of K drafts themselves
    // give, so that a rate of 1 is met whatever the weights.
    let mut calibrated: Vec<(u32, Vec<u32>)> = Vec::new();
    let decoded = (generate - 1) as f64;
    let mut results = Vec::new();
    for &(k, acceptance) in shapes {
        if !calibrated.iter().any(|(c, _)| *c == k) {
            let (fit, _) = speculate_rounds(model, prompt, &reference, k, 1.0, 0)?;
            let (own, _) = speculate_rounds(model, prompt, &fit, k, 1.0, 0)?;
            calibrated.push((k, own));
        }
        let Some((_, own)) = calibrated.iter().find(|(c, _)| *c == k) else {
            bail!("no calibration for {k} drafts");
        };
        let mut best: Option<Round> = None;
        for run in 0..repeat.max(1) {
            let (_, mut r) = speculate_rounds(model, prompt, own, k, acceptance, u64::from(run))?;
            r.differing = own.iter().zip(&reference).filter(|(a, b)| a != b).count();
            if best.as_ref().is_none_or(|b| r.elapsed < b.elapsed) {
                best = Some(r);
            }
        }
        let Some(best) = best else {
            bail!("no runs");
        };
        let rounds = best.rounds.max(1) as f64;
        results.push(SpeculativeResult {
            drafts_per_round: k,
            acceptance,
            plain_tps: decoded / plain.as_secs_f64(),
            speculative_tps: decoded / best.elapsed.as_secs_f64(),
            tokens_per_round: best.verified as f64 / rounds,
            verify_ms: best.verifying.as_secs_f64() * 1e3 / rounds,
            differing: best.differing,
        });
    }
    model.set_lookahead(true);
    Ok(results)
}

struct Round {
    elapsed: Duration,
    rounds: usize,
    /// Tokens the verifications gave (the rest came from plain steps where no draft fit).
    verified: usize,
    verifying: Duration,
    differing: usize,
}

/// One speculative run drafting from `reference`, each draft kept with chance `acceptance`:
/// its answer and timings.
fn speculate_rounds(
    model: &mut DecoderModel,
    prompt: &[u32],
    reference: &[u32],
    k: u32,
    acceptance: f64,
    seed: u64,
) -> Result<(Vec<u32>, Round)> {
    let vocab = model.spec().vocab;
    let generate = reference.len();
    let mut draws = Draws::new(seed);
    let mut answer = vec![model.prefill(prompt)?];
    let (mut rounds, mut verified, mut verifying) = (0, 0, Duration::ZERO);
    let t = Instant::now();
    while answer.len() < generate {
        let at = answer.len();
        let n = (k as usize).min(generate - at - 1);
        let drafts: Vec<u32> = reference[at..at + n]
            .iter()
            .map(|&t| {
                if draws.uniform() < acceptance {
                    t
                } else {
                    (t + 1) % vocab
                }
            })
            .collect();
        if drafts.is_empty() {
            answer.push(model.decode()?);
            continue;
        }
        let v = Instant::now();
        let logits = model.verify(&drafts)?;
        let mut kept = 0;
        let mut next = 0;
        for (i, row) in logits.chunks_exact(vocab as usize).enumerate() {
            next = argmax(row, None);
            if drafts.get(i) != Some(&next) {
                break;
            }
            kept += 1;
        }
        model.commit(kept, next)?;
        verifying += v.elapsed();
        rounds += 1;
        verified += kept + 1;
        answer.extend_from_slice(&drafts[..kept]);
        answer.push(next);
    }
    let elapsed = t.elapsed();
    answer.truncate(generate);
    let round = Round {
        elapsed,
        rounds,
        verified,
        verifying,
        differing: 0,
    };
    Ok((answer, round))
}

impl SpeculativeResult {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "drafts_per_round": self.drafts_per_round,
            "acceptance": self.acceptance,
            "plain_tok_s": self.plain_tps,
            "speculative_tok_s": self.speculative_tps,
            "speedup": self.speculative_tps / self.plain_tps,
            "tokens_per_round": self.tokens_per_round,
            "verify_ms": self.verify_ms,
            "differing_tokens": self.differing,
        })
    }

    pub fn print(&self) {
        println!(
            "speculative  {:.1} tok/s against {:.1} plain ({:.2}×): {} drafts a round, each the model's own token with chance {:.2}; {:.2} tokens a verification of {:.3} ms; {} tokens differ from the plain answer",
            self.speculative_tps,
            self.plain_tps,
            self.speculative_tps / self.plain_tps,
            self.drafts_per_round,
            self.acceptance,
            self.tokens_per_round,
            self.verify_ms,
            self.differing
        );
    }
}
