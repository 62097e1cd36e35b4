//! What a model family says about itself: where its weights are, by name. The shared builder
//! (`build.rs`) reads a [`Family`] and the config's [`DecoderSpec`] (norm kind, activation,
//! biases, RoPE, sizes) and needs no branch per family; a family file (`llama.rs`, `gpt2.rs`)
//! is one `Family` value. GGUF files are read through the same names (see
//! `load::gguf_tensor_name`).

use crate::Error;
use crate::gpu::StorageBuffer;
use crate::load::{Arch, DecoderSpec};
use crate::ops::{DeltaNetWeights, ExpertWeights, Matrix};

use super::super::weights::{Part, Uploader};

/// A weight name: `{P}` stands for the checkpoint's prefix (see [`Family::prefixes`]) and
/// `{L}` for the layer index.
pub(super) type Name = &'static str;

/// Where a layer's stacked projection (q/k/v, or gate/up) lives.
pub(super) enum Projection {
    /// One matrix per block, stacked in this order (q, k, v; or gate, up — just up for
    /// ungated MLPs).
    Separate(&'static [Name]),
    /// One matrix already holding every block in order.
    Fused(Name),
}

/// The weights of one layer (biases are read only where the config says the family has them).
pub(super) struct LayerNames {
    pub attn_norm: Name,
    pub attn_norm_bias: Option<Name>,
    pub qkv: Projection,
    pub qkv_bias: Projection,
    /// Per-head RMSNorm weights of queries and keys (families that have them).
    pub q_norm: Option<Name>,
    pub k_norm: Option<Name>,
    pub o: Name,
    pub o_bias: Name,
    pub mlp_norm: Name,
    pub mlp_norm_bias: Option<Name>,
    /// Norms of the attention and MLP outputs before their residual adds (the config's
    /// `post_norms` says whether they are read).
    pub post_attn_norm: Option<Name>,
    pub post_mlp_norm: Option<Name>,
    /// Gate then up for gated MLPs; the single up projection otherwise.
    pub up: Projection,
    pub up_bias: Projection,
    pub down: Name,
    pub down_bias: Name,
    /// Per-head attention sink logits (the config's `sinks` says whether they are read).
    pub sinks: Option<Name>,
    /// The weights of linear-attention layers (the config's `linear` says which layers).
    pub linear: Option<LinearNames>,
    /// A sparse layer's shared expert (the config's `moe.shared` says whether it is read).
    pub shared_expert: Option<SharedExpertNames>,
}

/// A shared expert's weights (Qwen3.5-MoE): its gate and up projections, its down projection,
/// and the one-row product whose sigmoid scales its output.
pub(super) struct SharedExpertNames {
    pub up: Projection,
    pub down: Name,
    pub gate: Name,
}

/// A Gated DeltaNet layer's weights (Qwen3.5): its input projections (q/k/v, z, b, a) stacked
/// into one product, the convolution, A_log, dt_bias, the output norm and projection.
pub(super) struct LinearNames {
    pub in_proj: Projection,
    pub conv: Name,
    pub a_log: Name,
    pub dt_bias: Name,
    pub norm: Name,
    pub out: Name,
}

pub(super) struct Family {
    /// Checkpoint prefixes, tried in order: the first under which the embedding exists.
    pub prefixes: &'static [&'static str],
    pub embedding: Name,
    /// Learned absolute positions, added to the token embedding on gather.
    pub positions: Option<Name>,
    pub final_norm: Name,
    pub final_norm_bias: Option<Name>,
    /// A separate LM head, used unless the config ties it to the embedding.
    pub lm_head: Name,
    pub layer: LayerNames,
    /// Matrices are stored `[in][out]` (GPT-2's Conv1D) rather than `[out][in]` in the
    /// family's own checkpoints.
    pub transposed: bool,
    /// RMSNorms scale by (1 + w) in the family's own checkpoints (Gemma); GGUF converters
    /// store the sum.
    pub norm_plus_one: bool,
}

