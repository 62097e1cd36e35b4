//! An answer as a sequence of steps: what turns each sampled token into text (whole UTF-8
//! characters, GPT-OSS's channels as `<think>`), follows its grammar, and decides when it
//! stops. [`TextModel::generate`] runs one answer to its end; a server running several at once
//! starts each in a cache slot of its own ([`TextModel::start_answer`]) and advances them all
//! by one token per batched step ([`TextModel::step_answers`]).

use std::time::{Duration, Instant};

use super::decoder::{BatchRow, SMALL_PREFILL_CHUNK};
use super::harmony::{HarmonyStream, HarmonyTokens};
use super::speculate::DraftStats;
use super::text::{GenerateParams, GenerationStats, Prompt, StopReason, TextModel};
use crate::Error;
use crate::grammar::Guide;
use crate::load::StreamDecoder;

/// One answer in progress.
pub struct Answer {
    pub(super) stats: GenerationStats,
    max_tokens: u32,
    stream: StreamDecoder,
    harmony: Option<HarmonyStream>,
    is_chat: bool,
    pub(super) guide: Option<Guide>,
    /// Text owed before the first delta (an opened `<think>` the prompt ends in).
    opening: String,
    started: Instant,
    first_at: Instant,
    /// The cache slot the answer decodes in.
    slot: u32,
    stopped: bool,
}

/// What a batched step gave answer `.0`: its next piece, or the error that ended it.
pub type AnswerStep = (usize, Result<Piece, Error>);

/// What one token of an answer gave.
#[derive(Clone, Debug)]
pub struct Piece {
    pub token: u32,
    /// Whole UTF-8 characters (a character split across tokens comes with its last token).
    pub delta: String,
    /// Set on the answer's last token.
    pub stop: Option<StopReason>,
}

/// Where a prompt joining running answers stands (see [`TextModel::run_prompt_chunk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptProgress {
    /// A chunk of it ran into this slot; more remain. `reused`: the prompt's tokens the slot
    /// held (or was lent) before the chunk ran.
    Ran { slot: u32, reused: usize },
    /// What remains runs as the answer starts.
    Ready,
}

impl Answer {
    /// For an answer whose prompt ran in chunks before it started
    /// ([`TextModel::run_prompt_chunk`]): its prompt time and time to first token count from
    /// the first chunk, and its cached tokens are those the first chunk found (the later
    /// chunks' rows were this prompt's own work).
    pub fn joined_in_chunks(&mut self, first_chunk: Instant, reused: usize) {
        let earlier = self.started.saturating_duration_since(first_chunk);
        self.stats.ttft += earlier;
        self.stats.prompt_time += earlier;
        self.stats.cached_tokens = self.stats.cached_tokens.min(reused);
    }

    /// The answer's cache slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Whether the answer has given its last token.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Prompt and answer so far: ids, text, timings (the decode speed once finished).
    pub fn stats(&self) -> &GenerationStats {
        &self.stats
    }

    /// The answer's figures, with its decode speed after the first token.
    pub fn finish(mut self) -> GenerationStats {
        let decoded = self.stats.tokens.len().saturating_sub(1);
        let secs = self.first_at.elapsed().as_secs_f64();
        self.stats.tokens_per_s = if decoded > 0 && secs > 0.0 {
            decoded as f64 / secs
        } else {
            0.0
        };
        self.stats
    }

    fn last_token(&self) -> Option<u32> {
        self.stats.tokens.last().copied()
    }
}

impl TextModel {
    /// An answer to `prompt`, tokenized with its grammar ready; nothing runs on the GPU yet.
    pub(super) fn prepare(
        &mut self,
        prompt: &Prompt,
        params: &GenerateParams,
    ) -> Result<Answer, Error> {
        let started = Instant::now();
        let prompt_tokens = self.tokenize_with(prompt, &params.switches())?;
        let harmony = match prompt {
            Prompt::Chat(_) => HarmonyTokens::of(&self.tokenizer).map(HarmonyStream::new),
            Prompt::Raw(_) | Prompt::Tokens(_) => None,
        };
        let guide = self.start_guide(prompt, params, &prompt_tokens, harmony.is_some())?;
        // A generation prompt that opens the reasoning leaves the model to write it and then
        // `</think>` with no opening tag: the answer gets the tag it continues from, so that it
        // reads as every other reasoning model's does.
        let opening = match prompt {
            Prompt::Chat(_)
                if harmony.is_none() && self.tokenizer.opens_reasoning(&prompt_tokens) =>
            {
                "<think>\n".to_owned()
            }
            _ => String::new(),
        };
        Ok(Answer {
            stats: GenerationStats {
                prompt_tokens,
                tokens: Vec::new(),
                text: String::new(),
                ttft: Duration::ZERO,
                prompt_time: Duration::ZERO,
                tokens_per_s: 0.0,
                stop: StopReason::MaxTokens,
                cached_tokens: 0,
                drafts: DraftStats::default(),
            },
            max_tokens: params.max_tokens,
            stream: StreamDecoder::default(),
            harmony,
            is_chat: matches!(prompt, Prompt::Chat(_)),
            guide,
            opening,
            started,
            first_at: started,
            slot: self.model.slot(),
            stopped: false,
        })
    }

