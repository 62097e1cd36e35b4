//! Speculative decoding: cheap guesses at the next few tokens (`drafts`), checked by the model
//! in one forward pass (`DecoderModel::verify`), which costs about what one decode step does
//! because a step's time goes to reading the weights, not to the rows it multiplies. Every
//! draft the model agrees with is a token gained; the first it refuses is replaced by the
//! model's own pick, so each round yields at least one token.
//!
//! Drafts come from the context itself (prompt lookup, `lookup.rs`) or from a small model with
//! the same tokenizer, run greedily with its own cache. `accept.rs` holds the rule that keeps
//! the output's distribution the model's own.

mod accept;
mod lookup;
mod pacing;

use std::path::{Path, PathBuf};
use std::time::Instant;

pub use accept::{Draws, Seen, Verdict, argmax, judge};
pub use lookup::lookup;

use crate::Error;
use crate::gpu::Gpu;
use crate::load::TextTokenizer;
use crate::models::decoder::MAX_VERIFY_ROWS;
use crate::models::{DecoderModel, ModelOptions, TextModel};
use crate::ops::SamplerParams;

/// How to speculate: `tokens` drafts a round at most, from `draft` (a model folder or GGUF
/// file) or, without one, from the context (prompt lookup); `paced`: each round of a greedy
/// answer takes as many as the rounds so far show to pay, none while none do (`pacing.rs`),
/// rather than always the most (for measuring, and for tests that count drafts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Speculation {
    pub draft: Option<PathBuf>,
    pub tokens: u32,
    pub paced: bool,
}

impl Speculation {
    /// The most drafts one round may verify.
    pub const MAX_TOKENS: u32 = MAX_VERIFY_ROWS - 1;
}

/// Drafts offered and kept over an answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    pub drafted: usize,
    pub accepted: usize,
}

enum Drafter {
    Lookup,
    Model(Box<DecoderModel>),
}

/// Drafts and verifies for one text model.
pub struct Speculator {
    drafter: Drafter,
    tokens: u32,
    draws: Draws,
    pacing: Option<pacing::Pacing>,
}

impl Speculator {
    /// Checks `how` against the target and loads its draft model (with the target's load
    /// options, no lookahead, a context as long as the target's).
    pub fn new(
        gpu: &Gpu,
        target: &TextModel,
        how: &Speculation,
        opts: &ModelOptions,
    ) -> Result<Self, Error> {
        if how.tokens == 0 || how.tokens > Speculation::MAX_TOKENS {
            return Err(Error::Invalid(format!(
                "speculating {} tokens a round: pick 1 to {}",
                how.tokens,
                Speculation::MAX_TOKENS
            )));
        }
        if !target.model.can_speculate() {
            return Err(Error::Invalid(format!(
                "{} cannot speculate: its state cannot rewind past refused drafts (recurrent or longrope layers)",
                target.info().name
            )));
        }
        let drafter = match &how.draft {
            None => Drafter::Lookup,
            Some(path) => Drafter::Model(Box::new(load_draft(gpu, target, path, opts)?)),
        };
        Ok(Self {
            drafter,
            tokens: how.tokens,
            draws: Draws::new(0),
            pacing: how.paced.then(|| pacing::Pacing::new(how.tokens as usize)),
        })
    }

    /// Starts an answer sampled with `params`: the draws follow its seed, and a draft model
    /// picks greedily under its repetition penalty (what the model itself picks at
    /// temperature 0).
    pub fn start(&mut self, params: &SamplerParams) {
        self.draws = Draws::new(params.seed);
        if let Drafter::Model(draft) = &mut self.drafter {
            draft.set_sampler(&SamplerParams {
                repeat_penalty: params.repeat_penalty,
                ..SamplerParams::default()
            });
        }
    }