/// The family that describes checkpoints of `arch`.
pub(super) fn family_of(arch: Arch) -> &'static Family {
    match arch {
        // Qwen2 is the Llama layout with q/k/v biases, which its config announces.
        Arch::Llama | Arch::Qwen2 => &super::llama::FAMILY,
        Arch::Qwen3 | Arch::Qwen3Moe => &super::qwen3::FAMILY,
        Arch::GptOss => &super::gpt_oss::FAMILY,
        Arch::Qwen35 => &super::qwen35::FAMILY,
        Arch::Phi3 => &super::phi3::FAMILY,
        Arch::Gpt2 => &super::gpt2::FAMILY,
        Arch::Gemma3 => &super::gemma3::FAMILY,
    }
}

/// A layer's weights on the GPU.
pub(super) struct LayerWeights {
    pub attn_norm: (StorageBuffer, Option<StorageBuffer>),
    pub qkv: Matrix,
    pub qkv_bias: Option<StorageBuffer>,
    /// Query and key head norm weights (head_dim each).
    pub qk_norm: Option<(StorageBuffer, StorageBuffer)>,
    pub o: Matrix,
    pub o_bias: Option<StorageBuffer>,
    pub mlp_norm: (StorageBuffer, Option<StorageBuffer>),
    /// Post-attention and post-MLP norm weights.
    pub post_norms: Option<(StorageBuffer, StorageBuffer)>,
    /// Per-head sink logits (GPT-OSS).
    pub sinks: Option<StorageBuffer>,
    pub mlp: MlpWeights,
    /// A Gated DeltaNet layer's own weights (`qkv` is then its input product, or the first of
    /// them, and `o` its output product).
    pub delta: Option<DeltaNetWeights>,
    /// Where a Gated DeltaNet layer's input products put z and the gates.
    pub linear_in: Option<LinearInputs>,
    /// The shared expert beside the routed ones.
    pub shared_expert: Option<SharedExpertWeights>,
}

/// A Gated DeltaNet layer's input products after the first (`LayerWeights::qkv`, which always
/// makes q/k/v), where its projections are stored in formats that do not stack into one, and
/// where z and the gates [b, a] are in their rows.
pub(super) struct LinearInputs {
    /// Each writes rows of its own.
    pub extra: Vec<Matrix>,
    /// (product, offset in its rows) of z and of the gates; product 0 is `qkv`.
    pub z: (usize, u32),
    pub gates: (usize, u32),
}

/// A shared expert on the GPU: gate and up rows stacked, down, and the `[1][hidden]` gate row.
pub(super) struct SharedExpertWeights {
    pub up: Matrix,
    pub down: Matrix,
    pub gate: Matrix,
}

/// A layer's MLP: dense, or routed experts.
pub(super) enum MlpWeights {
    Dense {
        up: Matrix,
        up_bias: Option<StorageBuffer>,
        down: Matrix,
        down_bias: Option<StorageBuffer>,
    },
    Experts(ExpertWeights),
}

impl MlpWeights {
    /// The dense MLP's matrices (none for experts).
    pub fn dense(&self) -> Option<(&Matrix, &Matrix)> {
        match self {
            Self::Dense { up, down, .. } => Some((up, down)),
            Self::Experts(_) => None,
        }
    }
}

