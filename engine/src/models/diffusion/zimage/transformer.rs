//! diffusers' `ZImageTransformer2DModel` as a plan for one latent size and caption length:
//! the latent cut into patch tokens, refined on its own under the timestep's modulation, the
//! caption refined on its own without it, then both as one sequence (image tokens first)
//! through the main blocks, and the image tokens back to a latent.

use std::sync::Arc;

use super::config::{SEQ_MULTIPLE, TIME_HIDDEN, ZImageConfig};
use super::rope::Positions;
use crate::Error;
use crate::gpu::StorageBuffer;
use crate::models::diffusion::graph::{Act, Activation, Builder, Halves, Plan};
use crate::models::diffusion::rope_table::rope_table;
use crate::ops::{
    FullLayout, PatchShape, RowNorm, RowNormForm, Slice, fill_rows, fill_tail, gated_add,
    head_rope, mod_norm, patchify, unpatchify,
};

/// What a plan reads each call and where its output lands.
pub struct ZImageIo {
    /// `[h·w][in_channels]`: the latent, channel-last.
    pub latent: Arc<StorageBuffer>,
    /// `[256]`: the sinusoidal embedding of the scaled timestep.
    pub time_proj: Arc<StorageBuffer>,
    /// `[caption_rows][cap_feat_dim]`: the text encoder's hidden states, then any rows.
    pub caption: Arc<StorageBuffer>,
    /// The caption's rows, padded: a plan serves every caption that pads to as many.
    pub caption_rows: u32,
    /// One u32: how many of those rows the caption fills (the rest take the padding token),
    /// written with each call's caption.
    pub caption_used: Arc<StorageBuffer>,
    /// `[h·w][in_channels]`: the transformer's output.
    pub out: Arc<StorageBuffer>,
}

pub struct ZImagePlan {
    pub plan: Plan,
    pub activation_bytes: u64,
}

/// `n` rounded up to the sequence multiple.
pub fn padded(n: u32) -> u32 {
    n.div_ceil(SEQ_MULTIPLE) * SEQ_MULTIPLE
}

