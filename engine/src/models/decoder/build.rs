//! The shared builder: uploads a family's weights (see `family.rs`), allocates activations and
//! the KV cache, and creates every kernel of the decode and prompt passes.

use crate::Error;
use crate::gpu::{Gpu, StorageBuffer, UniformBuffer};
use crate::load::{DecoderSpec, GgmlType, MlpKind};
use crate::ops::{
    Attention, CacheShape, Dequantize, Embed, Experts, Gelu, Glu, GluKind, HeadNorm, Int8Handoff,
    KvDType, MAX_SPLITS, MatMul, MatMulOptions, MatVec, MatVecLayout, MatVecOptions, Matrix,
    MoeBuffers, Norm, NormKind, RopeKv, RopeTable, Sample, SplitAttention, StepParams, WeightDType,
};

use super::super::weights::{Part, Uploader, WeightSource};
use super::family::{LayerWeights, MlpWeights, family_of, norm_pair};
use super::{
    Activations, DEFAULT_CONTEXT, DecoderModel, Handoffs, Layer, LayerMlp, ModelOptions,
    PIPELINE_DEPTH, PromptProduct, PromptWeights, embedding_clone, fused,
};

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
    let embedding = if family.positions.is_some() {
        up.dense_matrix("token embedding", &embedding_parts, false)?
    } else {
        up.matrix("token embedding", &embedding_parts, false)?
    };
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
    ) -> Result<Self, Error> {
        let f = |n: u32| u64::from(n) * 4;
        let (t, d, hd, heads) = (chunk, spec.hidden, spec.head_dim, spec.heads);
        let qkv_width = (heads + 2 * spec.kv_heads) * hd;
        Ok(Self {
            x: gpu.storage("x", f(t * d))?,
            xn: gpu.storage("x normed", f(t * d))?,
            qkv: gpu.storage("qkv", f(t * qkv_width))?,
            q: gpu.storage("q", f(t * heads * hd))?,
            attn: gpu.storage("attention out", f(t * heads * hd))?,
            // Tensor-core products gate in their epilogue, straight into `h`.
            gate_up: if spec.mlp.gated() && !MatMul::gates_in_epilogue(gpu) {
                Some(gpu.storage("gate_up", f(t * 2 * spec.intermediate))?)
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
            // Padded to whole vec4 words for the sampler.
            logits: gpu.storage("logits", f(spec.vocab.div_ceil(4) * 4))?,
            history: gpu.storage("token history", f(capacity + 1))?,
            seen: gpu.storage("seen tokens", f(spec.vocab.div_ceil(32)))?,
            split_partials: gpu.storage("attention runs", f(MAX_SPLITS * heads * hd))?,
            split_stats: gpu.storage("attention run stats", f(2 * MAX_SPLITS * heads))?,
            handoffs: Handoffs::new(gpu, spec, dtype)?,
        })
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

/// A layer's decode products: QKV, output, and the dense MLP's up and down (none for experts).
type DecodeProducts = (MatVec, MatVec, Option<(MatVec, MatVec)>);

/// What every layer's kernels share.
struct LayerContext<'a> {
    gpu: &'a Gpu,
    spec: &'a DecoderSpec,
    kv_dtype: KvDType,
    /// The decode products' layout for the model's dtype (int8 inputs or not).
    decode_layout: MatVecLayout,
    capacity: u32,
    chunk: u32,
    step: &'a UniformBuffer,
    acts: &'a Activations,
    /// One scratch for every k-split prompt product (they run one after another).
    split_scratch: &'a StorageBuffer,
    /// Where prompt products find block-quantized weights as f16.
    prompt_weights: PromptWeights<'a>,
    rope: Option<&'a RopeTable>,
    /// Sliding-window layers' RoPE where it differs (Gemma 3's local base).
    local_rope: Option<&'a RopeTable>,
    /// Decoding splits attention over runs of keys, merged by the output product.
    split_attention: bool,
}

impl LayerContext<'_> {
    fn norm_kind(&self) -> NormKind {
        self.spec.norm
    }

    /// The GELU of an ungated MLP's up product.
    fn gelu(&self) -> Option<Gelu> {
        match self.spec.mlp {
            MlpKind::Gelu(g) => Some(g),
            MlpKind::SwiGlu | MlpKind::GeGlu => None,
        }
    }

    fn glu(&self) -> Option<GluKind> {
        match self.spec.mlp {
            MlpKind::SwiGlu => Some(GluKind::Silu),
            MlpKind::GeGlu => Some(GluKind::GeluTanh),
            MlpKind::Gelu(_) => None,
        }
    }

    /// Layer `i`'s cache: the whole context, or for a sliding-window layer a rolling cache of
    /// the window plus one prompt chunk (what one submission stores before attending).
    fn cache_shape(&self, i: u32) -> CacheShape {
        let spec = self.spec;
        let mut shape = CacheShape::new(
            spec.heads,
            spec.kv_heads,
            spec.head_dim,
            self.capacity,
            self.kv_dtype,
        );
        shape.scale = spec.attn_scale;
        if let Some(w) = spec.window.as_ref().filter(|_| spec.is_local(i)) {
            let rows = w.size.saturating_add(self.chunk - 1);
            if rows < self.capacity {
                shape.rows = rows;
                shape.window = Some(w.size);
            } else if w.size < self.capacity {
                shape.window = Some(w.size);
            }
        }
        shape
    }

    /// Layer `i`'s rotary table.
    fn rope_of(&self, i: u32) -> Option<&RopeTable> {
        match self.local_rope {
            Some(local) if self.spec.is_local(i) => Some(local),
            _ => self.rope,
        }
    }

    /// A prompt product with `opts`' epilogue, split along k through the shared scratch.
    fn prompt_product(
        &self,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        opts: MatMulOptions<'_>,
    ) -> Result<PromptProduct, Error> {
        PromptProduct::new(
            self.gpu,
            self.prompt_weights,
            w,
            x,
            y,
            self.step,
            MatMulOptions {
                split_scratch: Some((self.split_scratch, self.chunk)),
                ..opts
            },
        )
    }

    fn norm(&self, n: &(StorageBuffer, Option<StorageBuffer>)) -> Result<Norm, Error> {
        let a = self.acts;
        Ok(Norm::new(
            self.gpu,
            self.norm_kind(),
            self.spec.hidden,
            self.spec.norm_eps,
            &n.0,
            n.1.as_ref(),
            &a.x,
            &a.xn,
            self.step,
        )?)
    }

    /// The decode products of a layer: norm+QKV, output (merging split attention) + residual,
    /// norm+up (+SwiGLU or GELU), down + residual.
    ///
    /// Each product whose output an int8 product reads next hands it off as int8 blocks where
    /// it can (see [`Int8Handoff`]): the output product to the up product, the up product to
    /// the down product, and the down product to the next layer's QKV product (`next`; the
    /// first layer's reads the embedding's row). `qkv_handed` says whether the previous layer's
    /// down product hands its output off. On an H100 (`bench`, 504-token prompt, none → all
    /// three) that decoded SmolLM2-1.7B Q4_K at 779 tok/s against 741, Q8_0 669 against 651;
    /// Llama-3.2-1B Q4_K 1,092 against 1,048, Q8_0 932 against 914; Qwen2.5-1.5B Q4_K 654
    /// against 619, Q8_0 603 against 581.
    fn decode_products(
        &self,
        w: &LayerWeights,
        next: Option<&LayerWeights>,
        qkv_handed: bool,
        cache: CacheShape,
    ) -> Result<DecodeProducts, Error> {
        let (gpu, a, step, eps) = (self.gpu, self.acts, self.step, self.spec.norm_eps);
        let spec = self.spec;
        let reads_int8 = |m: &Matrix| {
            a.handoffs
                .as_ref()
                .filter(|_| MatVec::may_take_int8(m, self.decode_layout))
        };
        // With post-norms, the output and down products leave their result for the norm that
        // adds it to the residual stream.
        let (out, residual) = match &a.branch {
            Some(branch) => (branch, false),
            None => (&a.x, true),
        };
        let qkv = MatVec::new(
            gpu,
            &w.qkv,
            &a.x,
            &a.qkv,
            step,
            MatVecOptions {
                norm: Some(fused(self.norm_kind(), &w.attn_norm, eps)),
                bias: w.qkv_bias.as_ref(),
                layout: self.decode_layout,
                handoff_in: reads_int8(&w.qkv)
                    .filter(|_| qkv_handed)
                    .map(|h| &h.residual),
                ..Default::default()
            },
        )?;
        let dense = w.mlp.dense();
        let up_in = dense.and_then(|(up, _)| reads_int8(up).map(|h| &h.residual));
        let o = MatVec::new(
            gpu,
            &w.o,
            &a.attn,
            out,
            step,
            MatVecOptions {
                bias: w.o_bias.as_ref(),
                residual,
                combine: self.split_attention.then_some(SplitAttention {
                    partials: &a.split_partials,
                    stats: &a.split_stats,
                    heads: spec.heads,
                    head_dim: spec.head_dim,
                    window: cache.window,
                }),
                layout: self.decode_layout,
                handoff_out: up_in.map(|h| (h, Some(&w.mlp_norm.0))),
                ..Default::default()
            },
        )?;
        let MlpWeights::Dense {
            up: up_w,
            up_bias,
            down: down_w,
            down_bias,
        } = &w.mlp
        else {
            return Ok((qkv, o, None));
        };
        let down_in = reads_int8(down_w).map(|h| &h.hidden);
        let up = MatVec::new(
            gpu,
            up_w,
            &a.x,
            &a.h,
            step,
            MatVecOptions {
                norm: Some(fused(self.norm_kind(), &w.mlp_norm, eps)),
                bias: up_bias.as_ref(),
                glu: spec.mlp.gated(),
                gelu: match spec.mlp {
                    MlpKind::GeGlu => Some(Gelu::Tanh),
                    _ => self.gelu(),
                },
                layout: self.decode_layout,
                handoff_in: up_in.filter(|_| o.hands_off()),
                handoff_out: down_in.map(|h| (h, None)),
                ..Default::default()
            },
        )?;
        let down = MatVec::new(
            gpu,
            down_w,
            &a.h,
            out,
            step,
            MatVecOptions {
                bias: down_bias.as_ref(),
                residual,
                layout: self.decode_layout,
                handoff_in: down_in.filter(|_| up.hands_off()),
                handoff_out: next
                    .and_then(|n| reads_int8(&n.qkv).map(|h| (&h.residual, Some(&n.attn_norm.0)))),
                ..Default::default()
            },
        )?;
        Ok((qkv, o, Some((up, down))))
    }

    /// Attention for prompts (over the cache, after a RoPE pass) and for decoding.
    fn attentions(
        &self,
        cache: CacheShape,
        table: Option<&RopeTable>,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
        sinks: Option<&StorageBuffer>,
    ) -> Result<(RopeKv, Attention, Attention), Error> {
        let (gpu, a, step) = (self.gpu, self.acts, self.step);
        let rope = RopeKv::new(gpu, cache, table, &a.qkv, &a.q, k_cache, v_cache, step)?;
        let whole = || match sinks {
            Some(sinks) => {
                Attention::with_sinks(gpu, cache, &a.q, k_cache, v_cache, &a.attn, sinks, step)
            }
            None => Attention::new(gpu, cache, &a.q, k_cache, v_cache, &a.attn, step),
        };
        let prompt = whole()?;
        // Split runs are merged by the output product, which knows no sinks.
        let decode = if self.split_attention && sinks.is_none() {
            Attention::new_split(
                gpu,
                cache,
                &a.qkv,
                table,
                k_cache,
                v_cache,
                &a.split_partials,
                &a.split_stats,
                step,
            )?
        } else {
            whole()?
        };
        Ok((rope, prompt, decode))
    }

    /// A layer's kernels over its weights and its part of the KV cache.
    fn layer(
        &self,
        i: u32,
        w: &LayerWeights,
        decode_products: DecodeProducts,
        cache: CacheShape,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
    ) -> Result<Layer, Error> {
        let a = self.acts;
        let (qkv_mv, o_mv, dense_mvs) = decode_products;
        let (rope, attention, decode_attention) =
            self.attentions(cache, self.rope_of(i), k_cache, v_cache, w.sinks.as_ref())?;
        let (out, residual) = self.branch_out();
        let post_norm = |weight: &StorageBuffer| match &a.branch {
            Some(branch) => Norm::add_into(
                self.gpu,
                self.spec.hidden,
                self.spec.norm_eps,
                weight,
                branch,
                &a.x,
                self.step,
            ),
            None => Err(crate::gpu::GpuError::Device(
                "post-norms need the branch buffer".into(),
            )),
        };
        let (post_attn_norm, post_mlp_norm) = match &w.post_norms {
            Some((attn, mlp)) => (Some(post_norm(attn)?), Some(post_norm(mlp)?)),
            None => (None, None),
        };
        let spec = self.spec;
        let qk_norm = match &w.qk_norm {
            Some((q, k)) => Some(HeadNorm::new(
                self.gpu,
                spec.heads,
                spec.kv_heads,
                spec.head_dim,
                spec.norm_eps,
                q,
                k,
                &a.qkv,
                self.step,
            )?),
            None => None,
        };
        Ok(Layer {
            qkv_mv,
            qk_norm,
            o_mv,
            attn_norm: self.norm(&w.attn_norm)?,
            qkv_mm: self.prompt_product(
                &w.qkv,
                &a.xn,
                &a.qkv,
                MatMulOptions {
                    bias: w.qkv_bias.as_ref(),
                    ..Default::default()
                },
            )?,
            o_mm: self.prompt_product(
                &w.o,
                &a.attn,
                out,
                MatMulOptions {
                    bias: w.o_bias.as_ref(),
                    residual,
                    ..Default::default()
                },
            )?,
            post_attn_norm,
            mlp_norm: self.norm(&w.mlp_norm)?,
            mlp: self.mlp(&w.mlp, dense_mvs)?,
            post_mlp_norm,
            rope,
            attention,
            decode_attention,
        })
    }

    /// Where attention and MLP outputs go: the residual stream, or the branch buffer its
    /// post-norm reads (and then not added).
    fn branch_out(&self) -> (&StorageBuffer, bool) {
        match &self.acts.branch {
            Some(branch) => (branch, false),
            None => (&self.acts.x, true),
        }
    }

    /// A layer's MLP kernels: the dense prompt products beside the decode products made
    /// before, or the router and experts.
    fn mlp(&self, w: &MlpWeights, dense_mvs: Option<(MatVec, MatVec)>) -> Result<LayerMlp, Error> {
        let a = self.acts;
        let (out, residual) = self.branch_out();
        match (w, dense_mvs) {
            (
                MlpWeights::Dense {
                    up,
                    up_bias,
                    down,
                    down_bias,
                },
                Some((up_mv, down_mv)),
            ) => {
                let glu = self.glu();
                // Without the gate/up buffer the product gates its own output.
                let up_out = a.gate_up.as_ref().unwrap_or(&a.h);
                Ok(LayerMlp::Dense {
                    up_mv,
                    down_mv,
                    up_mm: self.prompt_product(
                        up,
                        &a.xn,
                        up_out,
                        MatMulOptions {
                            bias: up_bias.as_ref(),
                            gelu: self.gelu(),
                            glu: glu.filter(|_| a.gate_up.is_none()),
                            ..Default::default()
                        },
                    )?,
                    glu: match (&a.gate_up, glu) {
                        (Some(gu), Some(kind)) => Some(Glu::new(
                            self.gpu,
                            kind,
                            self.spec.intermediate,
                            gu,
                            &a.h,
                            self.step,
                        )?),
                        _ => None,
                    },
                    down_mm: Box::new(self.prompt_product(
                        down,
                        &a.h,
                        out,
                        MatMulOptions {
                            bias: down_bias.as_ref(),
                            residual,
                            ..Default::default()
                        },
                    )?),
                })
            }
            (MlpWeights::Experts(experts), None) => {
                let (Some(moe), Some(bufs)) = (&self.spec.moe, &a.moe) else {
                    return Err(Error::Invalid("experts without a routing spec".into()));
                };
                let router = MatMul::new(
                    self.gpu,
                    &experts.router,
                    &a.xn,
                    &bufs.logits,
                    self.step,
                    MatMulOptions {
                        bias: experts.router_bias.as_ref(),
                        ..Default::default()
                    },
                )?;
                // Decoding's router product: one row, where a tiled product would spend its
                // whole k loop in one workgroup.
                let router_mv = MatVec::new(
                    self.gpu,
                    &experts.router,
                    &a.xn,
                    &bufs.logits,
                    self.step,
                    MatVecOptions {
                        bias: experts.router_bias.as_ref(),
                        layout: MatVecLayout::for_dtype(WeightDType::F32),
                        ..Default::default()
                    },
                )?;
                let experts = Experts::new(self.gpu, moe, experts, bufs, &a.xn, &a.x, self.step)?;
                Ok(LayerMlp::Experts {
                    router,
                    router_mv,
                    experts,
                })
            }
            _ => Err(Error::Invalid(
                "a dense MLP without its decode products".into(),
            )),
        }
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
        let chunk = opts.prefill_chunk.clamp(1, capacity);
        let mut up = Uploader::new(gpu, source, dtype);
        up.keep_quantized = opts.quantized;
        up.quantize = opts.quantize;
        let weights = upload(&mut up, spec)?;

        let step = gpu.uniform("step", &StepParams::new(0, 1));
        let acts = Activations::new(gpu, spec, chunk, capacity, dtype)?;
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
        let split_bytes = matrices()
            .map(|m| MatMul::scratch_bytes(m.rows, m.cols, chunk))
            .max()
            .unwrap_or(0);
        let split_scratch = gpu.storage("k-split scratch", split_bytes)?;
        // Expanded prompt weights need the largest to fit one binding; otherwise block-quantized
        // matrices are multiplied directly.
        let dequant_bytes = matrices()
            .filter(|m| expands_for_prompts(gpu, m))
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
        // Sinks join the softmax of whole attention only (see `LayerContext::attentions`).
        let split_attention = MatVec::stages_input(gpu, spec.heads * spec.head_dim) && !spec.sinks;
        let context = LayerContext {
            gpu,
            spec,
            kv_dtype: opts.kv_cache.unwrap_or(dtype.into()),
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
        };
        let mut cache_bytes = 0;
        let mut layers = Vec::with_capacity(weights.layers.len());
        // Whether the previous layer's down product hands the residual stream off.
        let mut qkv_handed = false;
        for (i, w) in (0..).zip(&weights.layers) {
            let cache = context.cache_shape(i);
            let cache_len = cache.buffer_bytes();
            let k_cache = gpu.storage(&format!("layer {i} k cache"), cache_len)?;
            let v_cache = gpu.storage(&format!("layer {i} v cache"), cache_len)?;
            cache_bytes += k_cache.size + v_cache.size;
            let next = weights.layers.get(i as usize + 1);
            let products = context.decode_products(w, next, qkv_handed, cache)?;
            let layer = context.layer(i, w, products, cache, &k_cache, &v_cache)?;
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
            cache_bytes,
            decode_dispatches: 0,
            split_attention,
            long_rope_after: spec
                .rope
                .as_ref()
                .and_then(|r| r.longrope(spec.rotary_dim))
                .map(|(_, original, _)| original),
            prompt_len: 0,
            last_encode: std::time::Duration::ZERO,
            last_prompt_encode: std::time::Duration::ZERO,
        };
        model.decode_dispatches = model.count_decode_dispatches();
        Ok(model)
    }
}

