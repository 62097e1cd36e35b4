//! The shared builder: uploads a family's weights (see `family.rs`), allocates activations and
//! the KV cache, and creates every kernel of the decode and prompt passes.

use bytemuck::Zeroable;

use crate::Error;
use crate::gpu::{Gpu, StorageBuffer};
use crate::load::DecoderSpec;
use crate::ops::{
    BatchRows, DeltaScratch, Dequantize, Embed, FEW_ROWS, Int8Handoff, Int8Rows, MAX_SPLITS,
    MatMul, MatVec, MatVecLayout, MatVecOptions, Matrix, MoeBuffers, NormKind, RopeTable, Sample,
    SamplerParams, StepParams, WeightDType,
};

mod cache;
mod layer;

use super::super::weights::{Part, Uploader, WeightSource};
use super::family::{LayerWeights, family_of, norm_pair};
use super::{
    Activations, DEFAULT_CONTEXT, DEFAULT_PREFILL_CHUNK, DecoderModel, Handoffs, ModelOptions,
    PIPELINE_DEPTH, PromptWeights, embedding_clone,
};
pub(super) use cache::cache_shape;
use layer::LayerContext;

/// Everything read from the checkpoint.
struct Uploaded {
    embedding: Matrix,
    /// Learned positions `[max_positions][hidden]`, dense.
    positions: Option<StorageBuffer>,
    layers: Vec<LayerWeights>,
    final_norm: (StorageBuffer, Option<StorageBuffer>),
    /// None: the LM head is the embedding.
    lm_head: Option<Matrix>,
    bytes: u64,
}

/// Random weights only: a mixture-of-experts model's token embedding this many times larger
/// than its other matrices' scale. Each random layer's attention adds nearly the same vector
/// (the context's average) to every later token and would swamp the embedding, so that a
/// whole prompt would choose the same few experts; trained routers spread it over nearly all
/// of them, and the prompts' expert tiles are timed as full as they are then (the same
/// factor as tests/reference/make_bench_gguf.py's MOE_EMBEDDING_SCALE).
const MOE_RANDOM_EMBEDDING_GAIN: f32 = 3000.0;

fn upload(up: &mut Uploader<'_>, spec: &DecoderSpec) -> Result<Uploaded, Error> {
    let family = family_of(spec.arch);
    let prefix = family.prefix(up);
    let name = |n| family.name(prefix, n, 0);
    let d = spec.hidden;
    let embed_name = name(family.embedding);
    let embedding_parts = [Part {
        name: &embed_name,
        rows: spec.vocab,
        cols: d,
    }];
    // The embedding (which also serves a tied LM head) keeps a GGUF file's block format; one
    // added to learned positions on gather stays dense.
    let gain = if spec.moe.is_some() {
        MOE_RANDOM_EMBEDDING_GAIN
    } else {
        1.0
    };
    let embedding = up.with_random_gain(gain, |up| {
        if family.positions.is_some() {
            up.dense_matrix("token embedding", &embedding_parts, false)
        } else {
            up.matrix("token embedding", &embedding_parts, false)
        }
    })?;
    let positions = family
        .positions
        .map(|p| up.dense("position embedding", &name(p), spec.max_positions, d))
        .transpose()?;
    let layers = (0..spec.layers)
        .map(|i| family.load_layer(up, spec, prefix, i))
        .collect::<Result<Vec<_>, _>>()?;
    let final_norm = norm_pair(
        up,
        "final norm",
        &name(family.final_norm),
        family.final_norm_bias.map(name).as_deref(),
        d,
        family.norm_offset(up),
    )?;
    let head_name = name(family.lm_head);
    let lm_head = if !spec.tied_embeddings && up.has(&head_name) {
        Some(up.matrix(
            "lm head",
            &[Part {
                name: &head_name,
                rows: spec.vocab,
                cols: d,
            }],
            false,
        )?)
    } else {
        None
    };
    Ok(Uploaded {
        embedding,
        positions,
        layers,
        final_norm,
        lm_head,
        bytes: up.bytes,
    })
}

