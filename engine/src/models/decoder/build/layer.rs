//! One layer's kernels: the decode products (with their int8 handoffs), attention for
//! prompts and decoding, norms, and the MLP (`mlp.rs`: dense products, or a router and its
//! experts).

#[path = "mlp.rs"]
mod mlp;

use crate::Error;
use crate::gpu::{Gpu, StorageBuffer, UniformBuffer};
use crate::load::{DecoderSpec, MlpKind};
use crate::ops::{
    Attention, CacheShape, DeltaNet, DeltaNetIo, DeltaNetState, DeltaRows, Gelu, GluKind, HeadNorm,
    HeadNormGains, KvDType, MatMulOptions, MatVec, MatVecLayout, MatVecOptions, Matrix, Norm,
    NormInt8, NormKind, OutputGate, RopeKv, RopeTable, SplitAttention,
};

use super::super::family::{LayerWeights, MlpWeights};
use super::super::{
    Activations, BatchSetup, Layer, LayerMlp, Mixer, PromptProduct, PromptWeights, fused,
};

/// The most router rows (experts) whose decode product runs in one workgroup of 1,024
/// invocations (32 lanes a row) and routes the token itself where the experts' products would
/// otherwise take a routing dispatch: on an H200 (`bench`, random weights, three rounds)
/// GPT-OSS-20B's 32 rows decoded 361.9–362.8 tok/s against 351.8–352.9 with the dispatch.
const ROUTER_ROUTES_MAX_ROWS: u32 = 64;

/// A layer's decode products: QKV, output, and the dense MLP's up and down (none for experts).
pub(super) type DecodeProducts = (MatVec, MatVec, Option<(MatVec, MatVec)>);

/// A layer's RoPE pass and attentions: for prompts, for decoding, and for batched decode steps
/// (models with several cache slots).
type AttentionKernels = (RopeKv, Attention, Attention, Option<(RopeKv, Attention)>);

