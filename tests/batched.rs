//! Batched decoding: several sequences, each in its own cache slot, advance together in one
//! forward pass per step. Each must answer token for token as it does alone, while others
//! join and leave the batch mid-answer and a freed slot takes a new prompt. Checked on a
//! plain model (Qwen2), sliding-window layers with rolling caches (Gemma 3) and sinks with
//! routed experts (GPT-OSS), greedy and sampled (the draw is seeded per sequence and position).

mod common;

use backpack_engine::models::{
    Answer, BatchRow, DecoderModel, GenerateParams, ModelOptions, Prompt, TextModel,
};
use backpack_engine::ops::{SamplerParams, WeightDType};
use common::goldens::fixtures;
use common::gpu;

fn model(name: &str, slots: u32) -> TextModel {
    let opts = ModelOptions {
        dtype: WeightDType::F32,
        prefill_chunk: Some(7),
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
                    m.select_slot(slot).expect("select slot");
                    m.set_sampler(&sampler);
                    let first = m.prefill(&prompts[next_prompt].0).expect("prefill");
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
                    let tokens = m.decode_batch(&rows).expect("batched step");
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
        m.select_slot(slot).expect("select slot");
        m.set_sampler(&SamplerParams::default());
        m.prefill(&prompt(slot + 5, 6, vocab)).expect("prefill");
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
        let tokens = m.decode_batch(&rows).expect("batched step");
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
    m.prefill(&[1, 2, 3]).expect("prefill");
    assert!(m.decode_batch(&[row(0), row(0)]).is_err());
    assert!(
        m.decode_batch(&[row(0), row(1)]).is_err(),
        "slot 1 is empty"
    );
    assert!(m.decode_batch(&[]).is_err());
    assert!(m.select_slot(2).is_err());
    assert_eq!(m.decode_batch(&[row(0)]).expect("batched step").len(), 1);
    // A one-slot model has no batched step.
    let mut one = model("tiny-llama", 1);
    one.model.prefill(&[1, 2, 3]).expect("prefill");
    assert!(one.model.decode_batch(&[row(0)]).is_err());
}

/// What the engine's events said of each request: its text, its tokens and how it ended.
#[derive(Default, Debug)]
struct Heard {
    tokens: Vec<u32>,
    text: String,
    stop: Option<backpack_engine::models::StopReason>,
    error: Option<String>,
}

/// Requests to an engine with several slots run together and answer as they do one at a
/// time; one cancelled mid-answer ends alone, and a JSON-constrained one stays valid JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_batches_requests_and_each_answers_as_alone() {
    use backpack_engine::grammar::Constraint;
    use backpack_engine::models::{GenerateParams, Prompt};
    use backpack_engine::runtime::{Engine, Event};
    use std::collections::HashMap;

    let path = fixtures().join("models").join("tiny-qwen2");
    let greedy = |n| GenerateParams {
        max_tokens: n,
        ..Default::default()
    };
    let prompts: Vec<Prompt> = (0..5)
        .map(|i| Prompt::Raw(format!("request {i}: {}", "word ".repeat(i + 1))))
        .collect();
    // Alone: the same model with one slot.
    let mut single = model("tiny-qwen2", 1);
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            single
                .generate(p, &greedy(10), &|| false, |_, _| {})
                .expect("alone")
                .tokens
        })
        .collect();

    let (engine, mut events) = Engine::spawn(gpu(), None);
    let opts = ModelOptions {
        dtype: WeightDType::F32,
        prefill_chunk: Some(7),
        context: Some(64),
        slots: 3,
        ..Default::default()
    };
    engine.load(path, opts);
    match events.recv().await {
        Some(Event::Loaded(_)) => {}
        other => panic!("loading: {other:?}"),
    }
    let mut ids: Vec<u64> = prompts
        .iter()
        .map(|p| engine.generate(p.clone(), greedy(10)))
        .collect();
    // A long answer to cancel, and one under a JSON grammar.
    let cancelled = engine.generate(prompts[0].clone(), greedy(40));
    let json = engine.generate(
        Prompt::Raw("{".into()),
        GenerateParams {
            max_tokens: 24,
            constraint: Some(Constraint::JsonObject),
            ..Default::default()
        },
    );
    ids.extend([cancelled, json]);
    let mut heard: HashMap<u64, Heard> = HashMap::new();
    let mut open = ids.len();
    while open > 0 {
        let event = tokio::time::timeout(std::time::Duration::from_secs(120), events.recv())
            .await
            .expect("the engine answered in time")
            .expect("the engine is alive");
        match event {
            Event::Token {
                request,
                id,
                text_delta,
            } => {
                let h = heard.entry(request).or_default();
                h.tokens.push(id);
                h.text.push_str(&text_delta);
                if request == cancelled && h.tokens.len() == 3 {
                    engine.cancel_one(cancelled);
                }
            }
            Event::Done { request, stop, .. } => {
                heard.entry(request).or_default().stop = Some(stop);
                open -= 1;
            }
            Event::Error {
                request, message, ..
            } => {
                heard
                    .entry(request.expect("a request's error"))
                    .or_default()
                    .error = Some(message);
                open -= 1;
            }
            Event::Loaded(_) => panic!("no load was asked for"),
        }
    }
    for (i, want) in want.iter().enumerate() {
        let h = &heard[&ids[i]];
        assert_eq!(h.error, None, "request {i}");
        assert_eq!(&h.tokens, want, "request {i}: batched against alone");
    }
    let c = &heard[&cancelled];
    assert_eq!(c.stop, Some(backpack_engine::models::StopReason::Cancelled));
    assert!(
        c.tokens.len() < 40,
        "{} tokens after a cancel",
        c.tokens.len()
    );
    let j = &heard[&json];
    assert_eq!(j.error, None);
    // The grammar's answer is JSON as far as it got: whole when it ended on its own.
    if j.stop == Some(backpack_engine::models::StopReason::EndOfText) {
        serde_json::from_str::<serde_json::Value>(&j.text)
            .unwrap_or_else(|e| panic!("{:?} is not JSON: {e}", j.text));
    } else {
        assert!(j.text.trim_start().starts_with('{'), "{:?}", j.text);
    }
}

