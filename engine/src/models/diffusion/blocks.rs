//! The layers the UNet and the VAE share: ResNet blocks, the UNet's spatial transformer and
//! the VAE's single-head attention, in diffusers' weight names.

use super::graph::{Act, Builder};
use crate::Error;
use crate::ops::{FullLayout, NormActivation};

/// GroupNorm settings of a network.
#[derive(Clone, Copy, Debug)]
pub struct Norms {
    pub groups: u32,
    pub eps: f32,
}

/// diffusers' `ResnetBlock2D`: norm → SiLU → conv (+ time embedding) → norm → SiLU → conv,
/// plus the input (through a 1×1 convolution when the width changes). `temb` is the
/// SiLU of the time embedding.
pub fn resnet(
    b: &mut Builder<'_, '_>,
    x: &Act,
    name: &str,
    out: u32,
    temb: Option<&Act>,
    norms: Norms,
) -> Result<Act, Error> {
    // The time embedding's projection joins conv1's bias: one per-channel vector.
    let temb_bias = match temb {
        Some(t) => {
            let conv_bias = b.vector(&format!("{name}.conv1.bias"), out, None)?;
            let acc = b.copy(&Builder::external(&conv_bias, 1, 1, out))?;
            let v = b.linear(t, &format!("{name}.time_emb_proj"), out, None, Some(acc))?;
            Some(v)
        }
        None => None,
    };
    let conv1 = format!("{name}.conv1");
    let bias1 = match &temb_bias {
        Some(v) => Some(v.buf.clone()),
        None => b.bias(&conv1, out)?,
    };
    let groups = (norms.groups, norms.eps);
    let h1 = b.normed_conv(
        x,
        &format!("{name}.norm1"),
        groups,
        &conv1,
        out,
        bias1,
        None,
    )?;
    if let Some(v) = temb_bias {
        b.release(v);
    }
    let shortcut_name = format!("{name}.conv_shortcut");
    let shortcut = if b.has(&format!("{shortcut_name}.weight")) {
        b.conv(x, &shortcut_name, out, 1, 1, 0, false, None)?
    } else if x.channels == out {
        b.copy(x)?
    } else {
        return Err(Error::Invalid(format!(
            "{name}: {} → {out} channels without conv_shortcut",
            x.channels
        )));
    };
    let conv2 = format!("{name}.conv2");
    let bias2 = b.bias(&conv2, out)?;
    let norm2 = format!("{name}.norm2");
    let y = b.normed_conv(&h1, &norm2, groups, &conv2, out, bias2, Some(shortcut))?;
    b.release(h1);
    Ok(y)
}

/// The settings of one `Transformer2DModel`.
#[derive(Clone, Copy, Debug)]
pub struct TransformerShape {
    pub heads: u32,
    /// Transformer blocks.
    pub depth: u32,
    /// Linear (SD 2.x, SDXL) rather than 1×1-convolution input and output projections.
    pub linear_projection: bool,
    pub groups: u32,
}

/// diffusers' `Transformer2DModel` over `x` (consumed): GroupNorm, input projection,
/// `depth` blocks of self-attention, cross-attention over `context` and GEGLU feed-forward,
/// output projection plus the input.
pub fn spatial_transformer(
    b: &mut Builder<'_, '_>,
    x: Act,
    name: &str,
    context: &Act,
    shape: TransformerShape,
) -> Result<Act, Error> {
    let TransformerShape {
        heads,
        depth,
        linear_projection,
        groups,
    } = shape;
    let channels = x.channels;
    let n = b.group_norm(
        &x,
        &format!("{name}.norm"),
        groups,
        1e-6,
        NormActivation::None,
    )?;
    let proj_in = format!("{name}.proj_in");
    let mut h = if linear_projection {
        b.linear(&n, &proj_in, channels, None, None)?
    } else {
        b.conv(&n, &proj_in, channels, 1, 1, 0, false, None)?
    };
    b.release(n);
    for d in 0..depth {
        h = transformer_block(
            b,
            h,
            &format!("{name}.transformer_blocks.{d}"),
            heads,
            context,
        )?;
    }
    let proj_out = format!("{name}.proj_out");
    let y = if linear_projection {
        b.linear(&h, &proj_out, channels, None, Some(x))?
    } else {
        b.conv(&h, &proj_out, channels, 1, 1, 0, false, Some(x))?
    };
    b.release(h);
    Ok(y)
}