impl Activations {
    fn new(
        gpu: &Gpu,
        spec: &DecoderSpec,
        chunk: u32,
        capacity: u32,
        dtype: WeightDType,
        slots: u32,
        int8_rows: u32,
    ) -> Result<Self, Error> {
        let f = |n: u32| u64::from(n) * 4;
        let (t, d, hd, heads) = (chunk, spec.hidden, spec.head_dim, spec.heads);
        let linear = spec.linear.as_ref().map(|l| &l.shape);
        let RowWidths {
            qkv: qkv_width,
            attn: attn_width,
            delta_in: delta_in_width,
            gate_up: gate_up_width,
        } = RowWidths::of(gpu, spec);
        Ok(Self {
            x: gpu.storage("x", f(t * d))?,
            xn: gpu.storage("x normed", f(t * d))?,
            qkv: gpu.storage("qkv", f(t * qkv_width))?,
            q: gpu.storage("q", f(t * heads * hd))?,
            attn: gpu.storage("attention out", f(t * attn_width))?,
            // Tensor-core products gate in their epilogue, straight into `h`.
            gate_up: if gate_up_width > 0 {
                Some(gpu.storage("gate_up", f(t * gate_up_width))?)
            } else {
                None
            },
            branch: if spec.post_norms {
                Some(gpu.storage("attention/MLP output", f(t * d))?)
            } else {
                None
            },
            h: gpu.storage("mlp hidden", f(t * spec.intermediate))?,
            moe: spec
                .moe
                .as_ref()
                .map(|m| MoeBuffers::new(gpu, m, spec.hidden, chunk))
                .transpose()?,
            shared_gate: if spec.moe.as_ref().is_some_and(|m| m.shared) {
                Some(gpu.storage("shared expert gate", f(t.max(4)))?)
            } else {
                None
            },
            delta: linear
                .map(|shape| DeltaScratch::new(gpu, shape, chunk))
                .transpose()?,
            // z with the gates, or the gates alone: at most two products after q/k/v's.
            delta_in: match linear {
                Some(_) => {
                    let rows =
                        |k| gpu.storage(&format!("delta-net inputs {k}"), f(t * delta_in_width));
                    vec![rows(1)?, rows(2)?]
                }
                None => Vec::new(),
            },
            // Padded to whole vec4 words for the sampler.
            logits: gpu.storage("logits", f(spec.vocab.div_ceil(4) * 4))?,
            // A history and a seen set per slot, one after another.
            history: gpu.storage("token history", f(slots * (capacity + 1)))?,
            seen: gpu.storage("seen tokens", f(slots * spec.vocab.div_ceil(32)))?,
            split_partials: gpu.storage("attention runs", f(MAX_SPLITS * heads * hd))?,
            split_stats: gpu.storage("attention run stats", f(2 * MAX_SPLITS * heads))?,
            handoffs: Handoffs::new(gpu, spec, dtype)?,
            batch_rows: (slots > 1).then(|| gpu.uniform("batch rows", &BatchRows::zeroed())),
            batch_int8: if int8_rows > 0 {
                let cols = d.max(spec.intermediate).max(attn_width);
                Some(Int8Rows::new(gpu, int8_rows, cols)?)
            } else {
                None
            },
        })
    }

    /// Bytes of the buffers [`Activations::new`] sizes by the prompt chunk, per row of it.
    fn row_bytes(gpu: &Gpu, spec: &DecoderSpec) -> u64 {
        let widths = RowWidths::of(gpu, spec);
        let (d, inter) = (u64::from(spec.hidden), u64::from(spec.intermediate));
        let branch = if spec.post_norms { d } else { 0 };
        let dense = 2 * d
            + u64::from(widths.qkv)
            + u64::from(spec.heads * spec.head_dim)
            + u64::from(widths.attn)
            + u64::from(widths.gate_up)
            + branch
            + inter
            + 2 * u64::from(widths.delta_in);
        let moe = spec
            .moe
            .as_ref()
            .map_or(0, |m| crate::ops::moe_buffer_bytes(m, spec.hidden, 1));
        let delta = spec
            .linear
            .as_ref()
            .map_or(0, |l| DeltaScratch::row_bytes(&l.shape));
        4 * dense + moe + delta
    }

