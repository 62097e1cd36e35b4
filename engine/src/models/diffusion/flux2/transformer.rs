//! diffusers' `Flux2Transformer2DModel` as a plan for one latent size: the caption and the
//! packed latent tokens (with a reference image's after them, when one is given) through the
//! double-stream blocks, each stream with its own weights but one attention over both, then
//! the single-stream blocks over the joined sequence, and the image tokens out as a velocity.

use std::sync::Arc;

use super::config::Flux2Config;
use crate::Error;
use crate::gpu::StorageBuffer;
use crate::models::diffusion::graph::{Act, Activation, Builder, Halves, Plan};
use crate::models::diffusion::rope_table::rope_table;
use crate::ops::{
    FullLayout, RowNorm, RowNormForm, Slice, head_rope, join_half_rows, mod_norm, scaled_add,
};

/// The t coordinate of the first reference image's tokens (`_prepare_image_ids`' `scale`).
pub const REFERENCE_T: u32 = 10;

/// What a plan reads each call and where its output lands.
pub struct Flux2Io {
    /// `[tokens][in_channels]`: the packed latent, then the reference image's tokens if any.
    pub latent: Arc<StorageBuffer>,
    /// `[time_channels]`: the sinusoidal embedding of the timestep.
    pub time_proj: Arc<StorageBuffer>,
    /// `[caption_rows][joint_attention_dim]`: the stacked text-encoder states.
    pub caption: Arc<StorageBuffer>,
    pub caption_rows: u32,
    /// `[h·w][in_channels]`: the velocity for the latent's tokens.
    pub out: Arc<StorageBuffer>,
}

/// The token grid: the latent's `h`×`w` packed tokens, and whether a reference image of the
/// same grid follows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub h: u32,
    pub w: u32,
    pub reference: bool,
}

impl Grid {
    pub fn latent_tokens(&self) -> u32 {
        self.h * self.w
    }

    pub fn image_tokens(&self) -> u32 {
        self.latent_tokens() * if self.reference { 2 } else { 1 }
    }

    /// (t, h, w, l) of every image token: the latent's at t = 0, the reference's at t = 10.
    pub fn image_ids(&self) -> Vec<[u32; 4]> {
        let times: &[u32] = if self.reference {
            &[0, REFERENCE_T]
        } else {
            &[0]
        };
        times
            .iter()
            .flat_map(|&t| (0..self.h).flat_map(move |y| (0..self.w).map(move |x| [t, y, x, 0])))
            .collect()
    }
}

/// (0, 0, 0, l) for caption token l.
pub fn caption_ids(rows: u32) -> Vec<[u32; 4]> {
    (0..rows).map(|l| [0, 0, 0, l]).collect()
}

pub struct Flux2Plan {
    pub plan: Plan,
    pub activation_bytes: u64,
}

/// The timestep's modulation vectors, each computed once per call.
struct Modulations {
    temb: Act,
    image: Act,
    text: Act,
    single: Act,
}