/// Answers to `prompts` started together and stepped to `max` tokens through the answer
/// API, greedy: each one's tokens.
fn answer_tokens(t: &mut TextModel, prompts: &[Vec<u32>], max: u32) -> Vec<Vec<u32>> {
    answers_run(t, prompts, max)
        .into_iter()
        .map(|(tokens, _)| tokens)
        .collect()
}

/// As [`answer_tokens`], with the prompt tokens each answer took from a cache.
fn answers_run(t: &mut TextModel, prompts: &[Vec<u32>], max: u32) -> Vec<(Vec<u32>, usize)> {
    let params = GenerateParams {
        max_tokens: max,
        ..Default::default()
    };
    let mut answers = Vec::new();
    let mut tokens = Vec::new();
    for ids in prompts {
        let taken: Vec<u32> = answers.iter().map(|a: &Answer| a.slot()).collect();
        let free: Vec<u32> = (0..t.model.slots())
            .filter(|s| !taken.contains(s))
            .collect();
        let (answer, first) = t
            .start_answer(&Prompt::Tokens(ids.clone()), &params, &free, false)
            .expect("start answer");
        answers.push(answer);
        tokens.push(vec![first.token]);
    }
    let cached: Vec<usize> = answers.iter().map(|a| a.stats().cached_tokens).collect();
    while answers.iter().any(|a| !a.stopped()) {
        for (i, piece) in t.step_answers(&mut answers, &|_| false).expect("step") {
            tokens[i].push(piece.expect("piece").token);
        }
    }
    tokens.into_iter().zip(cached).collect()
}

/// A step of ten rows against the same rows each in a step of its own, token for token, on
/// tiny-llama (hidden rows of 64, which take Q8_0 blocks).
fn wide_step_decodes_each_row_as_alone(opts: &ModelOptions) {
    let path = fixtures().join("models").join("tiny-llama");
    let mut wide = TextModel::load(&gpu(), &path, opts).expect("load");
    let mut narrow = TextModel::load(&gpu(), &path, opts).expect("load");
    assert_eq!(wide.model.batch_invariant(), opts.batch_invariant);
    let vocab = wide.model.spec().vocab;
    let rows: Vec<BatchRow> = (0..10).map(|slot| BatchRow { slot, mask: None }).collect();
    for m in [&mut wide.model, &mut narrow.model] {
        for slot in 0..10 {
            m.select_slot(slot).expect("select slot");
            m.set_sampler(&SamplerParams::default());
            m.prefill(&prompt(slot + 20, 6 + slot, vocab))
                .expect("prefill");
        }
    }
    for step in 0..4 {
        let together = wide.model.decode_batch(&rows).expect("batched step");
        let alone: Vec<u32> = rows
            .iter()
            .map(|r| {
                narrow
                    .model
                    .decode_batch(std::slice::from_ref(r))
                    .expect("batched step")[0]
            })
            .collect();
        assert_eq!(together, alone, "{:?} step {step}", opts.quantize);
    }
}

