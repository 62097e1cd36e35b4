use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use backpack_engine::grammar::Constraint;
use backpack_engine::load::{ChatMessage, ReasoningEffort};
use backpack_engine::models::reasoning::split_reasoning;
use backpack_engine::models::{GenerateParams, Prompt};
use backpack_engine::ops::SamplerParams;
use backpack_engine::remote::ChatParams;
use backpack_engine::runtime::{Engine, Event};
use clap::Args;

use super::{DTypeArg, KvCacheArg, QuantArg};

#[derive(Args)]
pub struct GenerateArgs {
    /// Model: a folder (HF layout: config.json, *.safetensors, tokenizer.json), a .gguf file, or
    /// the repo id of an installed model (see `backpack models`); with --endpoint, the name of
    /// one of the server's models.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
    /// The prompt: one user message put through the model's chat template.
    #[arg(long)]
    prompt: String,
    /// Feed the prompt as-is instead of through the chat template.
    #[arg(long)]
    raw: bool,
    /// A system message placed before the prompt (chat mode).
    #[arg(long)]
    system: Option<String>,
    /// Answer without thinking first, for models whose chat template has the switch (Qwen3's
    /// `enable_thinking`).
    #[arg(long)]
    no_think: bool,
    /// How hard a reasoning model thinks, for models whose chat template takes it (GPT-OSS's
    /// `reasoning_effort`; its default is medium).
    #[arg(long, value_enum)]
    reasoning_effort: Option<EffortArg>,
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    /// 0 picks the most likely token every time (greedy). Default: greedy (with --endpoint,
    /// the server's default).
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    top_k: Option<u32>,
    #[arg(long)]
    repeat_penalty: Option<f32>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Storage type of weights and KV cache on the GPU (arithmetic is f32 either way).
    #[arg(long, value_enum, default_value = "f16")]
    dtype: DTypeArg,
    /// Quantize weight matrices while loading (q8_0, q4_0, q4_k) or store them as f16. GGUF
    /// files keep their own quantization.
    #[arg(long, value_enum, conflicts_with = "endpoint")]
    quant: Option<QuantArg>,
    /// Context length to allocate (default 4096, capped by the model).
    #[arg(long, conflicts_with = "endpoint")]
    context: Option<u32>,
    /// How the KV cache stores keys and values (default: as --dtype); q8_0 halves it.
    #[arg(long, value_enum, conflicts_with = "endpoint")]
    kv_cache: Option<KvCacheArg>,
    /// Keep an f16 copy of block-quantized weight matrices for prompts: prompts run about 10 %
    /// faster on GPUs with tensor cores, for 2 bytes per weight more GPU memory.
    #[arg(long, conflicts_with = "endpoint")]
    f16_prompt_weights: bool,
    /// Hold the answer to a grammar: GBNF as llama.cpp takes it (`root ::= ...`), or
    /// llguidance's Lark (`start: ...`, which may embed `%json {...}`).
    #[arg(long, conflicts_with_all = ["grammar_file", "json_schema", "endpoint"])]
    grammar: Option<String>,
    /// As --grammar, read from a file (.gbnf or .lark).
    #[arg(long, conflicts_with_all = ["json_schema", "endpoint"])]
    grammar_file: Option<PathBuf>,
    /// Hold the answer to a JSON schema (the schema's text, or @FILE): the output always
    /// parses and validates.
    #[arg(long, conflicts_with = "endpoint")]
    json_schema: Option<String>,
    #[command(flatten)]
    speculate: super::SpeculateArgs,
    /// Print one JSON object with ids, text and timings after the text: `text` is the reply,
    /// `reasoning` what a reasoning model thought first (null if it did not, or with --raw).
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum EffortArg {
    Low,
    Medium,
    High,
}

impl From<EffortArg> for ReasoningEffort {
    fn from(e: EffortArg) -> Self {
        match e {
            EffortArg::Low => Self::Low,
            EffortArg::Medium => Self::Medium,
            EffortArg::High => Self::High,
        }
    }
}

/// A path as given, or the installed model of that repo id.
pub fn resolve_model(model: &std::path::Path) -> Result<PathBuf> {
    if model.exists() {
        return Ok(model.to_owned());
    }
    let text = model.to_string_lossy();
    if backpack_engine::hub::valid_repo_id(&text) {
        let data = backpack_app::gui::store::default_data_dir();
        let library =
            backpack_engine::hub::Library::new(backpack_app::hub::default_models_dir(&data));
        if let Some(installed) = library.find(&text) {
            return Ok(installed.model_path());
        }
        // A model another tool downloaded into the Hugging Face cache is used where it is.
        if let Some(found) = backpack_engine::hub::SearchRoots::from_env()
            .find()
            .into_iter()
            .find(|m| {
                m.source == backpack_engine::hub::FoundSource::HuggingFaceCache
                    && (m.name == text || m.name.starts_with(&format!("{text}/")))
            })
        {
            return Ok(found.path);
        }
        bail!(
            "{text} is neither a path nor an installed model; download it with `backpack models download {text}`"
        );
    }
    bail!("model path {} does not exist", model.display())
}

/// The grammar `--grammar`, `--grammar-file` or `--json-schema` gives.
fn constraint(args: &GenerateArgs) -> Result<Option<Constraint>> {
    let grammar = match (&args.grammar, &args.grammar_file) {
        (Some(text), _) => Some(text.clone()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the grammar {}", path.display()))?,
        ),
        (None, None) => None,
    };
    if let Some(text) = grammar {
        return Ok(Some(if text.contains("::=") {
            Constraint::Gbnf(text)
        } else {
            Constraint::Lark(text)
        }));
    }
    let Some(schema) = &args.json_schema else {
        return Ok(None);
    };
    let (text, source) = match schema.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| format!("reading the schema {path}"))?,
            path.to_owned(),
        ),
        None => (schema.clone(), "--json-schema".to_owned()),
    };
    let schema: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{source} is not JSON"))?;
    Ok(Some(Constraint::JsonSchema {
        schema,
        strict: true,
    }))
}