/// Records the transformer for `grid`.
pub fn build_transformer(
    mut b: Builder<'_, '_>,
    cfg: &Flux2Config,
    io: &Flux2Io,
    grid: Grid,
) -> Result<Flux2Plan, Error> {
    if grid.h == 0 || grid.w == 0 || io.caption_rows == 0 {
        return Err(Error::Invalid(format!(
            "a {}×{} token grid with {} caption rows: neither may be empty",
            grid.w, grid.h, io.caption_rows
        )));
    }
    let dim = cfg.dim();
    let mods = modulations(&mut b, cfg, io)?;
    let image_rope = upload_table(&b, cfg, &grid.image_ids())?;
    let caption_rope = upload_table(&b, cfg, &caption_ids(io.caption_rows))?;
    let mut joint_ids = caption_ids(io.caption_rows);
    joint_ids.extend(grid.image_ids());
    let joint_rope = upload_table(&b, cfg, &joint_ids)?;

    let (img, cap) = (grid.image_tokens(), io.caption_rows);
    let latent = Builder::external(&io.latent, 1, img, cfg.in_channels);
    let mut x = b.linear(&latent, "x_embedder", dim, None, None)?;
    let caption = Builder::external(&io.caption, 1, cap, cfg.joint_attention_dim);
    let mut c = b.linear(&caption, "context_embedder", dim, None, None)?;
    let ropes = StreamRopes {
        image: &image_rope,
        caption: &caption_rope,
    };
    for i in 0..cfg.double_layers {
        (x, c) = double_block(
            &mut b,
            (x, c),
            &format!("transformer_blocks.{i}"),
            cfg,
            &mods,
            &ropes,
        )?;
    }
    let mut h = b.alloc(1, cap + img, dim)?;
    copy_rows(&mut b, &c, 0, cap, &h, 0, 4 * dim);
    copy_rows(&mut b, &x, 0, img, &h, cap, 4 * dim);
    b.release(x);
    b.release(c);
    for i in 0..cfg.single_layers {
        h = single_block(
            &mut b,
            h,
            &format!("single_transformer_blocks.{i}"),
            cfg,
            &mods,
            &joint_rope,
        )?;
    }

    // The latent's tokens (not the caption's or the reference's) through the output norm.
    let tokens = grid.latent_tokens();
    let image = b.alloc(1, tokens, dim)?;
    copy_rows(&mut b, &h, cap, tokens, &image, 0, 4 * dim);
    b.release(h);
    let temb_silu = b.silu(&mods.temb)?;
    // AdaLayerNormContinuous: scale first, then shift.
    let halves = ["norm_out.linear.scale", "norm_out.linear.shift"];
    let out_mod = b.linear_fused(&temb_silu, &halves, dim, None, None)?;
    b.release(temb_silu);
    let normed = modulated_norm(&mut b, &image, cfg.eps, &out_mod, (0, dim), false)?;
    b.release(image);
    b.release(out_mod);
    let out = b.linear(&normed, "proj_out", cfg.out_channels, None, None)?;
    b.release(normed);
    let (src, dst) = (out.buf.clone(), io.out.clone());
    let bytes = u64::from(tokens) * u64::from(cfg.out_channels) * 4;
    b.push(move |rec| rec.copy(&src.buffer, 0, &dst.buffer, 0, bytes));
    b.release(out);
    for m in [mods.temb, mods.image, mods.text, mods.single] {
        b.release(m);
    }
    let (plan, activation_bytes) = b.finish();
    Ok(Flux2Plan {
        plan,
        activation_bytes,
    })
}

/// The timestep embedding and the shared modulations of the double-stream image and text
/// sub-blocks and of the single-stream blocks (`Flux2Modulation`: a product of silu(temb)).
fn modulations(
    b: &mut Builder<'_, '_>,
    cfg: &Flux2Config,
    io: &Flux2Io,
) -> Result<Modulations, Error> {
    let dim = cfg.dim();
    let time = Builder::external(&io.time_proj, 1, 1, cfg.time_channels);
    let embedder = "time_guidance_embed.timestep_embedder";
    let t1 = b.linear(&time, &format!("{embedder}.linear_1"), dim, None, None)?;
    let t1s = b.silu(&t1)?;
    b.release(t1);
    let temb = b.linear(&t1s, &format!("{embedder}.linear_2"), dim, None, None)?;
    b.release(t1s);
    let temb_silu = b.silu(&temb)?;
    let image = b.linear(
        &temb_silu,
        "double_stream_modulation_img.linear",
        6 * dim,
        None,
        None,
    )?;
    let text = b.linear(
        &temb_silu,
        "double_stream_modulation_txt.linear",
        6 * dim,
        None,
        None,
    )?;
    let single = b.linear(
        &temb_silu,
        "single_stream_modulation.linear",
        3 * dim,
        None,
        None,
    )?;
    b.release(temb_silu);
    Ok(Modulations {
        temb,
        image,
        text,
        single,
    })
}

fn upload_table(
    b: &Builder<'_, '_>,
    cfg: &Flux2Config,
    ids: &[[u32; 4]],
) -> Result<Arc<StorageBuffer>, Error> {
    let table = rope_table(ids, &cfg.axes_dims, cfg.rope_theta, false);
    Ok(Arc::new(b.gpu.storage_from("rope table", &table)?))
}

/// Copies `rows` rows of `row_bytes` from `src` (from row `from`) to `dst` (from row `to`).
fn copy_rows(
    b: &mut Builder<'_, '_>,
    src: &Act,
    from: u32,
    rows: u32,
    dst: &Act,
    to: u32,
    row_bytes: u32,
) {
    let (s, d) = (src.buf.clone(), dst.buf.clone());
    let rb = u64::from(row_bytes);
    b.push(move |rec| {
        rec.copy(
            &s.buffer,
            u64::from(from) * rb,
            &d.buffer,
            u64::from(to) * rb,
            u64::from(rows) * rb,
        );
    });
}