/// Whether a prompt product expands `w` to f16 first (one more dispatch; the tiles then stage
/// plain f16) rather than decoding its blocks as the tiles are staged. On tensor cores the
/// 4- and 5-bit simple formats (Q4_0, Q4_1, Q5_0, Q5_1) go direct, without the expanded copy:
/// on an H200 (504-token prompts, two runs each) Q4_0 prefilled level either way
/// (SmolLM2-1.7B 23,100–23,300 tok/s direct against 23,100–23,500 expanded, Llama-3.2-1B
/// 35,400–35,800 against 35,200–36,500, Qwen2.5-1.5B 22,300–22,900 against 22,300–22,600).
/// Q8_0 expanded was 3–8 % faster (direct against expanded: SmolLM2-1.7B 22,000–22,200
/// against 23,000–23,900, Llama-3.2-1B 33,700–34,500 against 35,500–36,700, Qwen2.5-1.5B
/// 21,600–22,000 against 22,600–22,800), and the K formats decode their packed sub-block scales for every eight
/// weights: both expand, as everything does on the SIMT tiles.
/// `BACKPACK_PROMPT_WEIGHTS=direct|expand` forces either (comparisons).
pub(super) fn expands_for_prompts(gpu: &Gpu, w: &Matrix) -> bool {
    let Some((ty, _)) = w.quant else {
        return false;
    };
    match std::env::var("BACKPACK_PROMPT_WEIGHTS").map(|v| v.to_ascii_lowercase()) {
        Ok(v) if v == "direct" => false,
        Ok(v) if v == "expand" => true,
        _ => !gpu.caps().cooperative_matrix || ty.block_elems() == 256 || ty == GgmlType::Q8_0,
    }
}
