//! One decoder layer's kernels, as the builder (`build/`) makes them: the input product, what
//! mixes positions (attention over the KV cache, or a Gated DeltaNet over its recurrent
//! state), the output product, and the MLP (dense, or routed experts with an optional shared
//! expert); and the order they run in for a decode step and for a prompt chunk.

use crate::gpu::Recorder;
use crate::ops::{
    Attention, DeltaNet, DeltaNetState, Experts, Glu, HeadNorm, MatMul, MatVec, Norm, NormInt8,
    OutputGate, RopeKv,
};

use super::PromptProduct;

pub(super) struct Layer {
    /// The input product: q/k/v for attention, the stacked projections of a Gated DeltaNet
    /// layer.
    pub(super) qkv_mv: MatVec,
    /// A Gated DeltaNet layer's further input products (decode, prompt), where its
    /// projections are stored in formats that do not stack into one.
    pub(super) extra_in: Vec<(MatVec, PromptProduct)>,
    pub(super) o_mv: MatVec,
    pub(super) attn_norm: Norm,
    /// The same norm, also quantizing its rows for `qkv_mm`'s int8 products (see
    /// [`Layer::norm_then`]).
    pub(super) attn_norm_int8: Option<NormInt8>,
    pub(super) qkv_mm: PromptProduct,
    pub(super) o_mm: PromptProduct,
    /// Norms adding the attention and MLP outputs to the residual stream (Gemma).
    pub(super) post_attn_norm: Option<Norm>,
    pub(super) post_mlp_norm: Option<Norm>,
    pub(super) mlp_norm: Norm,
    /// The same norm, also quantizing its rows for a dense MLP's up product.
    pub(super) mlp_norm_int8: Option<NormInt8>,
    pub(super) mlp: LayerMlp,
    pub(super) mixer: Mixer,
}

/// What mixes a layer's positions between its input and output products.
#[allow(clippy::large_enum_variant)]
pub(super) enum Mixer {
    Attention {
        /// Query/key head norms on the QKV rows (Qwen3), before RoPE.
        qk_norm: Option<HeadNorm>,
        rope: RopeKv,
        attention: Attention,
        /// Decoding's attention: split over runs of keys when the output product can merge
        /// them.
        decode_attention: Attention,
        /// RoPE and attention of a batched decode step, whose rows are tokens of different
        /// sequences (models with several cache slots).
        batch: Option<(RopeKv, Attention)>,
        /// The sigmoid output gate (Qwen3.5).
        gate: Option<OutputGate>,
    },
    /// A Gated DeltaNet layer and its part of the sequence's state.
    DeltaNet { net: DeltaNet, state: DeltaNetState },
}

/// A layer's MLP kernels: dense products, or a router and its experts. One per layer, built
/// once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum LayerMlp {
    Dense {
        up_mv: MatVec,
        down_mv: MatVec,
        up_mm: PromptProduct,
        glu: Option<Glu>,
        down_mm: PromptProduct,
    },
    /// The router's product over the normed rows (a decode product for one token), then
    /// routing, the experts and their sum into the residual stream.
    Experts {
        router: MatMul,
        router_mv: MatVec,
        experts: Experts,
        shared: Option<SharedExpert>,
        /// Decoding's router and expert products normalise the residual stream themselves.
        decode_normed: bool,
    },
}

/// A shared expert beside the routed ones (Qwen3.5-MoE): a SwiGLU over the normed rows whose
/// hidden row is scaled by sigmoid of a one-row product, then its down product added to the
/// residual stream.
pub(super) struct SharedExpert {
    pub(super) up_mv: MatVec,
    pub(super) gate_mv: MatVec,
    pub(super) down_mv: MatVec,
    pub(super) up_mm: PromptProduct,
    pub(super) glu: Option<Glu>,
    pub(super) gate_mm: MatMul,
    pub(super) scale: OutputGate,
    pub(super) down_mm: PromptProduct,
}