impl Family {
    /// The prefix this checkpoint uses (the first with an embedding; else the first listed, so
    /// the missing-weight error names the expected tensor).
    pub fn prefix(&self, up: &Uploader<'_>) -> &'static str {
        self.prefixes
            .iter()
            .copied()
            .find(|p| up.has(&self.name(p, self.embedding, 0)))
            .unwrap_or(self.prefixes[0])
    }

    /// Whether this checkpoint's matrices are `[in][out]` (GGUF converters store them
    /// `[out][in]` whatever the family).
    pub(super) fn transposed(&self, up: &Uploader<'_>) -> bool {
        self.transposed && !up.is_gguf()
    }

    /// `name` with the prefix and layer index filled in.
    pub fn name(&self, prefix: &str, name: Name, layer: u32) -> String {
        name.replace("{P}", prefix)
            .replace("{L}", &layer.to_string())
    }

    /// What is added to stored norm weights to get the scale (1 for (1 + w) norms).
    pub fn norm_offset(&self, up: &Uploader<'_>) -> f32 {
        if self.norm_plus_one && !up.is_gguf() {
            1.0
        } else {
            0.0
        }
    }

    /// Uploads layer `i`.
    pub fn load_layer(
        &self,
        up: &mut Uploader<'_>,
        spec: &DecoderSpec,
        prefix: &str,
        i: u32,
    ) -> Result<LayerWeights, Error> {
        if let Some(linear) = spec.linear.as_ref().filter(|l| l.is_linear(i)) {
            return self.load_linear_layer(up, spec, linear, prefix, i);
        }
        let names = &self.layer;
        let n = |name: Name| self.name(prefix, name, i);
        let d = spec.hidden;
        let (q_rows, kv_rows) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
        // Gated attention's query product carries a gate head after each query head.
        let stored_q_rows = if spec.output_gate { 2 * q_rows } else { q_rows };
        let label = format!("layer {i}");
        let offset = self.norm_offset(up);
        let norm = |up: &mut Uploader<'_>, w: Name, b: Option<Name>| {
            norm_pair(up, &label, &n(w), b.map(n).as_deref(), d, offset)
        };
        let attn_norm = norm(up, names.attn_norm, names.attn_norm_bias)?;
        let qkv_rows = [stored_q_rows, kv_rows, kv_rows];
        let qkv = self.stacked(up, &format!("{label} qkv"), &names.qkv, &qkv_rows, d, &n)?;
        let qkv_bias = spec
            .qkv_bias
            .then(|| stacked_vector(up, &label, &names.qkv_bias, &qkv_rows, &n))
            .transpose()?;
        let hd = spec.head_dim;
        let qk_norm = match (spec.qk_norm, names.q_norm, names.k_norm) {
            (false, ..) => None,
            (true, Some(q), Some(k)) => Some((
                up.norm_vector(&label, &n(q), hd, offset)?,
                up.norm_vector(&label, &n(k), hd, offset)?,
            )),
            (true, ..) => {
                return Err(Error::Invalid(format!(
                    "{:?} checkpoints have no query/key norms, but the config asks for them",
                    spec.arch
                )));
            }
        };
        let o = self.single(up, &format!("{label} o"), &n(names.o), d, q_rows)?;
        let o_bias = spec
            .out_bias
            .then(|| up.vector(&label, &[(&n(names.o_bias), d)], None))
            .transpose()?;
        let mlp_norm = norm(up, names.mlp_norm, names.mlp_norm_bias)?;
        let post_norms = match (spec.post_norms, names.post_attn_norm, names.post_mlp_norm) {
            (false, ..) => None,
            (true, Some(a), Some(m)) => Some((
                up.norm_vector(&label, &n(a), d, offset)?,
                up.norm_vector(&label, &n(m), d, offset)?,
            )),
            (true, ..) => {
                return Err(Error::Invalid(format!(
                    "{:?} checkpoints have no post-attention/MLP norms, but the config asks for them",
                    spec.arch
                )));
            }
        };
        let sinks = match (spec.sinks, names.sinks) {
            (false, _) => None,
            (true, Some(name)) => Some(up.vector(&label, &[(&n(name), spec.heads)], None)?),
            (true, None) => {
                return Err(Error::Invalid(format!(
                    "{:?} checkpoints have no attention sinks, but the config asks for them",
                    spec.arch
                )));
            }
        };
        let (mlp, shared_expert) = self.mlp(up, spec, prefix, i, &label, &n)?;
        Ok(LayerWeights {
            attn_norm,
            qkv,
            qkv_bias,
            qk_norm,
            o,
            o_bias,
            mlp_norm,
            post_norms,
            sinks,
            mlp,
            delta: None,
            linear_in: None,
            shared_expert,
        })
    }

    /// Layer `i`'s MLP: dense, or routed experts (with their shared expert where the config
    /// has one).
    pub(super) fn mlp(
        &self,
        up: &mut Uploader<'_>,
        spec: &DecoderSpec,
        prefix: &str,
        i: u32,
        label: &str,
        n: &dyn Fn(Name) -> String,
    ) -> Result<(MlpWeights, Option<SharedExpertWeights>), Error> {
        let Some(moe) = spec.moe.as_ref().filter(|m| m.is_sparse(i)) else {
            return Ok((self.dense_mlp(up, spec, label, n)?, None));
        };
        let experts = MlpWeights::Experts(super::experts::load(up, spec, moe, prefix, i)?);
        if !moe.shared {
            return Ok((experts, None));
        }
        let Some(names) = &self.layer.shared_expert else {
            return Err(Error::Invalid(format!(
                "{:?} checkpoints have no shared expert, but the config asks for one",
                spec.arch
            )));
        };
        let (d, width) = (spec.hidden, spec.intermediate);
        let shared = SharedExpertWeights {
            up: self.stacked(
                up,
                &format!("{label} shared gate/up"),
                &names.up,
                &[width, width],
                d,
                n,
            )?,
            down: self.single(
                up,
                &format!("{label} shared down"),
                &n(names.down),
                d,
                width,
            )?,
            gate: up.f32_matrix(&format!("{label} shared gate"), &n(names.gate), 1, d)?,
        };
        Ok((experts, Some(shared)))
    }