/// What every layer's kernels share.
pub(super) struct LayerContext<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) spec: &'a DecoderSpec,
    pub(super) kv_dtype: KvDType,
    /// The decode products' layout for the model's dtype (int8 inputs or not).
    pub(super) decode_layout: MatVecLayout,
    pub(super) capacity: u32,
    pub(super) chunk: u32,
    pub(super) step: &'a UniformBuffer,
    pub(super) acts: &'a Activations,
    /// One scratch for every k-split prompt product (they run one after another).
    pub(super) split_scratch: &'a StorageBuffer,
    /// Where prompt products find block-quantized weights as f16.
    pub(super) prompt_weights: PromptWeights<'a>,
    pub(super) rope: Option<&'a RopeTable>,
    /// Sliding-window layers' RoPE where it differs (Gemma 3's local base).
    pub(super) local_rope: Option<&'a RopeTable>,
    /// Decoding splits attention over runs of keys, merged by the output product.
    pub(super) split_attention: bool,
    /// Sequences the caches hold side by side; past one, layers get batched decode kernels.
    pub(super) slots: u32,
    /// See [`super::super::ModelOptions::batch_invariant`].
    pub(super) batch_invariant: bool,
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

    /// Layer `i`'s cache (see [`super::cache::cache_shape`]).
    pub(super) fn cache_shape(&self, i: u32) -> CacheShape {
        super::cache::cache_shape(
            self.spec,
            i,
            (self.capacity, self.chunk),
            self.kv_dtype,
            self.slots,
        )
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
            self.acts.batch_int8.as_ref().map(|rows| BatchSetup {
                rows,
                fine: false,
                steps: self.slots > 1,
                invariant: self.batch_invariant,
            }),
        )
    }

    /// The norm before `product` fused with the quantization of its rows, where the product
    /// has int8 few-row products to read them. `BACKPACK_NORM_INT8=0` keeps the two apart, for
    /// measuring the fusion.
    fn norm_int8(
        &self,
        n: &(StorageBuffer, Option<StorageBuffer>),
        product: &PromptProduct,
    ) -> Result<Option<NormInt8>, Error> {
        if std::env::var("BACKPACK_NORM_INT8").is_ok_and(|v| v.trim() == "0") {
            return Ok(None);
        }
        let a = self.acts;
        let (Some(rows), Some(int8)) = (a.batch_int8.as_ref(), product.int8()) else {
            return Ok(None);
        };
        Ok(NormInt8::new(
            self.gpu,
            self.norm_kind(),
            (self.spec.hidden, self.spec.norm_eps),
            (&n.0, n.1.as_ref()),
            &a.x,
            &a.xn,
            self.step,
            rows,
            int8,
        )?)
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
    pub(super) fn decode_products(
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
                // A Gated DeltaNet layer's output is whole: only attention comes in runs.
                combine: (self.split_attention && w.delta.is_none()).then_some(SplitAttention {
                    partials: &a.split_partials,
                    stats: &a.split_stats,
                    heads: spec.heads,
                    head_dim: spec.head_dim,
                    window: cache.window,
                    gate: spec.output_gate.then_some(&a.qkv),
                    sinks: w.sinks.as_ref(),
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
        head_norm: Option<HeadNormGains<'_>>,
    ) -> Result<AttentionKernels, Error> {
        let (gpu, a, step) = (self.gpu, self.acts, self.step);
        let rope = RopeKv::new(gpu, cache, table, &a.qkv, &a.q, k_cache, v_cache, step)?;
        let whole = || match sinks {
            Some(sinks) => {
                Attention::with_sinks(gpu, cache, &a.q, k_cache, v_cache, &a.attn, sinks, step)
            }
            None => Attention::new(gpu, cache, &a.q, k_cache, v_cache, &a.attn, step),
        };
        let prompt = whole()?;
        // Split runs are merged by the output product, which adds the sinks there.
        let decode = if self.split_attention {
            Attention::new_split(
                gpu,
                cache,
                &a.qkv,
                table,
                k_cache,
                v_cache,
                &a.split_partials,
                &a.split_stats,
                head_norm,
                step,
            )?
        } else {
            whole()?
        };
        let batch = match &a.batch_rows {
            Some(rows) => {
                let kv = [&a.qkv, &a.q, k_cache, v_cache];
                let rope = RopeKv::batched(gpu, cache, table, kv, step, rows)?;
                let io = [&a.q, k_cache, v_cache, &a.attn];
                let attention = Attention::batched(gpu, cache, io, sinks, step, rows)?;
                Some((rope, attention))
            }
            None => None,
        };
        Ok((rope, prompt, decode, batch))
    }

    /// A Gated DeltaNet layer's input products after the first (where its projections are
    /// stored in formats that do not stack), each into rows of its own: the decode product
    /// with the layer's norm fused in, and the prompt product over the normed rows.
    fn extra_input_products(
        &self,
        w: &LayerWeights,
    ) -> Result<Vec<(MatVec, PromptProduct)>, Error> {
        let (a, eps) = (self.acts, self.spec.norm_eps);
        let Some(inputs) = &w.linear_in else {
            return Ok(Vec::new());
        };
        let mut products = Vec::with_capacity(inputs.extra.len());
        for (m, rows) in inputs.extra.iter().zip(&a.delta_in) {
            let decode = MatVec::new(
                self.gpu,
                m,
                &a.x,
                rows,
                self.step,
                MatVecOptions {
                    norm: Some(fused(self.norm_kind(), &w.attn_norm, eps)),
                    layout: self.decode_layout,
                    ..Default::default()
                },
            )?;
            let prompt = self.prompt_product(m, &a.xn, rows, MatMulOptions::default())?;
            products.push((decode, prompt));
        }
        Ok(products)
    }

    /// A layer's kernels over its weights and its part of the KV cache.
    pub(super) fn layer(
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
        let mixer = self.mixer(i, w, cache, k_cache, v_cache)?;
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
        let qkv_mm = self.prompt_product(
            &w.qkv,
            &a.xn,
            &a.qkv,
            MatMulOptions {
                bias: w.qkv_bias.as_ref(),
                ..Default::default()
            },
        )?;
        let mlp = self.mlp(
            &w.mlp,
            w.shared_expert.as_ref(),
            dense_mvs,
            fused(self.norm_kind(), &w.mlp_norm, self.spec.norm_eps),
        )?;
        let mlp_norm_int8 = match &mlp {
            LayerMlp::Dense { up_mm, .. } => self.norm_int8(&w.mlp_norm, up_mm)?,
            LayerMlp::Experts { .. } => None,
        };
        Ok(Layer {
            qkv_mv,
            extra_in: self.extra_input_products(w)?,
            o_mv,
            attn_norm: self.norm(&w.attn_norm)?,
            attn_norm_int8: self.norm_int8(&w.attn_norm, &qkv_mm)?,
            qkv_mm,
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
            mlp_norm_int8,
            mlp,
            post_mlp_norm,
            mixer,
        })
    }

    /// A layer's mixer: attention over its part of the KV cache (with head norms and the
    /// output gate where the model has them), or a Gated DeltaNet and its state.
    fn mixer(
        &self,
        i: u32,
        w: &LayerWeights,
        cache: CacheShape,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
    ) -> Result<Mixer, Error> {
        let (spec, a) = (self.spec, self.acts);
        if let (Some(delta), Some(linear), Some(scratch)) = (&w.delta, &spec.linear, &a.delta) {
            let state = DeltaNetState::new(self.gpu, &linear.shape)?;
            let inputs = w.linear_in.as_ref().ok_or_else(|| {
                Error::Invalid(format!(
                    "layer {i}: a linear-attention layer without inputs"
                ))
            })?;
            // Product k's rows: the first writes `qkv`, the others buffers of their own.
            let outputs: Vec<(&StorageBuffer, u32)> = std::iter::once((&a.qkv, w.qkv.rows))
                .chain(
                    inputs
                        .extra
                        .iter()
                        .zip(&a.delta_in)
                        .map(|(m, b)| (b, m.rows)),
                )
                .collect();
            let rows_of = |(k, offset): (usize, u32)| {
                outputs
                    .get(k)
                    .map(|&(buffer, stride)| DeltaRows {
                        buffer,
                        offset,
                        stride,
                    })
                    .ok_or_else(|| Error::Invalid(format!("layer {i}: no input product {k}")))
            };
            let io = DeltaNetIo {
                rows: &a.qkv,
                rows_stride: w.qkv.rows,
                z: rows_of(inputs.z)?,
                gates: rows_of(inputs.gates)?,
                out: &a.attn,
                scratch,
            };
            let net = DeltaNet::new(
                self.gpu,
                &linear.shape,
                linear.tiled_heads,
                delta,
                &state,
                &io,
                self.step,
                spec.norm_eps,
            )?;
            return Ok(Mixer::DeltaNet { net, state });
        }
        let head_norm = w.qk_norm.as_ref().map(|(q, k)| HeadNormGains {
            q,
            k,
            eps: spec.norm_eps,
        });
        let (rope, attention, decode_attention, batch) = self.attentions(
            cache,
            self.rope_of(i),
            k_cache,
            v_cache,
            w.sinks.as_ref(),
            head_norm,
        )?;
        let qk_norm = match &w.qk_norm {
            Some((q, k)) => Some(HeadNorm::new(
                self.gpu,
                spec.heads,
                spec.kv_heads,
                spec.head_dim,
                spec.output_gate,
                spec.norm_eps,
                q,
                k,
                &a.qkv,
                self.step,
            )?),
            None => None,
        };
        let gate = spec
            .output_gate
            .then(|| {
                OutputGate::new(
                    self.gpu,
                    spec.heads,
                    spec.kv_heads,
                    spec.head_dim,
                    &a.qkv,
                    &a.attn,
                    self.step,
                )
            })
            .transpose()?;
        Ok(Mixer::Attention {
            qk_norm,
            rope,
            attention,
            decode_attention,
            batch,
            gate,
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
}