/// `LayerNorm(x) · (1 + m[scale..]) + m[shift..]` without affine terms; with `half`, written as
/// f16 pairs for a product that reads them so.
fn modulated_norm(
    b: &mut Builder<'_, '_>,
    x: &Act,
    eps: f32,
    m: &Act,
    (scale, shift): (u32, u32),
    half: bool,
) -> Result<Act, Error> {
    let y = b.alloc(x.h, x.w, x.channels)?;
    let form = RowNormForm {
        norm: RowNorm::PlainLayer,
        eps,
        weight: None,
        scale: Some(Slice {
            buffer: &m.buf,
            offset: scale,
        }),
        shift: Some(shift),
        half_out: half,
    };
    let pass = mod_norm(b.gpu, (x.pixels(), x.channels), form, &x.buf, &y.buf)?;
    b.push(move |rec| pass.encode(rec));
    Ok(y)
}

/// `x += m[offset..] · branch`, consuming the branch.
fn gated_add(
    b: &mut Builder<'_, '_>,
    x: &Act,
    branch: Act,
    m: &Act,
    offset: u32,
) -> Result<(), Error> {
    let gate = Slice {
        buffer: &m.buf,
        offset,
    };
    let pass = scaled_add(b.gpu, (x.pixels(), x.channels), gate, &branch.buf, &x.buf)?;
    b.push(move |rec| pass.encode(rec));
    b.release(branch);
    Ok(())
}

/// Whether normed rows, QKV rows and attention outputs pass between kernels as f16: on tensor
/// cores, whose products and attention multiply them as f16 anyway.
fn half_activations(b: &Builder<'_, '_>, cfg: &Flux2Config) -> bool {
    b.gpu.caps().cooperative_matrix
        && cfg.dim().is_multiple_of(8)
        && cfg.mlp_hidden().is_multiple_of(8)
}

/// Bytes of a row of `channels` values, f16 or f32.
fn row_bytes(channels: u32, half: bool) -> u32 {
    channels * if half { 2 } else { 4 }
}

/// Query, key and value rows of `x` through `names`, then each head's RMSNorm (`norm_q`,
/// `norm_k` under `attn`) and RoPE from `rope`.
fn qkv_rope(
    b: &mut Builder<'_, '_>,
    x: &Act,
    names: [&str; 3],
    (norm_q, norm_k): (&str, &str),
    cfg: &Flux2Config,
    rope: &Arc<StorageBuffer>,
    half: bool,
) -> Result<Act, Error> {
    let dim = cfg.dim();
    let halves = Halves {
        input: half,
        output: half,
    };
    let qkv = b.linear_halves(x, &names, dim, Activation::None, halves)?;
    let q_weight = b.vector(&format!("{norm_q}.weight"), cfg.head_dim, Some(1.0))?;
    let k_weight = b.vector(&format!("{norm_k}.weight"), cfg.head_dim, Some(1.0))?;
    let shape = (qkv.pixels(), cfg.heads, cfg.head_dim);
    let pass = head_rope(
        b.gpu, shape, cfg.eps, &q_weight, &k_weight, rope, &qkv.buf, half,
    )?;
    b.push(move |rec| pass.encode(rec));
    Ok(qkv)
}

/// Self-attention over fused QKV rows (heads of `head_dim`, no mask).
fn attend(b: &mut Builder<'_, '_>, qkv: &Act, cfg: &Flux2Config, half: bool) -> Result<Act, Error> {
    let dim = cfg.dim();
    let layout = FullLayout {
        heads: cfg.heads,
        kv_heads: cfg.heads,
        head_dim: cfg.head_dim,
        keys: qkv.pixels(),
        q_stride: 3 * dim,
        kv_stride: 3 * dim,
        k_off: dim,
        f16: half,
    };
    b.attention(qkv, qkv, layout, false)
}

/// The images' and the caption's rope tables, for the double-stream blocks.
struct StreamRopes<'a> {
    image: &'a Arc<StorageBuffer>,
    caption: &'a Arc<StorageBuffer>,
}