    /// Bytes per chunk row of the widest buffer [`Activations::new`] sizes by the chunk (each
    /// must fit one binding).
    fn largest_row_bytes(gpu: &Gpu, spec: &DecoderSpec) -> u64 {
        let widths = RowWidths::of(gpu, spec);
        let widest = [
            widths.qkv,
            widths.attn,
            widths.gate_up,
            spec.intermediate,
            spec.hidden,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let experts = spec.moe.as_ref().map_or(0, |m| {
            u64::from(m.top_k) * u64::from(m.intermediate.max(spec.hidden))
        });
        4 * u64::from(widest).max(experts)
    }
}

/// Values a prompt row takes in the activations wider than the residual stream.
struct RowWidths {
    /// The QKV product's rows: gated attention's query product carries a gate head per query
    /// head; a Gated DeltaNet layer's stacked input product is wider still.
    qkv: u32,
    /// Attention's outputs, or a Gated DeltaNet layer's (which may be wider).
    attn: u32,
    /// A Gated DeltaNet layer's z and gate rows (zero without such layers).
    delta_in: u32,
    /// The gate/up product's rows where the product does not gate in its epilogue (zero
    /// where it does, or the MLP is not gated).
    gate_up: u32,
}

impl RowWidths {
    fn of(gpu: &Gpu, spec: &DecoderSpec) -> Self {
        let (hd, heads) = (spec.head_dim, spec.heads);
        let gates = if spec.output_gate { heads } else { 0 };
        let linear = spec.linear.as_ref().map(|l| &l.shape);
        Self {
            qkv: ((heads + gates + 2 * spec.kv_heads) * hd)
                .max(linear.map_or(0, |s| s.projected_width())),
            attn: (heads * hd).max(linear.map_or(0, |s| s.value_heads * s.value_dim)),
            delta_in: linear.map_or(0, |s| s.value_heads * s.value_dim + 2 * s.value_heads),
            gate_up: if spec.mlp.gated() && !MatMul::gates_in_epilogue(gpu) {
                2 * spec.intermediate
            } else {
                0
            },
        }
    }
}

impl Handoffs {
    /// For RMSNorm models without post-norms (whose normed products read the residual stream
    /// the products before them wrote), outside f32 models (which keep float inputs).
    fn new(gpu: &Gpu, spec: &DecoderSpec, dtype: WeightDType) -> Result<Option<Self>, Error> {
        if spec.norm != NormKind::Rms
            || spec.post_norms
            || dtype == WeightDType::F32
            || !spec.hidden.is_multiple_of(32)
            || !spec.intermediate.is_multiple_of(32)
        {
            return Ok(None);
        }
        Ok(Some(Self {
            residual: Int8Handoff::new(gpu, spec.hidden)?,
            hidden: Int8Handoff::new(gpu, spec.intermediate)?,
        }))
    }
}

impl DecoderModel {
    /// Uploads the weights and allocates the state. Running out of GPU memory is an error
    /// (with the sizes), not a crash.
    pub fn build(
        gpu: &Gpu,
        spec: &DecoderSpec,
        source: WeightSource<'_>,
        opts: &ModelOptions,
    ) -> Result<Self, Error> {
        let device = gpu.device();
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let result = Self::build_inner(gpu, spec, source, opts);
        if let Some(err) = pollster::block_on(oom.pop()) {
            let needed = spec.parameters() * opts.dtype.bytes();
            return Err(Error::Invalid(format!(
                "the GPU ran out of memory loading this model (its weights need about {:.1} GiB as {:?}, plus the KV cache): {err}",
                needed as f64 / f64::from(1u32 << 30),
                opts.dtype
            )));
        }
        let mut model = result?;
        gpu.finish_uploads()?;
        // Software adapters have no first-use costs worth a prompt at load.
        if !gpu.is_software() {
            model.warm_up()?;
        }
        Ok(model)
    }

