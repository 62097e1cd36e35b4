use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use backpack_engine::load::DecoderSpec;
use backpack_engine::models::{DecoderModel, ModelOptions, TextModel, WeightSource};
use backpack_engine::ops::SamplerParams;
use clap::Args;

use super::{DTypeArg, KvCacheArg, QuantArg};

#[derive(Args)]
pub struct BenchArgs {
    /// An HF config.json describing the model shape; weights are random.
    #[arg(long, required_unless_present = "model", conflicts_with = "model")]
    config: Option<PathBuf>,
    /// A model to load instead (a GGUF file or an HF folder): its own weights and format.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value_t = 128)]
    prompt_len: u32,
    /// Prompt tokens one forward pass takes (default: the whole prompt at once; `generate` and
    /// `serve` take the engine's default chunk).
    #[arg(long)]
    prompt_chunk: Option<u32>,
    /// Tokens to generate.
    #[arg(long = "gen", default_value_t = 128)]
    generate: u32,
    #[arg(long, value_enum, default_value = "f16")]
    dtype: DTypeArg,
    /// Block-quantize the weight matrices (q8_0, q4_0, q4_k) or use f16.
    #[arg(long, value_enum)]
    quant: Option<QuantArg>,
    /// How the KV cache stores keys and values (default: as --dtype).
    #[arg(long, value_enum)]
    kv_cache: Option<KvCacheArg>,
    /// Keep an f16 copy of block-quantized weight matrices for prompts: prompts run about 10 %
    /// faster on GPUs with tensor cores, for 2 bytes per weight more GPU memory.
    #[arg(long)]
    f16_prompt_weights: bool,
    /// Timed repetitions (the best is reported).
    #[arg(long, default_value_t = 3)]
    repeat: u32,
    /// Also measure per-kernel GPU time of the prompt and of one decode step (timestamp
    /// queries), printed after the summary, or under "profile" with --json.
    #[arg(long)]
    profile: bool,
    /// Sampling temperature (0: greedy argmax).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: u32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Also measure the GPU's read bandwidth with a plain streaming reduction and report the
    /// fraction of it that decoding achieves, and the cost of a dependent dispatch alone.
    #[arg(long)]
    bandwidth: bool,
    /// Wait for every decode step before submitting the next (no lookahead).
    #[arg(long)]
    sync: bool,
    /// Also measure speculative decoding with these numbers of drafts a round (greedy only):
    /// the drafts are the model's own answer, each replaced with chance 1 − --acceptance.
    #[arg(long, value_delimiter = ',')]
    speculate: Vec<u32>,
    /// The chances each draft is the model's own next token (with --speculate).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    acceptance: Vec<f64>,
    /// Also measure batched decoding (a server's parallel answers) with these numbers of
    /// sequences decoding together, each after the same prompt; with --profile, the largest's
    /// step is profiled too.
    #[arg(long, value_delimiter = ',')]
    parallel: Vec<u32>,
    /// Print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

struct Run {
    prefill: Duration,
    /// Host time recording and submitting the prompt's forward pass.
    prefill_encode: Duration,
    decode: Duration,
    encode: Duration,
}

pub fn run(args: BenchArgs, adapter: Option<&str>) -> Result<()> {
    let gpu = super::open_gpu(adapter)?;
    let context = args.prompt_len + args.generate + 1;
    let options = ModelOptions {
        dtype: args.dtype.into(),
        context: Some(context),
        prefill_chunk: Some(args.prompt_chunk.unwrap_or(args.prompt_len).max(1)),
        lookahead: !args.sync,
        quantize: args.quant.and_then(QuantArg::block_format),
        kv_cache: args.kv_cache.map(Into::into),
        f16_prompt_weights: args.f16_prompt_weights,
        // Every run feeds the same prompt: a cache of the last one would time a single token.
        prefix_cache: false,
        slots: args.parallel.iter().copied().max().unwrap_or(1),
        // Verifications are timed on the model itself; a speculating model has what they
        // need (the few-row int8 products' rows).
        speculate: args.speculate.iter().copied().max().map(|tokens| {
            backpack_engine::models::speculate::Speculation {
                draft: None,
                tokens,
                paced: false,
            }
        }),
        ..Default::default()
    };
    let build_start = Instant::now();
    let (mut model, source) = match (&args.model, &args.config) {
        (Some(path), _) => {
            let loaded = TextModel::load(&gpu, path, &options)
                .with_context(|| format!("loading {}", path.display()))?;
            (loaded.model, path.clone())
        }
        (None, Some(config)) => {
            let spec = DecoderSpec::from_file(config)
                .with_context(|| format!("reading {}", config.display()))?;
            let model =
                DecoderModel::build(&gpu, &spec, WeightSource::Random { seed: 1 }, &options)?;
            (model, config.clone())
        }
        (None, None) => anyhow::bail!("give --config or --model"),
    };
    let spec = model.spec().clone();
    gpu.wait()?;
    let build = build_start.elapsed();
    model.set_sampler(&SamplerParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        ..Default::default()
    });
    // Deterministic pseudo-random prompt.
    let prompt: Vec<u32> = (0..args.prompt_len.max(1))
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 7) % spec.vocab)
        .collect();
    let one_run = |model: &mut DecoderModel| -> Result<Run> {
        let t = Instant::now();
        model.prefill(&prompt)?;
        let prefill = t.elapsed();
        anyhow::ensure!(
            model.last_prompt_reused() == 0,
            "the timed prompt came from the prompt cache"
        );
        let prefill_encode = model.last_prompt_encode_time();
        let t = Instant::now();
        let mut encode = Duration::ZERO;
        for _ in 1..args.generate.max(1) {
            model.decode()?;
            encode += model.last_encode_time();
        }
        Ok(Run {
            prefill,
            prefill_encode,
            decode: t.elapsed(),
            encode,
        })
    };
    one_run(&mut model)?; // warm-up: pipelines, caches, clocks
    let mut best: Option<Run> = None;
    for _ in 0..args.repeat.max(1) {
        let r = one_run(&mut model)?;
        // The fastest prompt and the fastest decode, each with its own encode time.
        best = Some(match best {
            Some(b) => {
                let prompt = if b.prefill <= r.prefill { &b } else { &r };
                let (prefill, prefill_encode) = (prompt.prefill, prompt.prefill_encode);
                let decode = if b.decode <= r.decode { b } else { r };
                Run {
                    prefill,
                    prefill_encode,
                    ..decode
                }
            }
            None => r,
        });
    }
    let best = best.context("no runs")?;
    let decoded = f64::from(args.generate.max(1) - 1);
    let prefill_tps = f64::from(prompt.len() as u32) / best.prefill.as_secs_f64();
    let decode_tps = decoded / best.decode.as_secs_f64();
    let encode_us = best.encode.as_secs_f64() * 1e6 / decoded.max(1.0);
    // What a decoded token reads (mixture-of-experts models: only the chosen experts).
    let weights_gb = model.decode_read_bytes() as f64 / 1e9;
    let (bandwidth, floor_us) = if args.bandwidth {
        (Some(read_bandwidth(&gpu)?), Some(dispatch_floor_us(&gpu)?))
    } else {
        (None, None)
    };
    let dispatches = model.dispatches_per_token();
    if !args.speculate.is_empty() && args.temperature > 0.0 {
        anyhow::bail!("--speculate measures greedy decoding: leave --temperature at 0");
    }
    let shapes: Vec<(u32, f64)> = args
        .speculate
        .iter()
        .flat_map(|&k| args.acceptance.iter().map(move |&a| (k, a)))
        .collect();
    let speculative = if shapes.is_empty() {
        Vec::new()
    } else {
        super::bench_speculative::measure(&mut model, &prompt, args.generate, &shapes, args.repeat)?
    };
    let batched = if args.parallel.is_empty() {
        Vec::new()
    } else {
        super::bench_batch::measure(
            &mut model,
            &prompt,
            args.generate,
            &args.parallel,
            args.repeat,
        )?
    };
    let batch_profile = match args.parallel.iter().max() {
        Some(&n) if args.profile => {
            let slots: Vec<u32> = (0..n).collect();
            for &slot in &slots {
                model.select_slot(slot)?;
                model.prefill(&prompt)?;
            }
            let timings = model.profile_batch(&slots)?;
            model.select_slot(0)?;
            Some((n, timings))
        }
        _ => None,
    };
    // After the timed runs: timestamp queries slow the GPU down a little.
    let profile = if args.profile {
        let prefill = model.profile_prefill(&prompt)?;
        // Read before the decode step routes anew.
        let routing = model.prompt_expert_counts()?;
        Some((prefill, routing, model.profile_decode()?))
    } else {
        None
    };
    let verify_profile = match args.speculate.first() {
        Some(&k) if args.profile => {
            model.prefill(&prompt)?;
            Some((k, model.profile_verify(&prompt[..k as usize])?))
        }
        _ => None,
    };
    if args.json {
        let mut out = serde_json::json!({
            "config": source.display().to_string(),
            "adapter": gpu.info().name,
            "dtype": format!("{:?}", model.dtype()).to_lowercase(),
            "quant": args.quant.map(|q| format!("{q:?}").to_lowercase()),
            "parameters": spec.parameters(),
            "weight_bytes": model.weight_bytes(),
            "decode_read_bytes": model.decode_read_bytes(),
            "prompt_len": prompt.len(),
            "prompt_chunk": model.prompt_chunk(),
            "gen": args.generate,
            "lookahead": !args.sync,
            "temperature": args.temperature,
            "top_k": args.top_k,
            "top_p": args.top_p,
            "prefill_tok_s": prefill_tps,
            "ttft_ms": best.prefill.as_secs_f64() * 1e3,
            "prefill_encode_ms": best.prefill_encode.as_secs_f64() * 1e3,
            "decode_tok_s": decode_tps,
            "decode_ms_per_token": 1e3 / decode_tps,
            "dispatches_per_token": dispatches,
            "encode_us_per_token": encode_us,
            "weight_read_gb_s": weights_gb * decode_tps,
            "read_bandwidth_gb_s": bandwidth,
            "bandwidth_fraction": bandwidth.map(|b| weights_gb * decode_tps / b),
            "dispatch_floor_us": floor_us,
        });
        if !speculative.is_empty() {
            out["speculative"] = speculative.iter().map(|s| s.json()).collect();
        }
        if !batched.is_empty() {
            out["batched"] = batched.iter().map(|b| b.json()).collect();
        }
        if let Some((prefill, routing, decode)) = &profile {
            out["profile"] = serde_json::json!({
                "prefill": timings_json(prefill),
                "prompt_expert_counts": routing,
                "decode": timings_json(decode),
            });
        }
        println!("{out}");
    } else {
        print_summary(&Summary {
            source: &source,
            spec: &spec,
            model: &model,
            adapter: gpu.describe(),
            build,
            prompt_len: prompt.len(),
            prefill: best.prefill,
            prefill_encode: best.prefill_encode,
            prefill_tps,
            decode_tps,
            decoded,
            dispatches,
            encode_us,
            bandwidth,
            floor_us,
        });
        for s in &speculative {
            s.print();
        }
        if let Some((prefill, routing, decode)) = profile {
            print_timings("the prompt", prefill);
            if let Some(counts) = routing {
                print_expert_counts(&counts);
            }
            print_timings("one decode step", decode);
        }
        if let Some((k, verify)) = verify_profile {
            print_timings(&format!("one verification of {k} drafts"), verify);
        }
        for b in &batched {
            b.print();
        }
        if let Some((n, timings)) = batch_profile {
            print_timings(&format!("one batched step of {n} sequences"), timings);
        }
    }
    Ok(())
}