/// A batch-invariant model gives each row of a step the tokens it gets in a step of its own:
/// block formats with int8 products take them at any number of rows (eight rows a workgroup,
/// in chunks), float weights the few-row products in chunks rather than tiles past eight
/// rows, and a lone answer takes the batched step too.
#[test]
fn batch_invariant_models_decode_each_row_as_alone_in_steps_of_any_width() {
    wide_step_decodes_each_row_as_alone(&ModelOptions {
        dtype: WeightDType::F16,
        quantize: Some(backpack_engine::load::GgmlType::Q8_0),
        prefill_chunk: Some(16),
        context: Some(64),
        slots: 10,
        batch_invariant: true,
        ..Default::default()
    });
    let opts = ModelOptions {
        dtype: WeightDType::F32,
        prefill_chunk: Some(16),
        context: Some(64),
        slots: 10,
        batch_invariant: true,
        ..Default::default()
    };
    wide_step_decodes_each_row_as_alone(&opts);
    // The answer API: one answer alone, then beside three others, gives the same tokens.
    let path = fixtures().join("models").join("tiny-llama");
    let mut t = TextModel::load(&gpu(), &path, &ModelOptions { slots: 4, ..opts }).expect("load");
    let vocab = t.model.spec().vocab;
    let ids = prompt(5, 9, vocab);
    let lone = answer_tokens(&mut t, std::slice::from_ref(&ids), 10);
    let others: Vec<Vec<u32>> = (6..9).map(|seed| prompt(seed, 7, vocab)).collect();
    let mut four = vec![ids];
    four.extend(others);
    let together = answer_tokens(&mut t, &four, 10);
    assert_eq!(lone[0], together[0]);
}

/// A prompt starting in a slot that holds none of it takes the rows of the longest prefix
/// another slot holds (here an answer still running), runs only the rest, and answers as it
/// does when run whole, in f32 and f16 caches (the rows of a Q8_0 cache and its block scales:
/// `shared_prefix`'s unit test), and with rolling sliding-window caches (Gemma 3), whose slots
/// lend a prefix only while they still hold the window before its end.
#[test]
fn prompt_prefixes_are_shared_between_slots() {
    use backpack_engine::models::MIN_SHARED_TOKENS;
    use backpack_engine::ops::KvDType;
    for (name, kv_cache, shares) in [
        ("tiny-qwen2", None, true),
        ("tiny-qwen2", Some(KvDType::F16), true),
        ("tiny-gemma3", None, true),
    ] {
        let opts = |slots, prefix_cache| ModelOptions {
            dtype: WeightDType::F32,
            prefill_chunk: Some(7),
            context: Some(64),
            slots,
            kv_cache,
            prefix_cache,
            ..Default::default()
        };
        let path = fixtures().join("models").join(name);
        let mut whole = TextModel::load(&gpu(), &path, &opts(1, false)).expect("load");
        let mut t = TextModel::load(&gpu(), &path, &opts(3, true)).expect("load");
        assert_eq!(t.model.shares_prefixes(), shares, "{name}");
        let vocab = t.model.spec().vocab;
        let system = prompt(9, 2 * MIN_SHARED_TOKENS as u32, vocab);
        let with = |seed, len| {
            let mut ids = system.clone();
            ids.extend(prompt(seed, len, vocab));
            ids
        };
        let prompts = [with(1, 5), with(2, 4)];
        let run = answers_run(&mut t, &prompts, 6);
        let shared = if shares { system.len() } else { 0 };
        assert_eq!(run[0].1, 0);
        assert_eq!(run[1].1, shared, "{name} {kv_cache:?}");
        // Both slots have written 9 and 10 positions past what they share, more than a chunk
        // (7): a rolling cache has then written over rows of the window before the prefix's
        // end.
        let source = t.model.prefix_source(2, &with(3, 4));
        let rolling = name == "tiny-gemma3";
        assert_eq!(source.is_none(), rolling, "{name}: {source:?}");
        let tokens: Vec<Vec<u32>> = run.into_iter().map(|(tokens, _)| tokens).collect();
        for (ids, got) in prompts.iter().zip(&tokens) {
            let want = alone(&mut whole.model, ids, &SamplerParams::default(), got.len());
            assert_eq!(got, &want, "{name} {kv_cache:?}");
        }
    }
}