/// Records the transformer for an `h`×`w` latent.
pub fn build_transformer(
    mut b: Builder<'_, '_>,
    cfg: &ZImageConfig,
    io: &ZImageIo,
    (h, w): (u32, u32),
) -> Result<ZImagePlan, Error> {
    let p = cfg.patch;
    if !h.is_multiple_of(p) || !w.is_multiple_of(p) || h == 0 || w == 0 {
        return Err(Error::Invalid(format!(
            "a {w}×{h} latent is not a whole number of {p}×{p} patches"
        )));
    }
    if io.caption_rows == 0 || io.caption_rows != padded(io.caption_rows) {
        return Err(Error::Invalid(format!(
            "caption rows {}: a positive multiple of the sequence padding is needed",
            io.caption_rows
        )));
    }
    let positions = Positions::new(io.caption_rows, (h / p, w / p));
    let dim = cfg.dim;

    let time = Builder::external(&io.time_proj, 1, 1, super::config::TIME_FREQUENCIES);
    let t1 = b.linear(&time, "t_embedder.mlp.0", TIME_HIDDEN, None, None)?;
    let t1s = b.silu(&t1)?;
    b.release(t1);
    let adaln = b.linear(&t1s, "t_embedder.mlp.2", cfg.adaln_dim(), None, None)?;
    b.release(t1s);

    let image_rope = upload_table(&b, cfg, &positions.image())?;
    let caption_rope = upload_table(&b, cfg, &positions.caption())?;
    let joint_rope = upload_table(&b, cfg, &positions.joint())?;

    // Patch tokens; the rows past the image's are the learned padding token.
    let (img, img_total) = (positions.image_tokens, positions.image_padded);
    let shape = PatchShape {
        tokens: img,
        width: w,
        channels: cfg.in_channels,
        side: p,
    };
    let tokens = b.alloc(1, img_total, cfg.patch_features())?;
    let pass = patchify(b.gpu, shape, &io.latent, &tokens.buf)?;
    b.push(move |rec| pass.encode(rec));
    let name = format!("all_x_embedder.{p}-1");
    let mut x = b.linear(&tokens, &name, dim, None, None)?;
    b.release(tokens);
    pad_rows(&mut b, &x, img, "x_pad_token")?;
    for i in 0..cfg.refiner_layers {
        let name = format!("noise_refiner.{i}");
        x = block(&mut b, x, &name, cfg, &image_rope, Some(&adaln))?;
    }

    let cap_total = positions.caption_padded;
    let caption = Builder::external(&io.caption, 1, cap_total, cfg.cap_feat_dim);
    let normed = rms_norm(
        &mut b,
        &caption,
        "cap_embedder.0",
        cfg.norm_eps,
        None,
        false,
    )?;
    let mut c = b.linear(&normed, "cap_embedder.1", dim, None, None)?;
    b.release(normed);
    let token = b.vector("cap_pad_token", dim, None)?;
    let pass = fill_tail(b.gpu, (cap_total, dim), &io.caption_used, &token, &c.buf)?;
    b.push(move |rec| pass.encode(rec));
    for i in 0..cfg.refiner_layers {
        let name = format!("context_refiner.{i}");
        c = block(&mut b, c, &name, cfg, &caption_rope, None)?;
    }

    let mut joint = b.alloc(1, img_total + cap_total, dim)?;
    let row_bytes = u64::from(dim) * 4;
    let (xs, cs, js) = (x.buf.clone(), c.buf.clone(), joint.buf.clone());
    let image_bytes = u64::from(img_total) * row_bytes;
    let caption_bytes = u64::from(cap_total) * row_bytes;
    b.push(move |rec| {
        rec.copy(&xs.buffer, 0, &js.buffer, 0, image_bytes);
        rec.copy(&cs.buffer, 0, &js.buffer, image_bytes, caption_bytes);
    });
    b.release(x);
    b.release(c);
    for i in 0..cfg.layers {
        let name = format!("layers.{i}");
        joint = block(&mut b, joint, &name, cfg, &joint_rope, Some(&adaln))?;
    }

    let final_name = format!("all_final_layer.{p}-1");
    let adaln_silu = b.silu(&adaln)?;
    let scale = b.linear(
        &adaln_silu,
        &format!("{final_name}.adaLN_modulation.1"),
        dim,
        None,
        None,
    )?;
    b.release(adaln_silu);
    let normed = b.alloc(1, joint.pixels(), dim)?;
    let form = RowNormForm {
        norm: RowNorm::PlainLayer,
        eps: 1e-6,
        weight: None,
        scale: Some(Slice {
            buffer: &scale.buf,
            offset: 0,
        }),
        shift: None,
        half_out: false,
    };
    let pass = mod_norm(b.gpu, (joint.pixels(), dim), form, &joint.buf, &normed.buf)?;
    b.push(move |rec| pass.encode(rec));
    b.release(joint);
    b.release(scale);
    let out = b.linear(
        &normed,
        &format!("{final_name}.linear"),
        cfg.patch_features(),
        None,
        None,
    )?;
    b.release(normed);
    let pass = unpatchify(b.gpu, shape, &out.buf, &io.out)?;
    b.push(move |rec| pass.encode(rec));
    b.release(out);
    b.release(adaln);
    let (plan, activation_bytes) = b.finish();
    Ok(ZImagePlan {
        plan,
        activation_bytes,
    })
}

fn upload_table(
    b: &Builder<'_, '_>,
    cfg: &ZImageConfig,
    ids: &[[u32; 3]],
) -> Result<Arc<StorageBuffer>, Error> {
    let table = rope_table(ids, &cfg.axes_dims, cfg.rope_theta, true);
    Ok(Arc::new(b.gpu.storage_from("rope table", &table)?))
}

/// Rows `from..` of `x` set to the learned token `name` (`[1][dim]`).
fn pad_rows(b: &mut Builder<'_, '_>, x: &Act, from: u32, name: &str) -> Result<(), Error> {
    let rows = x.pixels() - from;
    if rows == 0 {
        return Ok(());
    }
    let token = b.vector(name, x.channels, None)?;
    let pass = fill_rows(b.gpu, (from, rows, x.channels), &token, &x.buf)?;
    b.push(move |rec| pass.encode(rec));
    Ok(())
}

/// RMSNorm `name` (`.weight`) of every row, scaled by `1 + scale` when given; with `half`,
/// written as f16 pairs for a product that reads them so.
fn rms_norm(
    b: &mut Builder<'_, '_>,
    x: &Act,
    name: &str,
    eps: f32,
    scale: Option<(&Act, u32)>,
    half: bool,
) -> Result<Act, Error> {
    let weight = b.vector(&format!("{name}.weight"), x.channels, Some(1.0))?;
    let y = b.alloc(x.h, x.w, x.channels)?;
    let form = RowNormForm {
        norm: RowNorm::Rms,
        eps,
        weight: Some(&weight),
        scale: scale.map(|(m, offset)| Slice {
            buffer: &m.buf,
            offset,
        }),
        shift: None,
        half_out: half,
    };
    let pass = mod_norm(b.gpu, (x.pixels(), x.channels), form, &x.buf, &y.buf)?;
    b.push(move |rec| pass.encode(rec));
    Ok(y)
}