struct Summary<'a> {
    source: &'a std::path::Path,
    spec: &'a DecoderSpec,
    model: &'a DecoderModel,
    adapter: String,
    build: Duration,
    prompt_len: usize,
    prefill: Duration,
    prefill_encode: Duration,
    prefill_tps: f64,
    decode_tps: f64,
    decoded: f64,
    dispatches: u32,
    encode_us: f64,
    bandwidth: Option<f64>,
    floor_us: Option<f64>,
}

fn print_summary(s: &Summary<'_>) {
    let weights_gb = s.model.decode_read_bytes() as f64 / 1e9;
    println!(
        "model        {} ({:.0}M params, {} layers)",
        s.source.display(),
        s.spec.parameters() as f64 / 1e6,
        s.spec.layers
    );
    println!("adapter      {}", s.adapter);
    println!(
        "weights      {:.1} MiB {:?} (built in {:.2} s)",
        s.model.weight_bytes() as f64 / (1 << 20) as f64,
        s.model.dtype(),
        s.build.as_secs_f64()
    );
    println!(
        "prefill      {:.0} tok/s ({} tokens in chunks of up to {}, TTFT {:.2} ms, {:.2} ms of it recording on the CPU)",
        s.prefill_tps,
        s.prompt_len,
        s.model.prompt_chunk(),
        s.prefill.as_secs_f64() * 1e3,
        s.prefill_encode.as_secs_f64() * 1e3
    );
    println!(
        "decode       {:.1} tok/s ({:.3} ms/token, {} tokens)",
        s.decode_tps,
        1e3 / s.decode_tps,
        s.decoded
    );
    println!(
        "dispatches   {} per token ({:.2} per layer)",
        s.dispatches,
        f64::from(s.dispatches) / f64::from(s.spec.layers)
    );
    println!("encode       {:.1} µs CPU per token", s.encode_us);
    println!("weight read  {:.0} GB/s", weights_gb * s.decode_tps);
    if let Some(b) = s.bandwidth {
        println!(
            "bandwidth    {:.0} GB/s streaming read; decode reads weights at {:.0}% of it",
            b,
            100.0 * weights_gb * s.decode_tps / b
        );
    }
    if let Some(us) = s.floor_us {
        println!(
            "dispatch     {us:.1} µs alone (a chain of tiny dependent ones): {:.2} ms of each token",
            us * f64::from(s.dispatches) / 1e3
        );
    }
}