impl SharedExpert {
    fn encode_decode(&self, rec: &mut Recorder<'_>) {
        self.up_mv.encode(rec);
        self.gate_mv.encode(rec);
        self.scale.encode(rec, 1);
        self.down_mv.encode(rec);
    }

    fn encode_prompt(&self, rec: &mut Recorder<'_>, n: u32) {
        self.up_mm.encode(rec, n);
        if let Some(glu) = &self.glu {
            glu.encode(rec, n);
        }
        self.gate_mm.encode(rec, n);
        self.scale.encode(rec, n);
        self.down_mm.encode(rec, n);
    }
}

impl LayerMlp {
    /// Whether the down product hands the residual stream off to the next layer's QKV
    /// product (experts do not).
    pub(super) fn hands_off(&self) -> bool {
        match self {
            Self::Dense { down_mv, .. } => down_mv.hands_off(),
            Self::Experts { .. } => false,
        }
    }
}

impl Layer {
    /// Records this layer's part of the decode step that feeds the token at `pos` (`split`:
    /// decoding's attention runs split, RoPE included).
    pub(super) fn encode_decode(&self, rec: &mut Recorder<'_>, pos: u32, split: bool) {
        self.qkv_mv.encode(rec);
        for (mv, _) in &self.extra_in {
            mv.encode(rec);
        }
        match &self.mixer {
            Mixer::Attention {
                qk_norm,
                rope,
                decode_attention,
                gate,
                ..
            } => {
                // The split attention normalises the heads, applies RoPE and fills the cache
                // itself.
                if let Some(qk) = qk_norm.as_ref().filter(|_| !decode_attention.norms_heads()) {
                    qk.encode(rec, 1);
                }
                if !split {
                    rope.encode(rec, 1);
                }
                decode_attention.encode(rec, pos, 1);
                // Split runs are gated where the output product merges them.
                if let (Some(gate), false) = (gate, split) {
                    gate.encode(rec, 1);
                }
            }
            Mixer::DeltaNet { net, .. } => net.encode(rec),
        }
        self.o_mv.encode(rec);
        if let Some(norm) = &self.post_attn_norm {
            norm.encode(rec, 1);
        }
        match &self.mlp {
            LayerMlp::Dense { up_mv, down_mv, .. } => {
                up_mv.encode(rec);
                down_mv.encode(rec);
            }
            LayerMlp::Experts {
                router_mv,
                experts,
                shared,
                decode_normed,
                ..
            } => {
                if !decode_normed {
                    self.mlp_norm.encode(rec, 1);
                }
                router_mv.encode(rec);
                experts.encode_decode(rec);
                if let Some(shared) = shared {
                    shared.encode_decode(rec);
                }
            }
        }
        if let Some(norm) = &self.post_mlp_norm {
            norm.encode(rec, 1);
        }
    }

    /// Records this layer for the `n` prompt tokens starting at `pos0`.
    pub(super) fn encode_prompt(&self, rec: &mut Recorder<'_>, pos0: u32, n: u32) {
        self.encode_rows(rec, pos0, n, None);
    }

    /// Expert weight bytes a decoded token leaves unread in this layer.
    pub(super) fn unread_expert_bytes(&self) -> u64 {
        match &self.mlp {
            LayerMlp::Experts { experts, .. } => experts.unread_bytes_per_token(),
            LayerMlp::Dense { .. } => 0,
        }
    }

    /// Whether the layer has batched decode kernels (see [`Self::encode_batch`]).
    pub(super) fn batches(&self) -> bool {
        matches!(&self.mixer, Mixer::Attention { batch: Some(_), .. })
    }

    /// Records this layer for a batched decode step of `n` rows, each a token of its own
    /// sequence (the step's `rows`), the longest of which sees `longest` keys: the prompt's
    /// kernels, with RoPE and attention taking each row's position and cache slot. False
    /// where the layer has no batched kernels.
    pub(super) fn encode_batch(&self, rec: &mut Recorder<'_>, n: u32, longest: u32) -> bool {
        match &self.mixer {
            Mixer::Attention { batch: Some(_), .. } => {
                self.encode_rows(rec, 0, n, Some(longest));
                true
            }
            _ => false,
        }
    }