/// The answer from `--endpoint`'s model.
fn run_remote(args: &GenerateArgs, url: &str) -> Result<()> {
    let params = ChatParams {
        max_tokens: Some(args.max_tokens),
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        repeat_penalty: args.repeat_penalty,
        thinking: args.no_think.then_some(false),
        seed: Some(args.seed),
        stop: Vec::new(),
    };
    let prompt = super::remote::RemotePrompt {
        model: &args.model.to_string_lossy(),
        prompt: &args.prompt,
        system: args.system.as_deref(),
        raw: args.raw,
        params,
        json: args.json,
    };
    super::remote::generate(&args.remote, url, prompt)
}

pub fn run(args: GenerateArgs, adapter: Option<&str>) -> Result<()> {
    if let Some(url) = &args.remote.endpoint {
        return run_remote(&args, url);
    }
    let model = resolve_model(&args.model)?;
    let gpu = super::open_gpu(adapter)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let (engine, mut events) = Engine::spawn(gpu, None);
        let mut options = super::model_options(
            args.dtype,
            args.quant,
            args.context,
            args.kv_cache,
            args.f16_prompt_weights,
        );
        options.speculate = args.speculate.speculation()?;
        engine.load(model, options);
        let info = match events.recv().await {
            Some(Event::Loaded(info)) => info,
            Some(Event::Error { message, .. }) => bail!("{message}"),
            _ => bail!("the engine stopped while loading the model"),
        };
        eprintln!(
            "loaded {} ({}, {:.1}M parameters, {:.1} MiB of weights on the GPU ({} where not block-quantized), context {})",
            info.name,
            info.architecture,
            info.parameters as f64 / 1e6,
            info.weight_bytes as f64 / (1 << 20) as f64,
            info.dtype,
            info.context
        );
        let prompt = if args.raw {
            Prompt::Raw(args.prompt.clone())
        } else {
            if !info.has_chat_template {
                bail!("{} has no chat template; pass --raw to feed the prompt as-is", info.name);
            }
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", &args.prompt));
            Prompt::Chat(messages)
        };
        let sampler = SamplerParams {
            temperature: args.temperature.unwrap_or(0.0),
            top_k: args.top_k.unwrap_or(0),
            top_p: args.top_p.unwrap_or(1.0),
            repeat_penalty: args.repeat_penalty.unwrap_or(1.0),
            seed: args.seed,
        };
        let request = engine.generate(
            prompt,
            GenerateParams {
                max_tokens: args.max_tokens,
                sampler,
                thinking: args.no_think.then_some(false),
                reasoning_effort: args.reasoning_effort.map(Into::into),
                constraint: constraint(&args)?,
                tools: Vec::new(),
            },
        );
        let mut tokens = Vec::new();
        let mut text = String::new();
        let mut stdout = std::io::stdout();
        while let Some(event) = events.recv().await {
            match event {
                Event::Token {
                    request: r,
                    id,
                    text_delta,
                } if r == request => {
                    tokens.push(id);
                    text.push_str(&text_delta);
                    stdout.write_all(text_delta.as_bytes())?;
                    stdout.flush()?;
                }
                Event::Done {
                    request: r,
                    prompt_ids,
                    ttft,
                    prompt_time,
                    tokens_per_s,
                    stop,
                    drafts,
                    ..
                } if r == request => {
                    writeln!(stdout)?;
                    eprintln!(
                        "{} prompt tokens, {} generated ({stop:?}), time to first token {:.1} ms, {:.1} tokens/s",
                        prompt_ids.len(),
                        tokens.len(),
                        ttft.as_secs_f64() * 1e3,
                        tokens_per_s
                    );
                    if drafts.drafted > 0 {
                        eprintln!(
                            "speculation: {} of {} drafted tokens kept ({:.0} %)",
                            drafts.accepted,
                            drafts.drafted,
                            100.0 * drafts.accepted as f64 / drafts.drafted as f64
                        );
                    }
                    if args.json {
                        // A raw prompt's continuation is reported as it came.
                        let (reasoning, reply) = if args.raw {
                            (None, text.clone())
                        } else {
                            split_reasoning(&text)
                        };
                        let line = serde_json::json!({
                            "prompt_tokens": prompt_ids,
                            "tokens": tokens,
                            "text": reply,
                            "reasoning": reasoning,
                            "ttft_ms": ttft.as_secs_f64() * 1e3,
                            "prompt_ms": prompt_time.map(|t| t.as_secs_f64() * 1e3),
                            "tokens_per_s": tokens_per_s,
                            "dispatches_per_token": info.dispatches_per_token,
                            "drafted_tokens": drafts.drafted,
                            "accepted_tokens": drafts.accepted,
                        });
                        writeln!(stdout, "{line}")?;
                    }
                    return Ok(());
                }
                Event::Error { message, .. } => bail!("{message}"),
                _ => {}
            }
        }
        bail!("the engine stopped before finishing")
    })
    .context("generation failed")
}
