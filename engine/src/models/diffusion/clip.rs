//! transformers' `CLIPTextModel` / `CLIPTextModelWithProjection`: the prompt's token ids →
//! per-token hidden states (the last after the final LayerNorm, or the penultimate layer's
//! output for SDXL) and the pooled state at the end-of-text token.

use std::sync::Arc;

use super::config::{ClipAct, ClipConfig};
use super::graph::{Builder, Plan};
use crate::Error;
use crate::gpu::StorageBuffer;
use crate::ops::{FullLayout, Gelu};

pub struct ClipPlan {
    pub plan: Plan,
    /// `[tokens][hidden]` after the final LayerNorm (`last_hidden_state`).
    pub last: Arc<StorageBuffer>,
    /// `[tokens][hidden]`: the input of the last layer (`hidden_states[-2]`).
    pub penultimate: Option<Arc<StorageBuffer>>,
}

/// Records the encoder over `tokens` ids in `ids` (u32).
pub fn build_text_encoder(
    mut b: Builder<'_, '_>,
    cfg: &ClipConfig,
    ids: &Arc<StorageBuffer>,
    tokens: u32,
    want_penultimate: bool,
) -> Result<ClipPlan, Error> {
    // transformers writes `text_model.`-prefixed names; versions from 5 on drop the prefix.
    let root = if b.has("embeddings.token_embedding.weight") {
        ""
    } else {
        "text_model."
    };
    if tokens > cfg.positions {
        return Err(Error::Invalid(format!(
            "{tokens} tokens exceed the text encoder's {} positions",
            cfg.positions
        )));
    }
    let d = cfg.hidden;
    let mut x = b.embed(
        ids,
        tokens,
        (
            &format!("{root}embeddings.token_embedding.weight"),
            cfg.vocab,
        ),
        &format!("{root}embeddings.position_embedding.weight"),
        d,
    )?;
    let act = match cfg.act {
        ClipAct::QuickGelu => Gelu::Quick,
        ClipAct::Gelu => Gelu::Erf,
    };
    let mut penultimate = None;
    for l in 0..cfg.layers {
        if want_penultimate && l + 1 == cfg.layers {
            penultimate = Some(b.copy(&x)?);
        }
        let p = format!("{root}encoder.layers.{l}");
        let n1 = b.layer_norm(&x, &format!("{p}.layer_norm1"), cfg.eps)?;
        let qkv = b.linear_fused(
            &n1,
            &[
                &format!("{p}.self_attn.q_proj"),
                &format!("{p}.self_attn.k_proj"),
                &format!("{p}.self_attn.v_proj"),
            ],
            d,
            None,
            None,
        )?;
        b.release(n1);
        let layout = FullLayout {
            heads: cfg.heads,
            kv_heads: cfg.heads,
            head_dim: d / cfg.heads,
            keys: tokens,
            q_stride: 3 * d,
            kv_stride: 3 * d,
            k_off: d,
            f16: false,
        };
        let att = b.attention(&qkv, &qkv, layout, true)?;
        b.release(qkv);
        x = b.linear(&att, &format!("{p}.self_attn.out_proj"), d, None, Some(x))?;
        b.release(att);
        let n2 = b.layer_norm(&x, &format!("{p}.layer_norm2"), cfg.eps)?;
        let f = b.linear(
            &n2,
            &format!("{p}.mlp.fc1"),
            cfg.intermediate,
            Some(act),
            None,
        )?;
        b.release(n2);
        x = b.linear(&f, &format!("{p}.mlp.fc2"), d, None, Some(x))?;
        b.release(f);
    }
    let last = b.layer_norm(&x, &format!("{root}final_layer_norm"), cfg.eps)?;
    b.release(x);
    let last_buf = last.buf.clone();
    let penultimate = penultimate.map(|p| p.buf.clone());
    let (plan, _) = b.finish();
    Ok(ClipPlan {
        plan,
        last: last_buf,
        penultimate,
    })
}

/// The pooled state's projection (`text_projection`, no bias) of CLIPTextModelWithProjection.
pub fn build_projection(
    mut b: Builder<'_, '_>,
    cfg: &ClipConfig,
    pooled: &Arc<StorageBuffer>,
) -> Result<(Plan, Arc<StorageBuffer>), Error> {
    let dim = cfg
        .projection
        .ok_or_else(|| Error::Invalid("this text encoder has no projection".into()))?;
    let x = Builder::external(pooled, 1, 1, cfg.hidden);
    let y = b.linear(&x, "text_projection", dim, None, None)?;
    let out = y.buf.clone();
    let (plan, _) = b.finish();
    Ok((plan, out))
}

/// The position of the pooled token: transformers' rule, the first end-of-text id (the
/// highest id for configs from before `eos_token_id` was meaningful).
pub fn pooled_position(ids: &[u32], eos_token_id: u32) -> usize {
    if eos_token_id == 2 {
        ids.iter()
            .enumerate()
            .max_by_key(|(i, id)| (**id, std::cmp::Reverse(*i)))
            .map_or(0, |(i, _)| i)
    } else {
        ids.iter()
            .position(|&id| id == eos_token_id)
            .unwrap_or(ids.len().saturating_sub(1))
    }
}