    /// Records `norm` and then `product` over `n` rows, the norm quantizing the rows itself
    /// (`fused`) where the product takes its int8 few-row form.
    fn norm_then(
        rec: &mut Recorder<'_>,
        (norm, fused): (&Norm, Option<&NormInt8>),
        product: &PromptProduct,
        n: u32,
        batched: bool,
    ) {
        if let (Some(fused), Some(int8)) = (fused, product.int8_taken(n, batched)) {
            fused.encode(rec, n);
            int8.encode_quantized(rec, n);
            return;
        }
        norm.encode(rec, n);
        if batched {
            product.encode_batch(rec, n);
        } else {
            product.encode(rec, n);
        }
    }

    /// `batched`: a batched step's longest row's keys; none for a prompt.
    fn encode_rows(&self, rec: &mut Recorder<'_>, pos0: u32, n: u32, batched: Option<u32>) {
        let attn_norm = (&self.attn_norm, self.attn_norm_int8.as_ref());
        Self::norm_then(rec, attn_norm, &self.qkv_mm, n, batched.is_some());
        for (_, mm) in &self.extra_in {
            mm.encode(rec, n);
        }
        match &self.mixer {
            Mixer::Attention {
                qk_norm,
                rope,
                attention,
                batch,
                gate,
                ..
            } => {
                if let Some(qk) = qk_norm {
                    qk.encode(rec, n);
                }
                match (batch, batched) {
                    (Some((rope, attention)), Some(longest)) => {
                        rope.encode(rec, n);
                        attention.encode_batch(rec, n, longest);
                    }
                    _ => {
                        rope.encode(rec, n);
                        attention.encode(rec, pos0, n);
                    }
                }
                if let Some(gate) = gate {
                    gate.encode(rec, n);
                }
            }
            Mixer::DeltaNet { net, .. } => net.encode_prompt(rec, n),
        }
        if batched.is_some() {
            self.o_mm.encode_batch(rec, n);
        } else {
            self.o_mm.encode(rec, n);
        }
        if let Some(norm) = &self.post_attn_norm {
            norm.encode(rec, n);
        }
        match &self.mlp {
            LayerMlp::Dense {
                up_mm,
                glu,
                down_mm,
                ..
            } => {
                let mlp_norm = (&self.mlp_norm, self.mlp_norm_int8.as_ref());
                Self::norm_then(rec, mlp_norm, up_mm, n, batched.is_some());
                if let Some(glu) = glu {
                    glu.encode(rec, n);
                }
                if batched.is_some() {
                    down_mm.encode_batch(rec, n);
                } else {
                    down_mm.encode(rec, n);
                }
            }
            LayerMlp::Experts {
                router,
                router_mv,
                experts,
                shared,
                ..
            } => {
                self.mlp_norm.encode(rec, n);
                // One row goes as a decoded token's does: its gate/up product may read the
                // input the router's decode product hands off.
                if n == 1 && experts.input_handoff().is_some() {
                    router_mv.encode(rec);
                    experts.encode_decode(rec);
                } else {
                    router.encode(rec, n);
                    experts.encode(rec, n);
                }
                if let Some(shared) = shared {
                    shared.encode_prompt(rec, n);
                }
            }
        }
        if let Some(norm) = &self.post_mlp_norm {
            norm.encode(rec, n);
        }
    }

    /// Records the reset of this layer's recurrent state (a Gated DeltaNet's) for a new
    /// forward pass from position 0.
    pub(super) fn clear_state(&self, rec: &mut Recorder<'_>) {
        if let Mixer::DeltaNet { state, .. } = &self.mixer {
            state.clear(rec);
        }
    }
}