/// `x += gate · RMSNorm_name(branch)`, gate `tanh(modulation[offset..])` or 1.
fn gated_residual(
    b: &mut Builder<'_, '_>,
    x: &Act,
    branch: Act,
    name: &str,
    eps: f32,
    gate: Option<(&Act, u32)>,
) -> Result<(), Error> {
    let weight = b.vector(&format!("{name}.weight"), x.channels, Some(1.0))?;
    let pass = gated_add(
        b.gpu,
        (x.pixels(), x.channels),
        eps,
        &weight,
        gate.map(|(m, offset)| Slice {
            buffer: &m.buf,
            offset,
        }),
        &branch.buf,
        &x.buf,
    )?;
    b.push(move |rec| pass.encode(rec));
    b.release(branch);
    Ok(())
}

/// Whether a block's normed rows, QKV rows and attention outputs pass between its kernels as
/// f16: on tensor cores, whose products and attention multiply them as f16 anyway. That halves
/// the bytes written and read back, as in the Whisper encoder.
fn half_activations(b: &Builder<'_, '_>, cfg: &ZImageConfig) -> bool {
    b.gpu.caps().cooperative_matrix
        && cfg.dim.is_multiple_of(8)
        && cfg.ffn_hidden().is_multiple_of(8)
}

/// `ZImageTransformerBlock`: modulated (or plain) pre-norm attention and SwiGLU feed-forward,
/// each output RMS-normed and gated into the residual stream.
fn block(
    b: &mut Builder<'_, '_>,
    x: Act,
    name: &str,
    cfg: &ZImageConfig,
    rope: &Arc<StorageBuffer>,
    adaln: Option<&Act>,
) -> Result<Act, Error> {
    let dim = cfg.dim;
    let eps = cfg.norm_eps;
    let modulation = match adaln {
        Some(a) => Some(b.linear(
            a,
            &format!("{name}.adaLN_modulation.0"),
            4 * dim,
            None,
            None,
        )?),
        None => None,
    };
    let at = |offset: u32| modulation.as_ref().map(|m| (m, offset * dim));
    let half = half_activations(b, cfg);

    let n1 = rms_norm(b, &x, &format!("{name}.attention_norm1"), eps, at(0), half)?;
    let a = format!("{name}.attention");
    let qkv = b.linear_halves(
        &n1,
        &[
            &format!("{a}.to_q"),
            &format!("{a}.to_k"),
            &format!("{a}.to_v"),
        ],
        dim,
        Activation::None,
        Halves {
            input: half,
            output: half,
        },
    )?;
    b.release(n1);
    let (heads, head_dim) = (cfg.heads, cfg.head_dim());
    let q_weight = b.vector(&format!("{a}.norm_q.weight"), head_dim, Some(1.0))?;
    let k_weight = b.vector(&format!("{a}.norm_k.weight"), head_dim, Some(1.0))?;
    let tokens = qkv.pixels();
    let pass = head_rope(
        b.gpu,
        (tokens, heads, head_dim),
        1e-5,
        &q_weight,
        &k_weight,
        rope,
        &qkv.buf,
        half,
    )?;
    b.push(move |rec| pass.encode(rec));
    let layout = FullLayout {
        heads,
        kv_heads: heads,
        head_dim,
        keys: tokens,
        q_stride: 3 * dim,
        kv_stride: 3 * dim,
        k_off: dim,
        f16: half,
    };
    let att = b.attention(&qkv, &qkv, layout, false)?;
    b.release(qkv);
    let read_half = Halves {
        input: half,
        output: false,
    };
    let out_name = format!("{a}.to_out.0");
    let o = b.linear_halves(&att, &[&out_name], dim, Activation::None, read_half)?;
    b.release(att);
    gated_residual(b, &x, o, &format!("{name}.attention_norm2"), eps, at(1))?;

    let n2 = rms_norm(b, &x, &format!("{name}.ffn_norm1"), eps, at(2), half)?;
    let ff = format!("{name}.feed_forward");
    let names = [format!("{ff}.w1"), format!("{ff}.w3")];
    let gated = b.swiglu(&n2, [&names[0], &names[1]], cfg.ffn_hidden(), read_half)?;
    b.release(n2);
    let f = b.linear(&gated, &format!("{ff}.w2"), dim, None, None)?;
    b.release(gated);
    gated_residual(b, &x, f, &format!("{name}.ffn_norm2"), eps, at(3))?;
    if let Some(m) = modulation {
        b.release(m);
    }
    Ok(x)
}
