//! The shared builder: uploads a family's weights (see `family.rs`), allocates activations and
//! the KV cache, and creates every kernel of the decode and prompt passes.

use crate::Error;
use crate::gpu::{Gpu, StorageBuffer, UniformBuffer};
use crate::load::{DecoderSpec, MlpKind};
use crate::ops::{
    Attention, Dequantize, Embed, Gelu, Glu, HeadNorm, MAX_SPLITS, MatMul, MatMulOptions, MatVec,
    MatVecOptions, Matrix, Norm, NormKind, RopeKv, RopeTable, Sample, SplitAttention, StepParams,
    WeightDType,
};

use super::super::weights::{Part, Uploader, WeightSource};
use super::family::{LayerWeights, family_of, norm_pair};
use super::{
    Activations, DEFAULT_CONTEXT, DecoderModel, Layer, ModelOptions, PIPELINE_DEPTH, PromptProduct,
    embedding_clone, fused,
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
    fn new(gpu: &Gpu, spec: &DecoderSpec, chunk: u32, capacity: u32) -> Result<Self, Error> {
        let f = |n: u32| u64::from(n) * 4;
        let (t, d, hd, heads) = (chunk, spec.hidden, spec.head_dim, spec.heads);
        let qkv_width = (heads + 2 * spec.kv_heads) * hd;
        Ok(Self {
            x: gpu.storage("x", f(t * d))?,
            xn: gpu.storage("x normed", f(t * d))?,
            qkv: gpu.storage("qkv", f(t * qkv_width))?,
            q: gpu.storage("q", f(t * heads * hd))?,
            attn: gpu.storage("attention out", f(t * heads * hd))?,
            gate_up: if spec.mlp == MlpKind::SwiGlu {
                Some(gpu.storage("gate_up", f(t * 2 * spec.intermediate))?)
            } else {
                None
            },
            h: gpu.storage("mlp hidden", f(t * spec.intermediate))?,
            // Padded to whole vec4 words for the sampler.
            logits: gpu.storage("logits", f(spec.vocab.div_ceil(4) * 4))?,
            history: gpu.storage("token history", f(capacity + 1))?,
            seen: gpu.storage("seen tokens", f(spec.vocab.div_ceil(32)))?,
            split_partials: gpu.storage("attention runs", f(MAX_SPLITS * heads * hd))?,
            split_stats: gpu.storage("attention run stats", f(2 * MAX_SPLITS * heads))?,
        })
    }
}

/// What every layer's kernels share.
struct LayerContext<'a> {
    gpu: &'a Gpu,
    spec: &'a DecoderSpec,
    dtype: WeightDType,
    capacity: u32,
    chunk: u32,
    step: &'a UniformBuffer,
    acts: &'a Activations,
    /// One scratch for every k-split prompt product (they run one after another).
    split_scratch: &'a StorageBuffer,
    /// Block-quantized matrices expanded to f16 for prompt products, one at a time.
    dequant_scratch: Option<&'a StorageBuffer>,
    rope: Option<&'a RopeTable>,
    /// Decoding splits attention over runs of keys, merged by the output product.
    split_attention: bool,
}

