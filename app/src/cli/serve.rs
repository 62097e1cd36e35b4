use std::path::PathBuf;

use anyhow::Result;
use backpack_app::serve::{ServeOptions, serve};
use clap::Args;

use super::{DTypeArg, KvCacheArg, QuantArg};

#[derive(Args)]
pub struct ServeArgs {
    /// A model to serve: a text model (HF folder, .gguf file), a Whisper folder, or a diffusers
    /// folder / single-file checkpoint, or the repo id of an installed one; repeat for one of
    /// each kind.
    #[arg(long, required = true)]
    model: Vec<PathBuf>,
    /// Address to listen on; anything but a loopback address is reachable from the network.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every request (also BACKPACK_API_KEY).
    #[arg(long, env = "BACKPACK_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Context length to allocate (default 4096, capped by the model).
    #[arg(long)]
    context: Option<u32>,
    /// Requests running or queued at once; more are answered 429.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Text answers decoded together on the GPU, each in a KV cache of --context tokens of
    /// its own (default: as many as the GPU's free memory holds beside the weights, up to 8,
    /// or 4 where the driver does not report its free memory; 1 with speculative decoding,
    /// which drafts for one answer at a time; halved until the caches fit where the GPU runs
    /// out of memory). Requests beyond it wait in the queue.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    parallel: Option<u32>,
    /// With --parallel above 1, give every answer the tokens it gets alone at the same
    /// settings, whatever else is decoded with it: a lone answer takes the batched step too,
    /// the batched products never change kernels with the number of answers, and prompts run
    /// whole (no cached prefix). Slower at one client, with many clients, and for prompts
    /// sharing a prefix.
    #[arg(long)]
    batch_invariant: bool,
    /// Storage type of weights and KV cache on the GPU.
    #[arg(long, value_enum, default_value = "f16")]
    dtype: DTypeArg,
    /// Quantize weight matrices while loading (q8_0, q4_0, q4_k) or store them as f16.
    #[arg(long, value_enum)]
    quant: Option<QuantArg>,
    /// How the KV cache stores keys and values (default: as --dtype).
    #[arg(long, value_enum)]
    kv_cache: Option<KvCacheArg>,
    /// Keep an f16 copy of block-quantized weight matrices for prompts: prompts run about 10 %
    /// faster on GPUs with tensor cores, for 2 bytes per weight more GPU memory.
    #[arg(long)]
    f16_prompt_weights: bool,
    #[command(flatten)]
    speculate: super::SpeculateArgs,
}

/// The most answers decoded together when --parallel is not given (fewer as the GPU's free
/// memory holds).
const DEFAULT_MOST_PARALLEL: u32 = 8;

pub fn run(args: ServeArgs, adapter: Option<&str>) -> Result<()> {
    let models = args
        .model
        .iter()
        .map(|m| super::generate::resolve_model(m))
        .collect::<Result<Vec<_>>>()?;
    let gpu = super::open_gpu(adapter)?;
    let mut load = super::model_options(
        args.dtype,
        args.quant,
        args.context,
        args.kv_cache,
        args.f16_prompt_weights,
    );
    load.speculate = args.speculate.speculation()?;
    load.slots = match (args.parallel, &load.speculate) {
        (Some(n), Some(_)) if n > 1 => anyhow::bail!(
            "--parallel {n} cannot go with speculative decoding, which drafts for one answer at a time"
        ),
        (Some(n), _) => n,
        (None, Some(_)) => 1,
        (None, None) => {
            load.fit_slots = true;
            DEFAULT_MOST_PARALLEL
        }
    };
    load.batch_invariant = args.batch_invariant;
    let opts = ServeOptions {
        host: args.host,
        port: args.port,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        queue: args.queue,
        ..Default::default()
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(serve(gpu, models, load, opts))
}