    /// One round after `context` (the prompt and the answer so far, ending with the token
    /// `target` has pending): the tokens that follow it, at least one and at most
    /// `limit.max(1)`.
    pub fn step(
        &mut self,
        target: &mut DecoderModel,
        context: &[u32],
        params: &SamplerParams,
        limit: usize,
        stats: &mut DraftStats,
    ) -> Result<Vec<u32>, Error> {
        // Verification writes the pending token and the drafts at their positions; the token
        // chosen after them needs one more.
        let room = target.capacity().saturating_sub(target.next_position() + 1);
        let most =
            (self.tokens.min(room).min(target.max_drafts()) as usize).min(limit.saturating_sub(1));
        // Paced rounds depend on timing, and a sampled token on the round it falls in: only
        // greedy answers, whose tokens no round changes, are paced, so that a seed gives the
        // same sampled answer every run.
        let greedy = params.temperature <= 0.0 || !params.temperature.is_finite();
        let pacing = self.pacing.as_mut().filter(|_| greedy);
        let k = match pacing {
            Some(p) => p.drafts(most),
            None => most,
        };
        let started = Instant::now();
        let drafts = if k == 0 {
            Vec::new()
        } else {
            self.draft(context, k, target.spec().vocab)?
        };
        // A step submitted ahead is wasted when a verification follows (it must finish and
        // is then dropped), and gains a step's latency when a plain step follows: submit
        // ahead only while no drafts come (prompt lookup between repeats).
        target.set_lookahead(drafts.is_empty());
        if drafts.is_empty() {
            let token = target.decode()?;
            if let Some(p) = self.pacing.as_mut().filter(|_| greedy) {
                p.plain_step(started.elapsed().as_secs_f64());
            }
            return Ok(vec![token]);
        }
        let logits = target.verify(&drafts)?;
        let vocab = target.spec().vocab as usize;
        let mut seen = (params.repeat_penalty != 1.0).then(|| Seen::of(context, vocab));
        let mut out = Vec::with_capacity(drafts.len() + 1);
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            match judge(
                row,
                seen.as_ref(),
                params,
                drafts.get(i).copied(),
                &mut self.draws,
            ) {
                Verdict::Kept(t) => {
                    out.push(t);
                    if let Some(s) = &mut seen {
                        s.insert(t);
                    }
                }
                Verdict::Drawn(t) => {
                    out.push(t);
                    break;
                }
            }
        }
        let accepted = out.len() - 1;
        stats.drafted += drafts.len();
        stats.accepted += accepted;
        target.commit(accepted, out[accepted])?;
        if let Some(p) = self.pacing.as_mut().filter(|_| greedy) {
            p.round(drafts.len(), accepted, started.elapsed().as_secs_f64());
        }
        Ok(out)
    }

    /// Up to `k` drafts after `context`, all inside the target's vocabulary.
    fn draft(&mut self, context: &[u32], k: usize, vocab: u32) -> Result<Vec<u32>, Error> {
        let mut drafts = match &mut self.drafter {
            Drafter::Lookup => lookup(context, k),
            Drafter::Model(draft) => draft_greedily(draft, context, k)?,
        };
        if let Some(outside) = drafts.iter().position(|&t| t >= vocab) {
            drafts.truncate(outside);
        }
        Ok(drafts)
    }
}

/// The draft model's greedy continuation of `context`: its prompt cache makes each round run
/// only the tokens new since the last.
fn draft_greedily(draft: &mut DecoderModel, context: &[u32], k: usize) -> Result<Vec<u32>, Error> {
    if context.len() + k > draft.capacity() as usize {
        return Ok(Vec::new());
    }
    let mut drafts = vec![draft.prefill(context)?];
    while drafts.len() < k {
        drafts.push(draft.decode()?);
    }
    Ok(drafts)
}

fn load_draft(
    gpu: &Gpu,
    target: &TextModel,
    path: &Path,
    opts: &ModelOptions,
) -> Result<DecoderModel, Error> {
    let draft_opts = ModelOptions {
        context: Some(target.model.capacity()),
        lookahead: false,
        prefix_cache: true,
        speculate: None,
        ..opts.clone()
    };
    let draft = TextModel::load(gpu, path, &draft_opts)?;
    same_vocabulary(&target.tokenizer, &draft.tokenizer).map_err(|why| {
        Error::Invalid(format!(
            "draft model {} does not share the model's tokenizer: {why}",
            path.display()
        ))
    })?;
    let model = draft.model;
    if !model.can_speculate() {
        return Err(Error::Invalid(format!(
            "draft model {}: its state cannot rewind, so every round would run the whole context again; pick a transformer draft",
            path.display()
        )));
    }
    Ok(model)
}

/// Drafts are token ids: they mean the same text only if both vocabularies give every id the
/// draft can write the same token (sizes may differ by padding).
fn same_vocabulary(target: &TextTokenizer, draft: &TextTokenizer) -> Result<(), String> {
    let (t, d) = (target.hf(), draft.hf());
    let shared = t.get_vocab_size(true).min(d.get_vocab_size(true)) as u32;
    if shared == 0 {
        return Err("a vocabulary is empty".into());
    }
    for id in 0..shared {
        let (a, b) = (t.id_to_token(id), d.id_to_token(id));
        if a != b {
            return Err(format!(
                "token {id} is {} in the model and {} in the draft",
                a.as_deref().unwrap_or("(none)"),
                b.as_deref().unwrap_or("(none)")
            ));
        }
    }
    Ok(())
}