fn timings_json(timings: &[backpack_engine::gpu::KernelTiming]) -> serde_json::Value {
    timings
        .iter()
        .map(|t| serde_json::json!({"label": t.label, "calls": t.calls, "us": t.total_ns / 1e3}))
        .collect()
}

fn print_timings(what: &str, timings: Vec<backpack_engine::gpu::KernelTiming>) {
    let total: f64 = timings.iter().map(|t| t.total_ns).sum();
    println!(
        "per-kernel GPU time of {what} ({:.1} µs in all):",
        total / 1e3
    );
    for t in timings {
        println!(
            "  {:>9.1} µs  {:>4} calls  {}",
            t.total_ns / 1e3,
            t.calls,
            t.label
        );
    }
}

/// The best of `repeats` timings of `chain` encodings of one operation in one submission (after
/// one untimed submission: pipelines, clocks), waited for.
fn best_chain(
    gpu: &backpack_engine::gpu::Gpu,
    chain: u32,
    repeats: u32,
    encode: impl Fn(&mut backpack_engine::gpu::Recorder<'_>),
) -> Result<Duration> {
    let run = || -> Result<Duration> {
        let t = Instant::now();
        let mut rec = backpack_engine::gpu::Recorder::new(gpu);
        for _ in 0..chain {
            encode(&mut rec);
        }
        rec.submit();
        gpu.wait()?;
        Ok(t.elapsed())
    };
    run()?;
    (0..repeats)
        .map(|_| run())
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .min()
        .context("runs")
}

/// GB/s of a plain streaming read (a sum over the largest buffer the GPU binds, up to 1 GiB).
fn read_bandwidth(gpu: &backpack_engine::gpu::Gpu) -> Result<f64> {
    use backpack_engine::ops::{SumReduce, WeightDType, fill_random};
    let bytes =
        (1u64 << 30).min(gpu.caps().max_storage_binding.min(gpu.caps().max_buffer)) / 16 * 16;
    let input = gpu.storage("bandwidth input", bytes)?;
    fill_random(gpu, &input, WeightDType::F32, 7, 1.0, false)?;
    let groups = 4096;
    let partials = gpu.storage("bandwidth partials", u64::from(groups) * 4)?;
    let op = SumReduce::new(gpu, &input, &partials, groups)?;
    const READS: u32 = 30;
    let best = best_chain(gpu, READS, 3, |rec| op.encode(rec))?;
    Ok(f64::from(READS) * bytes as f64 / best.as_secs_f64() / 1e9)
}

/// µs per dispatch in a chain of tiny dependent dispatches (a 32×256 product writing the same
/// output each time, so each waits for the last; one submit per 200): what each of a decode
/// step's dispatches costs before it reads anything.
fn dispatch_floor_us(gpu: &backpack_engine::gpu::Gpu) -> Result<f64> {
    use backpack_engine::ops::{MatVec, MatVecOptions, Matrix, StepParams, WeightDType};
    const CHAIN: u32 = 200;
    let data: Vec<f32> = (0..32 * 256).map(|i| (i % 7) as f32 / 7.0).collect();
    let w = Matrix::from_f32(gpu, "floor weights", &data, 32, 256, WeightDType::F16)?;
    let x = gpu.storage("floor input", 256 * 4)?;
    let y = gpu.storage("floor output", 32 * 4)?;
    let step = gpu.uniform("floor step", &StepParams::new(0, 1));
    let op = MatVec::new(gpu, &w, &x, &y, &step, MatVecOptions::default())?;
    let best = best_chain(gpu, CHAIN, 5, |rec| op.encode(rec))?;
    Ok(best.as_secs_f64() * 1e6 / f64::from(CHAIN))
}

/// How the prompt's assignments spread over the experts in its last sparse layer: the
/// prompts' expert tiles take up to 64 assignments of one expert each.
fn print_expert_counts(counts: &[u32]) {
    let mut sorted = counts.to_vec();
    sorted.sort_unstable();
    let used = sorted.iter().filter(|&&c| c > 0).count();
    let tiles: u32 = counts.iter().map(|c| c.div_ceil(64)).sum();
    let total: u32 = counts.iter().sum();
    println!(
        "the prompt's last sparse layer: {total} assignments over {used} of {} experts \
         (fewest {}, median {}, most {}), {tiles} tiles of 64",
        counts.len(),
        sorted.first().unwrap_or(&0),
        sorted.get(sorted.len() / 2).unwrap_or(&0),
        sorted.last().unwrap_or(&0),
    );
}
