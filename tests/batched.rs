//! Batched decoding: several sequences, each in its own cache slot, advance together in one
//! forward pass per step. Each must answer token for token as it does alone, while others
//! join and leave the batch mid-answer and a freed slot takes a new prompt. Checked on a
//! plain model (Qwen2), sliding-window layers with rolling caches (Gemma 3) and sinks with
//! routed experts (GPT-OSS), greedy and sampled (the draw is seeded per sequence and position).

mod common;

use backpack_engine::models::{BatchRow, DecoderModel, ModelOptions, TextModel};
use backpack_engine::ops::{SamplerParams, WeightDType};
use common::goldens::fixtures;
use common::gpu;

fn model(name: &str, slots: u32) -> TextModel {
    let opts = ModelOptions {
        dtype: WeightDType::F32,
        prefill_chunk: 7,
        context: Some(64),
        slots,
        ..Default::default()
    };
    TextModel::load(&gpu(), &fixtures().join("models").join(name), &opts)
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

fn prompt(seed: u32, len: u32, vocab: u32) -> Vec<u32> {
    (0..len).map(|i| (i * 7 + seed * 13 + 3) % vocab).collect()
}

/// The first token and `n - 1` more, one sequence at a time on the single-sequence path.
fn alone(m: &mut DecoderModel, ids: &[u32], sampler: &SamplerParams, n: usize) -> Vec<u32> {
    m.set_sampler(sampler);
    let mut out = vec![m.prefill(ids).expect("prefill")];
    while out.len() < n {
        out.push(m.decode().expect("decode"));
    }
    out
}

/// A sequence of the batched run: its slot, what it has returned, and how many it wants.
struct Running {
    slot: u32,
    prompt: usize,
    tokens: Vec<u32>,
}

fn samplers() -> [SamplerParams; 2] {
    [
        SamplerParams::default(),
        SamplerParams {
            temperature: 0.9,
            top_k: 20,
            top_p: 0.95,
            repeat_penalty: 1.1,
            seed: 7,
        },
    ]
}

#[test]
fn batched_sequences_answer_as_they_do_alone() {
    for name in ["tiny-qwen2", "tiny-gemma3", "tiny-gpt-oss"] {
        for sampler in samplers() {
            let mut single = model(name, 1);
            let mut batched = model(name, 3);
            assert_eq!(single.model.slots(), 1);
            assert_eq!(batched.model.slots(), 3, "{name}");
            let vocab = single.model.spec().vocab;
            // Prompts of different lengths, and how many tokens each answer runs to.
            let prompts: Vec<(Vec<u32>, usize)> = vec![
                (prompt(1, 11, vocab), 9),
                (prompt(2, 5, vocab), 12),
                (prompt(3, 16, vocab), 6),
                (prompt(4, 9, vocab), 8),
            ];
            let want: Vec<Vec<u32>> = prompts
                .iter()
                .map(|(ids, n)| alone(&mut single.model, ids, &sampler, *n))
                .collect();

            let m = &mut batched.model;
            let mut running: Vec<Running> = Vec::new();
            let mut done: Vec<(usize, Vec<u32>)> = Vec::new();
            let mut next_prompt = 0;
            let mut step = 0;
            while done.len() < prompts.len() {
                // A new sequence joins every other step while a slot is free.
                let free = (0..3).find(|s| running.iter().all(|r| r.slot != *s));
                if let (Some(slot), true) = (free, step % 2 == 0 && next_prompt < prompts.len()) {
                    m.select_slot(slot).unwrap();
                    m.set_sampler(&sampler);
                    let first = m.prefill(&prompts[next_prompt].0).unwrap();
                    running.push(Running {
                        slot,
                        prompt: next_prompt,
                        tokens: vec![first],
                    });
                    next_prompt += 1;
                }
                // Finished sequences leave and free their slot.
                running.retain(|r| {
                    let finished = r.tokens.len() >= prompts[r.prompt].1;
                    if finished {
                        done.push((r.prompt, r.tokens.clone()));
                    }
                    !finished
                });
                if !running.is_empty() {
                    let rows: Vec<BatchRow> = running
                        .iter()
                        .map(|r| BatchRow {
                            slot: r.slot,
                            mask: None,
                        })
                        .collect();
                    let tokens = m.decode_batch(&rows).unwrap();
                    for (r, t) in running.iter_mut().zip(tokens) {
                        r.tokens.push(t);
                    }
                }
                step += 1;
            }
            for (i, tokens) in done {
                assert_eq!(
                    tokens, want[i],
                    "{name}, {sampler:?}: prompt {i} batched against alone"
                );
            }
        }
    }
}

#[test]
fn masked_rows_pick_only_allowed_tokens() {
    let mut t = model("tiny-llama", 2);
    let m = &mut t.model;
    let vocab = m.spec().vocab;
    for slot in 0..2 {
        m.select_slot(slot).unwrap();
        m.set_sampler(&SamplerParams::default());
        m.prefill(&prompt(slot + 5, 6, vocab)).unwrap();
    }
    // Row 0 may only pick token 17, row 1 is free.
    let mut mask = vec![0u32; vocab.div_ceil(32) as usize];
    mask[0] |= 1 << 17;
    for _ in 0..3 {
        let rows = [
            BatchRow {
                slot: 0,
                mask: Some(&mask),
            },
            BatchRow {
                slot: 1,
                mask: None,
            },
        ];
        let tokens = m.decode_batch(&rows).unwrap();
        assert_eq!(tokens[0], 17);
    }
}

#[test]
fn bad_batches_are_refused() {
    let mut t = model("tiny-llama", 2);
    let m = &mut t.model;
    // No prompt yet.
    let row = |slot| BatchRow { slot, mask: None };
    assert!(m.decode_batch(&[row(0)]).is_err());
    m.prefill(&[1, 2, 3]).unwrap();
    assert!(m.decode_batch(&[row(0), row(0)]).is_err());
    assert!(m.decode_batch(&[row(0), row(1)]).is_err(), "slot 1 is empty");
    assert!(m.decode_batch(&[]).is_err());
    assert!(m.select_slot(2).is_err());
    assert_eq!(m.decode_batch(&[row(0)]).unwrap().len(), 1);
    // A one-slot model has no batched step.
    let mut one = model("tiny-llama", 1);
    one.model.prefill(&[1, 2, 3]).unwrap();
    assert!(one.model.decode_batch(&[row(0)]).is_err());
}