/// `Flux2TransformerBlock`: each stream normed and modulated by its own vectors, projected by
/// its own weights, attended over jointly (caption first), then its own feed-forward.
fn double_block(
    b: &mut Builder<'_, '_>,
    (x, c): (Act, Act),
    name: &str,
    cfg: &Flux2Config,
    mods: &Modulations,
    ropes: &StreamRopes<'_>,
) -> Result<(Act, Act), Error> {
    let dim = cfg.dim();
    let half = half_activations(b, cfg);
    let a = format!("{name}.attn");
    // Chunks of each modulation: shift, scale, gate of the attention, then of the MLP.
    let nx = modulated_norm(b, &x, cfg.eps, &mods.image, (dim, 0), half)?;
    let q = |w: &str| format!("{a}.{w}");
    let qkv_x = qkv_rope(
        b,
        &nx,
        [&q("to_q"), &q("to_k"), &q("to_v")],
        (&q("norm_q"), &q("norm_k")),
        cfg,
        ropes.image,
        half,
    )?;
    b.release(nx);
    let nc = modulated_norm(b, &c, cfg.eps, &mods.text, (dim, 0), half)?;
    let qkv_c = qkv_rope(
        b,
        &nc,
        [&q("add_q_proj"), &q("add_k_proj"), &q("add_v_proj")],
        (&q("norm_added_q"), &q("norm_added_k")),
        cfg,
        ropes.caption,
        half,
    )?;
    b.release(nc);
    let (img, cap) = (x.pixels(), c.pixels());
    let joint = b.alloc(1, cap + img, 3 * dim)?;
    let qkv_row = row_bytes(3 * dim, half);
    copy_rows(b, &qkv_c, 0, cap, &joint, 0, qkv_row);
    copy_rows(b, &qkv_x, 0, img, &joint, cap, qkv_row);
    b.release(qkv_x);
    b.release(qkv_c);
    let att = attend(b, &joint, cfg, half)?;
    b.release(joint);
    let att_row = row_bytes(dim, half);
    let att_c = b.alloc(1, cap, dim)?;
    copy_rows(b, &att, 0, cap, &att_c, 0, att_row);
    let att_x = b.alloc(1, img, dim)?;
    copy_rows(b, &att, cap, img, &att_x, 0, att_row);
    b.release(att);
    let read_half = Halves {
        input: half,
        output: false,
    };
    let ox = b.linear_halves(&att_x, &[&q("to_out.0")], dim, Activation::None, read_half)?;
    b.release(att_x);
    gated_add(b, &x, ox, &mods.image, 2 * dim)?;
    let oc = b.linear_halves(
        &att_c,
        &[&q("to_add_out")],
        dim,
        Activation::None,
        read_half,
    )?;
    b.release(att_c);
    gated_add(b, &c, oc, &mods.text, 2 * dim)?;

    for (stream, m, ff) in [(&x, &mods.image, "ff"), (&c, &mods.text, "ff_context")] {
        let n = modulated_norm(b, stream, cfg.eps, m, (4 * dim, 3 * dim), half)?;
        let ff = format!("{name}.{ff}");
        let gated = b.swiglu(
            &n,
            [
                &format!("{ff}.linear_in.gate"),
                &format!("{ff}.linear_in.up"),
            ],
            cfg.mlp_hidden(),
            read_half,
        )?;
        b.release(n);
        let f = b.linear(&gated, &format!("{ff}.linear_out"), dim, None, None)?;
        b.release(gated);
        gated_add(b, stream, f, m, 5 * dim)?;
    }
    Ok((x, c))
}

/// `Flux2SingleTransformerBlock`: one norm, then attention and the feed-forward side by side
/// from one input projection, their outputs joined through one output projection.
fn single_block(
    b: &mut Builder<'_, '_>,
    h: Act,
    name: &str,
    cfg: &Flux2Config,
    mods: &Modulations,
    rope: &Arc<StorageBuffer>,
) -> Result<Act, Error> {
    let dim = cfg.dim();
    let half = half_activations(b, cfg);
    let a = format!("{name}.attn");
    let n = modulated_norm(b, &h, cfg.eps, &mods.single, (dim, 0), half)?;
    let qkv = qkv_rope(
        b,
        &n,
        [
            &format!("{a}.to_q"),
            &format!("{a}.to_k"),
            &format!("{a}.to_v"),
        ],
        (&format!("{a}.norm_q"), &format!("{a}.norm_k")),
        cfg,
        rope,
        half,
    )?;
    let att = attend(b, &qkv, cfg, half)?;
    b.release(qkv);
    let read_half = Halves {
        input: half,
        output: false,
    };
    let mlp = cfg.mlp_hidden();
    let gated = b.swiglu(
        &n,
        [&format!("{a}.mlp_in.gate"), &format!("{a}.mlp_in.up")],
        mlp,
        read_half,
    )?;
    b.release(n);
    // Attention and feed-forward side by side for the one output projection: as f16 pairs on
    // tensor cores (the attention wrote f16), else as f32.
    let joined = if half {
        let j = b.alloc(h.h, h.w, dim + mlp)?;
        let pass = join_half_rows(b.gpu, h.pixels(), (dim, mlp), &att.buf, &gated.buf, &j.buf)?;
        b.push(move |rec| pass.encode(rec));
        j
    } else {
        b.concat(&att, &gated)?
    };
    b.release(att);
    b.release(gated);
    let o = b.linear_halves(
        &joined,
        &[&format!("{a}.to_out")],
        dim,
        Activation::None,
        read_half,
    )?;
    b.release(joined);
    gated_add(b, &h, o, &mods.single, 2 * dim)?;
    Ok(h)
}