    /// Runs the answer's prompt in the current slot (under the grammar's first mask) and
    /// returns its first token.
    pub(super) fn prefill_answer(
        &mut self,
        answer: &mut Answer,
        params: &GenerateParams,
    ) -> Result<u32, Error> {
        self.model.set_sampler(&params.sampler);
        if let Some(g) = &mut answer.guide {
            self.model.set_mask(Some(&g.mask()?))?;
        }
        let prefill_start = Instant::now();
        let token = self.model.prefill(&answer.stats.prompt_tokens)?;
        answer.stats.cached_tokens = self.model.last_prompt_reused() as usize;
        answer.stats.prompt_time = prefill_start.elapsed();
        answer.stats.ttft = answer.started.elapsed();
        answer.first_at = Instant::now();
        answer.slot = self.model.slot();
        Ok(token)
    }

    /// Takes `token` into the answer: its text, and whether the answer ends with it.
    pub(super) fn take_token(
        &self,
        answer: &mut Answer,
        token: u32,
        cancelled: bool,
    ) -> Result<Piece, Error> {
        let stats = &mut answer.stats;
        stats.tokens.push(token);
        // Where the token just returned sits: it can be fed only below the capacity.
        let position = stats.prompt_tokens.len() + stats.tokens.len() - 1;
        let stop = if self.eos_ids.contains(&token) {
            Some(StopReason::EndOfText)
        } else if stats.tokens.len() as u32 >= answer.max_tokens {
            Some(StopReason::MaxTokens)
        } else if position >= self.model.capacity() as usize {
            Some(StopReason::ContextFull)
        } else if cancelled {
            Some(StopReason::Cancelled)
        } else {
            None
        };
        let mut delta = match &mut answer.harmony {
            Some(h) => h.push(&self.tokenizer, token)?,
            None => answer.stream.push(&self.tokenizer, token)?,
        };
        if answer.is_chat
            && let Some(marker) = self.kept_specials.get(&token)
        {
            delta.push_str(marker);
        }
        if stop.is_some() {
            // Flush what was held back; an incomplete character becomes U+FFFD.
            delta.push_str(&match &mut answer.harmony {
                Some(h) => h.finish(&self.tokenizer)?,
                None => answer.stream.finish(&self.tokenizer)?,
            });
        }
        if !answer.opening.is_empty() {
            delta.insert_str(0, &std::mem::take(&mut answer.opening));
        }
        stats.text.push_str(&delta);
        if let Some(stop) = stop {
            stats.stop = stop;
            answer.stopped = true;
        }
        Ok(Piece { token, delta, stop })
    }

    /// Starts an answer in one of the `free` cache slots (the one whose cache holds most of
    /// its prompt, given the longest prefix any slot holds) and returns it with its first
    /// token. `cancelled` ends it there.
    pub fn start_answer(
        &mut self,
        prompt: &Prompt,
        params: &GenerateParams,
        free: &[u32],
        cancelled: bool,
    ) -> Result<(Answer, Piece), Error> {
        let mut answer = self.prepare(prompt, params)?;
        let slot = self.slot_for(&answer.stats.prompt_tokens, free)?;
        self.model.select_slot(slot)?;
        let token = self.prefill_answer(&mut answer, params)?;
        // Later steps sample under each row's own mask.
        if answer.guide.is_some() {
            self.model.set_mask(None)?;
        }
        let piece = self.take_token(&mut answer, token, cancelled)?;
        Ok((answer, piece))
    }

    /// Of the `free` slots, the one whose cache holds most of prompt `ids`, given the longest
    /// prefix any slot holds (a shared system prompt or tool list, perhaps in an answer still
    /// running, whose rows it lends).
    fn slot_for(&mut self, ids: &[u32], free: &[u32]) -> Result<u32, Error> {
        let slot = free
            .iter()
            .copied()
            .max_by_key(|&s| (self.model.cached_prefix(s, ids), std::cmp::Reverse(s)))
            .ok_or_else(|| Error::Invalid("no free cache slot".into()))?;
        if let Some((from, tokens)) = self.model.prefix_source(slot, ids) {
            self.model.share_prefix(from, slot, ids, tokens)?;
        }
        Ok(slot)
    }