impl LayerContext<'_> {
    fn norm_kind(&self) -> NormKind {
        self.spec.norm
    }

    fn gelu(&self) -> Option<Gelu> {
        match self.spec.mlp {
            MlpKind::Gelu(g) => Some(g),
            MlpKind::SwiGlu => None,
        }
    }

    fn prompt_product(
        &self,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        bias: Option<&StorageBuffer>,
        residual: bool,
        gelu: Option<Gelu>,
    ) -> Result<PromptProduct, Error> {
        PromptProduct::new(
            self.gpu,
            self.dequant_scratch,
            w,
            x,
            y,
            self.step,
            MatMulOptions {
                split_scratch: Some((self.split_scratch, self.chunk)),
                bias,
                residual,
                gelu,
                ..Default::default()
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
    fn decode_products(&self, w: &LayerWeights) -> Result<[MatVec; 4], Error> {
        let (gpu, a, step, eps) = (self.gpu, self.acts, self.step, self.spec.norm_eps);
        let spec = self.spec;
        let qkv = MatVec::new(
            gpu,
            &w.qkv,
            &a.x,
            &a.qkv,
            step,
            MatVecOptions {
                norm: Some(fused(self.norm_kind(), &w.attn_norm, eps)),
                bias: w.qkv_bias.as_ref(),
                ..Default::default()
            },
        )?;
        let o = MatVec::new(
            gpu,
            &w.o,
            &a.attn,
            &a.x,
            step,
            MatVecOptions {
                bias: w.o_bias.as_ref(),
                residual: true,
                combine: self.split_attention.then_some(SplitAttention {
                    partials: &a.split_partials,
                    stats: &a.split_stats,
                    heads: spec.heads,
                    head_dim: spec.head_dim,
                }),
                ..Default::default()
            },
        )?;
        let up = MatVec::new(
            gpu,
            &w.up,
            &a.x,
            &a.h,
            step,
            MatVecOptions {
                norm: Some(fused(self.norm_kind(), &w.mlp_norm, eps)),
                bias: w.up_bias.as_ref(),
                glu: spec.mlp == MlpKind::SwiGlu,
                gelu: self.gelu(),
                ..Default::default()
            },
        )?;
        let down = MatVec::new(
            gpu,
            &w.down,
            &a.h,
            &a.x,
            step,
            MatVecOptions {
                bias: w.down_bias.as_ref(),
                residual: true,
                ..Default::default()
            },
        )?;
        Ok([qkv, o, up, down])
    }

    /// Attention for prompts (over the cache, after a RoPE pass) and for decoding.
    fn attentions(
        &self,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
    ) -> Result<(RopeKv, Attention, Attention), Error> {
        let (gpu, a, step, spec) = (self.gpu, self.acts, self.step, self.spec);
        let (heads, kv_heads, hd) = (spec.heads, spec.kv_heads, spec.head_dim);
        let (capacity, dtype) = (self.capacity, self.dtype);
        let rope = RopeKv::new(
            gpu, heads, kv_heads, hd, capacity, dtype, self.rope, &a.qkv, &a.q, k_cache, v_cache,
            step,
        )?;
        let prompt = Attention::new(
            gpu, heads, kv_heads, hd, capacity, dtype, &a.q, k_cache, v_cache, &a.attn, step,
        )?;
        let decode = if self.split_attention {
            Attention::new_split(
                gpu,
                heads,
                kv_heads,
                hd,
                capacity,
                dtype,
                &a.qkv,
                self.rope,
                k_cache,
                v_cache,
                &a.split_partials,
                &a.split_stats,
                step,
            )?
        } else {
            Attention::new(
                gpu, heads, kv_heads, hd, capacity, dtype, &a.q, k_cache, v_cache, &a.attn, step,
            )?
        };
        Ok((rope, prompt, decode))
    }

    /// A layer's kernels over its weights and its part of the KV cache.
    fn layer(
        &self,
        w: &LayerWeights,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
    ) -> Result<Layer, Error> {
        let a = self.acts;
        let [qkv_mv, o_mv, up_mv, down_mv] = self.decode_products(w)?;
        let (rope, attention, decode_attention) = self.attentions(k_cache, v_cache)?;
        let gelu = self.gelu();
        let up_out = a.gate_up.as_ref().unwrap_or(&a.h);
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
            up_mv,
            down_mv,
            attn_norm: self.norm(&w.attn_norm)?,
            qkv_mm: self.prompt_product(&w.qkv, &a.xn, &a.qkv, w.qkv_bias.as_ref(), false, None)?,
            o_mm: self.prompt_product(&w.o, &a.attn, &a.x, w.o_bias.as_ref(), true, None)?,
            mlp_norm: self.norm(&w.mlp_norm)?,
            up_mm: self.prompt_product(&w.up, &a.xn, up_out, w.up_bias.as_ref(), false, gelu)?,
            glu: match &a.gate_up {
                Some(gu) => Some(Glu::new(
                    self.gpu,
                    self.spec.intermediate,
                    gu,
                    &a.h,
                    self.step,
                )?),
                None => None,
            },
            down_mm: self.prompt_product(&w.down, &a.h, &a.x, w.down_bias.as_ref(), true, None)?,
            rope,
            attention,
            decode_attention,
        })
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
        result
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
        let acts = Activations::new(gpu, spec, chunk, capacity)?;
        let matrices = || {
            weights
                .layers
                .iter()
                .flat_map(|w| [&w.qkv, &w.o, &w.up, &w.down])
        };
        let split_bytes = matrices()
            .map(|m| MatMul::scratch_bytes(m.rows, m.cols, chunk))
            .max()
            .unwrap_or(0);
        let split_scratch = gpu.storage("k-split scratch", split_bytes)?;
        // Expanded prompt weights need the largest to fit one binding; otherwise block-quantized
        // matrices are multiplied directly.
        let dequant_bytes = matrices()
            .filter(|m| m.quant.is_some())
            .map(Dequantize::scratch_bytes)
            .max();
        let dequant_scratch = match dequant_bytes {
            Some(bytes) if gpu.check_binding_size("prompt weights", bytes).is_ok() => {
                Some(gpu.storage("prompt weights (expanded)", bytes)?)
            }
            _ => None,
        };
        let rope = match &spec.rope {
            Some(r) => Some(RopeTable::new(gpu, &r.inv_freq(spec.rotary_dim), capacity)?),
            None => None,
        };
        let split_attention = MatVec::stages_input(gpu, spec.heads * spec.head_dim);
        let context = LayerContext {
            gpu,
            spec,
            dtype,
            capacity,
            chunk,
            step: &step,
            acts: &acts,
            split_scratch: &split_scratch,
            dequant_scratch: dequant_scratch.as_ref(),
            rope: rope.as_ref(),
            split_attention,
        };
        let cache_len = u64::from(spec.kv_heads)
            * u64::from(capacity)
            * u64::from(spec.head_dim)
            * dtype.bytes();
        let mut cache_bytes = 0;
        let mut layers = Vec::with_capacity(weights.layers.len());
        for (i, w) in weights.layers.iter().enumerate() {
            let k_cache = gpu.storage(&format!("layer {i} k cache"), cache_len)?;
            let v_cache = gpu.storage(&format!("layer {i} v cache"), cache_len)?;
            cache_bytes += k_cache.size + v_cache.size;
            layers.push(context.layer(w, &k_cache, &v_cache)?);
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
            weight_bytes,
            cache_bytes,
            decode_dispatches: 0,
            split_attention,
            last_encode: std::time::Duration::ZERO,
        };
        model.decode_dispatches = model.count_decode_dispatches();
        Ok(model)
    }
}