/// With `fit_slots` the slots asked for are the most: a driver that reports no free memory
/// (lavapipe) gets `UNREPORTED_MEMORY_SLOTS` of them, one that does as many as fit (a tiny
/// model's caches always do); asking for fewer gives that many.
#[test]
fn fitted_slots_follow_the_reported_memory() {
    use backpack_engine::models::UNREPORTED_MEMORY_SLOTS;
    let path = fixtures().join("models").join("tiny-qwen2");
    let load = |slots| {
        let opts = ModelOptions {
            dtype: WeightDType::F32,
            prefill_chunk: Some(16),
            context: Some(64),
            slots,
            fit_slots: true,
            ..Default::default()
        };
        TextModel::load(&gpu(), &path, &opts)
            .expect("load")
            .model
            .slots()
    };
    let most = match gpu().free_memory() {
        Some(_) => 8,
        None => UNREPORTED_MEMORY_SLOTS,
    };
    assert_eq!(load(8), most);
    assert_eq!(load(2), 2);
}

/// A long prompt joining running answers runs one prefill chunk between two of their steps
/// until the rest is a chunk, then starts from the rows it left and answers as it does alone;
/// the running answer is unchanged by it. A prompt of one chunk starts at once.
#[test]
fn a_long_prompt_joins_running_answers_a_chunk_at_a_time() {
    use backpack_engine::models::PromptProgress;

    let greedy = |n| GenerateParams {
        max_tokens: n,
        ..Default::default()
    };
    let short = Prompt::Raw("a short request".into());
    let long = Prompt::Raw(format!("a long request: {}", "word ".repeat(8)));
    let mut single = model("tiny-qwen2", 1);
    let never = || false;
    let mut want = Vec::new();
    for p in [&short, &long] {
        let stats = single
            .generate(p, &greedy(12), &never, |_, _| {})
            .expect("alone");
        want.push(stats.tokens);
    }
    let long_tokens_in = single.tokenize(&long).expect("tokens");
    let long_ids = long_tokens_in.len();
    // Chunks of 7 tokens (`model`).
    assert!(long_ids > 3 * 7, "{long_ids} tokens");

    let mut t = model("tiny-qwen2", 2);
    let (first, piece) = t
        .start_answer(&short, &greedy(12), &[0, 1], false)
        .expect("short");
    let mut running = vec![first];
    let mut short_tokens = vec![piece.token];
    let mut chunks = 0;
    let first_chunk = std::time::Instant::now();
    while let PromptProgress::Ran { slot, reused } =
        t.run_prompt_chunk(&long_tokens_in, &[1]).expect("a chunk")
    {
        assert_eq!(slot, 1);
        // Only what its own earlier chunks ran.
        assert_eq!(reused, 7 * chunks, "chunk {chunks}");
        chunks += 1;
        for (_, piece) in t.step_answers(&mut running, &|_| false).expect("step") {
            short_tokens.push(piece.expect("piece").token);
        }
    }
    assert_eq!(chunks, (long_ids - 7).div_ceil(7), "{long_ids} tokens");
    let before_start = std::time::Instant::now();
    let (mut joined, piece) = t
        .start_answer(&long, &greedy(12), &[1], false)
        .expect("long");
    assert!(
        joined.stats().cached_tokens >= long_ids - 7,
        "{} of {long_ids} prompt tokens reused",
        joined.stats().cached_tokens
    );
    // Its stats count from the first chunk, and nothing it ran itself as cached.
    let ttft = joined.stats().ttft;
    joined.joined_in_chunks(first_chunk, 0);
    assert_eq!(joined.stats().cached_tokens, 0);
    assert!(joined.stats().ttft >= ttft + (before_start - first_chunk));
    running.push(joined);
    let mut long_tokens = vec![piece.token];
    while running.iter().any(|a| !a.stopped()) {
        for (i, piece) in t.step_answers(&mut running, &|_| false).expect("step") {
            let token = piece.expect("piece").token;
            if i == 0 {
                short_tokens.push(token);
            } else {
                long_tokens.push(token);
            }
        }
    }
    assert_eq!(short_tokens, want[0]);
    assert_eq!(long_tokens, want[1]);
    // One chunk's prompt is ready at once.
    assert_eq!(
        t.run_prompt_chunk(&t.prompt_ids(&short, &greedy(4)).expect("ids"), &[0])
            .expect("ready"),
        PromptProgress::Ready
    );
}