    /// The tokens an answer to `prompt` under `params` starts from.
    pub fn prompt_ids(&self, prompt: &Prompt, params: &GenerateParams) -> Result<Vec<u32>, Error> {
        self.tokenize_with(prompt, &params.switches())
    }

    /// Runs the next chunk of prompt `ids` (an answer's, as [`Self::prompt_ids`] reads it;
    /// kept by the caller between chunks) into the free slot [`Self::start_answer`] would
    /// choose, without answering, while more than a chunk of it ([`SMALL_PREFILL_CHUNK`])
    /// remains beyond what that slot holds. A long prompt so joins running answers one such
    /// chunk between two of their steps, rather than holding them for its whole prefill;
    /// [`PromptProgress::Ready`] once the rest takes one chunk (or the model keeps no prompt
    /// rows between prefills, or the prompt does not fit: starting it then says why).
    pub fn run_prompt_chunk(&mut self, ids: &[u32], free: &[u32]) -> Result<PromptProgress, Error> {
        if !self.model.reuses_prompts() {
            return Ok(PromptProgress::Ready);
        }
        // Running answers wait for each piece: the small chunk, however long the model's.
        let chunk = self.model.prompt_chunk().min(SMALL_PREFILL_CHUNK) as usize;
        if ids.len() <= chunk || ids.len() > self.model.capacity() as usize {
            return Ok(PromptProgress::Ready);
        }
        let slot = self.slot_for(ids, free)?;
        let cached = self.model.cached_prefix(slot, ids);
        if ids.len() - cached <= chunk {
            return Ok(PromptProgress::Ready);
        }
        self.model.select_slot(slot)?;
        // The token it samples is never used: the prompt's full prefill samples again.
        self.model.prefill(&ids[..cached + chunk])?;
        Ok(PromptProgress::Ran {
            slot,
            reused: cached,
        })
    }

    /// Advances every unfinished answer of `answers` (each in its own slot) by one token in
    /// one batched step; `cancelled(i)` ends answer i with it. An answer whose grammar fails
    /// gets that error alone; a failing step fails them all.
    pub fn step_answers(
        &mut self,
        answers: &mut [Answer],
        cancelled: &dyn Fn(usize) -> bool,
    ) -> Result<Vec<AnswerStep>, Error> {
        let mut out = Vec::new();
        let mut masks: Vec<(usize, Option<Vec<u32>>)> = Vec::new();
        for (i, a) in answers.iter_mut().enumerate() {
            if a.stopped {
                continue;
            }
            let Some(fed) = a.last_token() else {
                out.push((i, Err(Error::Invalid("an answer without a prompt".into()))));
                continue;
            };
            let mask = match &mut a.guide {
                Some(g) => match g.accept(fed).and_then(|()| g.mask()) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        a.stopped = true;
                        out.push((i, Err(e.into())));
                        continue;
                    }
                },
                None => None,
            };
            masks.push((i, mask));
        }
        if masks.is_empty() {
            return Ok(out);
        }
        // One answer alone decodes on the single-sequence path (its products are made for one
        // row, and its steps are submitted ahead of their reading), unless the model keeps
        // answers batch-invariant.
        if masks.len() == 1
            && !self.model.batch_invariant()
            && let Some((i, mask)) = masks.pop()
        {
            let slot = answers[i].slot;
            self.model.select_slot(slot)?;
            let token = match mask {
                Some(words) => self.model.decode_masked(|| Ok(words))?,
                None => self.model.decode()?,
            };
            let piece = self.take_token(&mut answers[i], token, cancelled(i));
            if piece.is_err() {
                answers[i].stopped = true;
            }
            out.push((i, piece));
            return Ok(out);
        }
        let rows: Vec<BatchRow<'_>> = masks
            .iter()
            .map(|(i, mask)| BatchRow {
                slot: answers[*i].slot,
                mask: mask.as_deref(),
            })
            .collect();
        let tokens = self.model.decode_batch(&rows)?;
        for ((i, _), token) in masks.iter().zip(tokens) {
            let piece = self.take_token(&mut answers[*i], token, cancelled(*i));
            if piece.is_err() {
                answers[*i].stopped = true;
            }
            out.push((*i, piece));
        }
        Ok(out)
    }
}