    /// A dense MLP's gate/up (or up) and down projections.
    fn dense_mlp(
        &self,
        up: &mut Uploader<'_>,
        spec: &DecoderSpec,
        label: &str,
        n: &dyn Fn(Name) -> String,
    ) -> Result<MlpWeights, Error> {
        let names = &self.layer;
        let d = spec.hidden;
        let gates = if spec.mlp.gated() { 2 } else { 1 };
        let up_rows = vec![spec.intermediate; gates];
        let up_m = self.stacked(up, &format!("{label} up"), &names.up, &up_rows, d, n)?;
        let down = self.single(
            up,
            &format!("{label} down"),
            &n(names.down),
            d,
            spec.intermediate,
        )?;
        let (up_bias, down_bias) = if spec.mlp_bias {
            (
                Some(stacked_vector(up, label, &names.up_bias, &up_rows, n)?),
                Some(up.vector(label, &[(&n(names.down_bias), d)], None)?),
            )
        } else {
            (None, None)
        };
        Ok(MlpWeights::Dense {
            up: up_m,
            up_bias,
            down,
            down_bias,
        })
    }

    /// One `rows`×`cols` matrix.
    pub(super) fn single(
        &self,
        up: &mut Uploader<'_>,
        label: &str,
        name: &str,
        rows: u32,
        cols: u32,
    ) -> Result<Matrix, Error> {
        up.matrix(label, &[Part { name, rows, cols }], self.transposed(up))
    }

    /// Blocks of `rows` (each `cols` wide) stacked into one matrix, from separate or fused
    /// weights; `name` resolves the layer's names.
    pub(super) fn stacked(
        &self,
        up: &mut Uploader<'_>,
        label: &str,
        projection: &Projection,
        rows: &[u32],
        cols: u32,
        name: &dyn Fn(Name) -> String,
    ) -> Result<Matrix, Error> {
        match projection {
            Projection::Fused(n) => self.single(up, label, &name(n), rows.iter().sum(), cols),
            Projection::Separate(names) => {
                let names: Vec<String> = names.iter().map(|n| name(n)).collect();
                let parts: Vec<Part<'_>> = names
                    .iter()
                    .zip(rows)
                    .map(|(name, &rows)| Part { name, rows, cols })
                    .collect();
                up.matrix(label, &parts, self.transposed(up))
            }
        }
    }
}

/// A stacked bias vector, from separate or fused tensors.
fn stacked_vector(
    up: &mut Uploader<'_>,
    label: &str,
    projection: &Projection,
    rows: &[u32],
    name: &dyn Fn(Name) -> String,
) -> Result<StorageBuffer, Error> {
    match projection {
        Projection::Fused(n) => up.vector(label, &[(&name(n), rows.iter().sum())], None),
        Projection::Separate(names) => {
            let names: Vec<String> = names.iter().map(|n| name(n)).collect();
            let parts: Vec<(&str, u32)> = names
                .iter()
                .map(String::as_str)
                .zip(rows.iter().copied())
                .collect();
            up.vector(label, &parts, None)
        }
    }
}

/// A norm's weight (plus `offset`, see [`Family::norm_offset`]) and optional bias.
pub(super) fn norm_pair(
    up: &mut Uploader<'_>,
    label: &str,
    weight: &str,
    bias: Option<&str>,
    width: u32,
    offset: f32,
) -> Result<(StorageBuffer, Option<StorageBuffer>), Error> {
    let w = up.norm_vector(label, weight, width, offset)?;
    let b = bias
        .map(|b| up.vector(label, &[(b, width)], None))
        .transpose()?;
    Ok((w, b))
}