/// diffusers' `BasicTransformerBlock` (pre-norm, residual after each part).
fn transformer_block(
    b: &mut Builder<'_, '_>,
    h: Act,
    name: &str,
    heads: u32,
    context: &Act,
) -> Result<Act, Error> {
    let inner = h.channels;
    let head_dim = inner / heads;
    let n1 = b.layer_norm(&h, &format!("{name}.norm1"), 1e-5)?;
    let a1 = format!("{name}.attn1");
    let qkv = b.linear_fused(
        &n1,
        &[
            &format!("{a1}.to_q"),
            &format!("{a1}.to_k"),
            &format!("{a1}.to_v"),
        ],
        inner,
        None,
        None,
    )?;
    b.release(n1);
    let self_layout = FullLayout {
        heads,
        kv_heads: heads,
        head_dim,
        keys: qkv.pixels(),
        q_stride: 3 * inner,
        kv_stride: 3 * inner,
        k_off: inner,
        f16: false,
    };
    let att = b.attention(&qkv, &qkv, self_layout, false)?;
    b.release(qkv);
    let h = b.linear(&att, &format!("{a1}.to_out.0"), inner, None, Some(h))?;
    b.release(att);

    let n2 = b.layer_norm(&h, &format!("{name}.norm2"), 1e-5)?;
    let a2 = format!("{name}.attn2");
    let q = b.linear(&n2, &format!("{a2}.to_q"), inner, None, None)?;
    b.release(n2);
    let kv = b.linear_fused(
        context,
        &[&format!("{a2}.to_k"), &format!("{a2}.to_v")],
        inner,
        None,
        None,
    )?;
    let cross_layout = FullLayout {
        heads,
        kv_heads: heads,
        head_dim,
        keys: context.pixels(),
        q_stride: inner,
        kv_stride: 2 * inner,
        k_off: 0,
        f16: false,
    };
    let att = b.attention(&q, &kv, cross_layout, false)?;
    b.release(q);
    b.release(kv);
    let h = b.linear(&att, &format!("{a2}.to_out.0"), inner, None, Some(h))?;
    b.release(att);

    let n3 = b.layer_norm(&h, &format!("{name}.norm3"), 1e-5)?;
    let g = b.linear_geglu(&n3, &format!("{name}.ff.net.0.proj"), 4 * inner)?;
    b.release(n3);
    let h = b.linear(&g, &format!("{name}.ff.net.2"), inner, None, Some(h))?;
    b.release(g);
    Ok(h)
}

/// The VAE's mid-block attention: GroupNorm, one head over all channels, output
/// projection plus the input.
pub fn vae_attention(
    b: &mut Builder<'_, '_>,
    x: &Act,
    name: &str,
    norms: Norms,
) -> Result<Act, Error> {
    let c = x.channels;
    let n = b.group_norm(
        x,
        &format!("{name}.group_norm"),
        norms.groups,
        norms.eps,
        NormActivation::None,
    )?;
    // VAE files saved before diffusers 0.14 name the projections query/key/value/proj_attn.
    let legacy = !b.has(&format!("{name}.to_q.weight")) && b.has(&format!("{name}.query.weight"));
    let [q_name, k_name, v_name, out_name] = if legacy {
        ["query", "key", "value", "proj_attn"]
    } else {
        ["to_q", "to_k", "to_v", "to_out.0"]
    };
    let q = b.linear(&n, &format!("{name}.{q_name}"), c, None, None)?;
    let k = b.linear(&n, &format!("{name}.{k_name}"), c, None, None)?;
    let v = b.linear(&n, &format!("{name}.{v_name}"), c, None, None)?;
    b.release(n);
    let o = b.wide_attention(&q, &k, &v)?;
    b.release(q);
    b.release(k);
    b.release(v);
    let residual = b.copy(x)?;
    let y = b.linear(&o, &format!("{name}.{out_name}"), c, None, Some(residual))?;
    b.release(o);
    Ok(y)
}

/// `linear_1 → SiLU → linear_2` (the time and added-condition embeddings), optionally added
/// into `residual`.
pub fn embedding_mlp(
    b: &mut Builder<'_, '_>,
    x: &Act,
    name: &str,
    dim: u32,
    residual: Option<Act>,
) -> Result<Act, Error> {
    let h = b.linear(x, &format!("{name}.linear_1"), dim, None, None)?;
    let s = b.silu(&h)?;
    b.release(h);
    let y = b.linear(&s, &format!("{name}.linear_2"), dim, None, residual)?;
    b.release(s);
    Ok(y)
}