    fn build_inner(
        gpu: &Gpu,
        spec: &DecoderSpec,
        source: WeightSource<'_>,
        opts: &ModelOptions,
    ) -> Result<Self, Error> {
        let dtype = opts.dtype;
        let capacity = opts
            .context
            .unwrap_or(DEFAULT_CONTEXT)
            .min(spec.max_positions)
            .max(1);
        let kv_dtype = opts.kv_cache.unwrap_or(dtype.into());
        let mut up = Uploader::new(gpu, source, dtype);
        up.keep_quantized = opts.quantized;
        up.quantize = opts.quantize;
        let weights = upload(&mut up, spec)?;
        let matrices = || {
            weights.layers.iter().flat_map(|w| {
                let dense = w.mlp.dense();
                [
                    Some(&w.qkv),
                    Some(&w.o),
                    dense.map(|d| d.0),
                    dense.map(|d| d.1),
                ]
                .into_iter()
                .flatten()
            })
        };
        // With the weights in place, the free memory says how long a prompt chunk and how many
        // slots' caches fit.
        let split_row = matrices()
            .map(|m| MatMul::scratch_bytes(m.rows, m.cols, 1))
            .max()
            .unwrap_or(0);
        let chunk = match opts.prefill_chunk {
            Some(asked) => asked.clamp(1, capacity),
            None => super::batch::chunk_in_memory(
                gpu,
                spec,
                (capacity, kv_dtype),
                DEFAULT_PREFILL_CHUNK.min(capacity),
                (
                    Activations::row_bytes(gpu, spec) + split_row,
                    Activations::largest_row_bytes(gpu, spec).max(split_row),
                ),
            ),
        };
        let mut slots = super::batch::slots_for(spec, opts, chunk);
        if opts.fit_slots && slots > 1 {
            slots = super::batch::slots_in_memory(gpu, spec, (capacity, chunk), kv_dtype, slots);
        }

        let step = gpu.uniform("step", &StepParams::new(0, 1));
        // Batched decode steps, and prompts of a few rows (speculative verifications among
        // them), multiply rows quantized to int8 where the weights' format has int8 products.
        let int8_rows = if slots > 1 || opts.speculate.is_some() {
            slots.max(FEW_ROWS)
        } else {
            0
        };
        let acts = Activations::new(gpu, spec, chunk, capacity, dtype, slots, int8_rows)?;
        let split_bytes = matrices()
            .map(|m| MatMul::scratch_bytes(m.rows, m.cols, chunk))
            .max()
            .unwrap_or(0);
        let split_scratch = gpu.storage("k-split scratch", split_bytes)?;
        // Expanded prompt weights need the largest to fit one binding; otherwise block-quantized
        // matrices are multiplied directly.
        let dequant_bytes = matrices()
            .filter(|m| expands_for_prompts(m))
            .map(Dequantize::scratch_bytes)
            .max();
        let fits = |bytes: Option<u64>| {
            bytes.is_some_and(|b| gpu.check_binding_size("prompt weights", b).is_ok())
        };
        // Copies need every block-quantized matrix to fit one binding as f16.
        let quantized = || matrices().filter(|m| m.quant.is_some());
        let copies =
            opts.f16_prompt_weights && fits(quantized().map(Dequantize::scratch_bytes).max());
        let dequant_scratch = match dequant_bytes {
            Some(bytes) if !copies && fits(Some(bytes)) => {
                Some(gpu.storage("prompt weights (expanded)", bytes)?)
            }
            _ => None,
        };
        let prompt_weights = match &dequant_scratch {
            Some(scratch) => PromptWeights::Scratch(scratch),
            None if copies => PromptWeights::Copies,
            None => PromptWeights::Blocks,
        };
        // The f16 copies count as weights.
        let copy_bytes: u64 = match prompt_weights {
            PromptWeights::Copies => quantized().map(Dequantize::scratch_bytes).sum(),
            _ => 0,
        };
        let table = |r: &crate::load::RopeSpec| match r.longrope(spec.rotary_dim) {
            Some((long, _, scale)) => {
                RopeTable::longrope(gpu, &r.inv_freq(spec.rotary_dim), &long, capacity, scale)
            }
            None => RopeTable::scaled(
                gpu,
                &r.inv_freq(spec.rotary_dim),
                capacity,
                r.attention_factor(),
            ),
        };
        let rope = spec.rope.as_ref().map(table).transpose()?;
        let local_rope = spec
            .window
            .as_ref()
            .and_then(|w| w.rope.as_ref())
            .filter(|_| spec.rope.is_some())
            .map(table)
            .transpose()?;
        // Sinks join the softmax of whole attention only (see `LayerContext::attentions`);
        // an output gate is applied where the output product merges the runs.
        let split_attention = MatVec::stages_input(gpu, spec.heads * spec.head_dim);
        let context = LayerContext {
            gpu,
            spec,
            kv_dtype,
            decode_layout: MatVecLayout::for_dtype(dtype),
            capacity,
            chunk,
            step: &step,
            acts: &acts,
            split_scratch: &split_scratch,
            prompt_weights,
            rope: rope.as_ref(),
            local_rope: local_rope.as_ref(),
            split_attention,
            slots,
            batch_invariant: opts.batch_invariant,
        };
        let mut cache_bytes = 0;
        // Gated DeltaNet layers' recurrent and convolution states (the same at any context).
        let mut state_bytes = 0;
        let mut layers = Vec::with_capacity(weights.layers.len());
        let mut kv_caches = Vec::new();
        // Whether the previous layer's down product hands the residual stream off.
        let mut qkv_handed = false;
        for (i, w) in (0..).zip(&weights.layers) {
            let cache = context.cache_shape(i);
            // Gated DeltaNet layers keep no KV cache.
            let linear = spec.linear.as_ref().is_some_and(|l| l.is_linear(i));
            let cache_len = if linear { 16 } else { cache.buffer_bytes() };
            let k_cache = gpu.storage(&format!("layer {i} k cache"), cache_len)?;
            let v_cache = gpu.storage(&format!("layer {i} v cache"), cache_len)?;
            cache_bytes += k_cache.size + v_cache.size;
            let next = weights.layers.get(i as usize + 1);
            let products = context.decode_products(w, next, qkv_handed, cache)?;
            let layer = context.layer(i, w, products, cache, &k_cache, &v_cache)?;
            if slots > 1 && !linear {
                kv_caches.push(super::shared_prefix::SlotCaches {
                    shape: cache,
                    k: k_cache.buffer.clone(),
                    v: v_cache.buffer.clone(),
                });
            }
            if let super::Mixer::DeltaNet { state, .. } = &layer.mixer {
                state_bytes += state.conv.size + state.recurrent.size;
            }
            qkv_handed = layer.mlp.hands_off();
            layers.push(layer);
        }
        let Uploaded {
            embedding,
            positions,
            final_norm,
            lm_head,
            bytes: weight_bytes,
            ..
        } = weights;
        let lm_head = lm_head.unwrap_or(embedding_clone(&embedding));
        let lm_head_mv = MatVec::new(
            gpu,
            &lm_head,
            &acts.x,
            &acts.logits,
            &step,
            MatVecOptions {
                norm: Some((
                    spec.norm,
                    &final_norm.0,
                    final_norm.1.as_ref(),
                    spec.norm_eps,
                )),
                layout: MatVecLayout::for_head(dtype),
                ..Default::default()
            },
        )?;
        let embed = Embed::new(
            gpu,
            &embedding,
            positions.as_ref(),
            &acts.history,
            &acts.seen,
            &acts.x,
            &step,
            spec.embed_scale,
        )?;
        let sample = Sample::new(
            gpu,
            spec.vocab,
            &acts.logits,
            &acts.history,
            &acts.seen,
            &step,
        )?;
        let staging = [
            gpu.readback_buffer("sampled token", 4),
            gpu.readback_buffer("sampled token", 4),
        ];
        let batch = if slots > 1 {
            Some(super::batch::BatchKernels::new(
                gpu,
                spec,
                slots,
                [&embedding, &lm_head],
                positions.as_ref(),
                &final_norm,
                &acts,
                &step,
                opts.batch_invariant,
            )?)
        } else {
            None
        };
        let mut model = Self {
            gpu: gpu.clone(),
            spec: spec.clone(),
            dtype,
            capacity,
            chunk,
            step,
            embed,
            layers,
            lm_head_mv,
            lm_head,
            final_norm,
            sample,
            acts,
            staging,
            in_flight: Default::default(),
            seq_len: 0,
            submitted_len: 0,
            depth: if opts.lookahead { PIPELINE_DEPTH } else { 1 },
            weight_bytes: weight_bytes + copy_bytes,
            cache_bytes: cache_bytes + state_bytes,
            state_bytes,
            decode_dispatches: 0,
            split_attention,
            long_rope_after: spec
                .rope
                .as_ref()
                .and_then(|r| r.longrope(spec.rotary_dim))
                .map(|(_, original, _)| original),
            prompt_len: 0,
            masked: false,
            reusable: Vec::new(),
            pending: None,
            written_end: 0,
            // A batch-invariant model runs every prompt whole: the rest of a prompt after a
            // cached prefix is a product of fewer rows, whose sums may differ in the last bits.
            prefix_reuse: opts.prefix_cache
                && spec.linear.is_none()
                && !(opts.batch_invariant && slots > 1),
            last_prompt_reused: 0,
            lookahead_paused: false,
            verify_head: None,
            verifying: Vec::new(),
            penalized: false,
            sampler: SamplerParams::default(),
            slot: 0,
            slot_states: vec![Default::default(); slots as usize],
            batch,
            kv_caches,
            batch_invariant: opts.batch_invariant,
            last_encode: std::time::Duration::ZERO,
            last_prompt_encode: std::time::Duration::ZERO,
        };
        model.decode_dispatches = model.count_decode_dispatches();
        Ok(model)
    }
}

/// Whether a prompt product expands `w` to f16 first (one more dispatch; the tiles then stage
/// plain f16) rather than decoding its blocks as the tiles are staged: every block format
/// does. On an H200 (`bench --prompt-len P --gen 8 --repeat 3`) Llama-3.1-8B's shape in Q4_0
/// prefilled 7,125–7,163 tok/s expanded against 6,933–6,952 direct at 504 tokens and
/// 9,201–9,239 against 8,278–8,334 at 2,000; SmolLM2-1.7B (26,293–26,337 against
/// 26,142–26,193) and Llama-3.2-1B (40,099–40,911 against 40,732) were level. Q8_0 expanded
/// was 3–8 % faster at 1–1.7B, and the K formats decode their packed sub-block scales for
/// every eight weights (Llama-3.1-8B Q4_K: 7,312–7,336 expanded against 5,977–5,989 direct).
/// Q4_1 and Q5_0/Q5_1, whose blocks cost more to decode than Q4_0's, expand with them (not
/// measured apart).
/// `BACKPACK_PROMPT_WEIGHTS=direct` multiplies the blocks as stored instead (comparisons).
pub(super) fn expands_for_prompts(w: &Matrix) -> bool {
    w.quant.is_some()
        && !std::env::var("BACKPACK_PROMPT_WEIGHTS").is_ok_and(|v| v.eq_ignore_ascii_case("direct"))
}
