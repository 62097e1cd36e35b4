//! The layers plans are built from: products (linear layers, convolutions, embeddings),
//! normalisations, attention and the small elementwise kernels, each loading its weights
//! through the [`Builder`] and appending its dispatches.

use std::sync::Arc;

use super::graph::{Act, Activation, Builder, ConvInput, Halves};
use crate::Error;
use crate::gpu::StorageBuffer;
use crate::models::weights::Part;
use crate::ops::{
    Conv2dShape, Embed, FullAttention, FullLayout, Gelu, Glu, GluKind, GroupNorm, GroupNormShape,
    MatMul, Matrix, Norm, NormActivation, NormKind, affine, concat, silu, slice_channels,
    softmax_rows, tanh_clamp, transpose,
};

impl Builder<'_, '_> {
    /// A linear layer `name` (`.weight` `[out][in]`, optional `.bias`).
    pub fn linear(
        &mut self,
        x: &Act,
        name: &str,
        out: u32,
        gelu: Option<Gelu>,
        residual: Option<Act>,
    ) -> Result<Act, Error> {
        self.linear_fused(x, &[name], out, gelu, residual)
    }

    /// Linear layers sharing an input fused into one product (their outputs side by side):
    /// attention's q, k and v.
    pub fn linear_fused(
        &mut self,
        x: &Act,
        names: &[&str],
        out_each: u32,
        gelu: Option<Gelu>,
        residual: Option<Act>,
    ) -> Result<Act, Error> {
        let activation = gelu.map_or(Activation::None, Activation::Gelu);
        self.linear_with(x, names, out_each, activation, residual, Halves::default())
    }

    /// Linear layers sharing an input fused into one product, with an activation (a gate in
    /// the epilogue among them) and f16 operands where `halves` says.
    pub fn linear_halves(
        &mut self,
        x: &Act,
        names: &[&str],
        out_each: u32,
        activation: Activation,
        halves: Halves,
    ) -> Result<Act, Error> {
        self.linear_with(x, names, out_each, activation, None, halves)
    }

    /// `silu(x·gateᵀ) · (x·upᵀ)` of the linear layers `gate` and `up`: gated in the product's
    /// epilogue on tensor cores (f16 operands where `halves` says), else by a pass of its own.
    pub fn swiglu(
        &mut self,
        x: &Act,
        [gate, up]: [&str; 2],
        hidden: u32,
        halves: Halves,
    ) -> Result<Act, Error> {
        if MatMul::gates_in_epilogue(self.gpu) {
            return self.linear_halves(x, &[gate, up], hidden, Activation::SwiGlu, halves);
        }
        let gate_up = self.linear_fused(x, &[gate, up], hidden, None, None)?;
        let gated = self.alloc(gate_up.h, gate_up.w, hidden)?;
        let rows = gate_up.pixels();
        let step = self.step(rows);
        let glu = Glu::new(
            self.gpu,
            GluKind::Silu,
            hidden,
            &gate_up.buf,
            &gated.buf,
            &step,
        )?;
        self.push(move |rec| glu.encode(rec, rows));
        self.release(gate_up);
        Ok(gated)
    }

    /// Linear `name` into `2·width` outputs (value, gate) through diffusers' GEGLU: gated in
    /// the product's epilogue on tensor cores, else by a pass of its own.
    pub fn linear_geglu(&mut self, x: &Act, name: &str, width: u32) -> Result<Act, Error> {
        if MatMul::gates_in_epilogue(self.gpu) {
            let halves = Halves::default();
            return self.linear_with(x, &[name], 2 * width, Activation::Geglu, None, halves);
        }
        let gate_up = self.linear(x, name, 2 * width, None, None)?;
        let gated = self.geglu(&gate_up)?;
        self.release(gate_up);
        Ok(gated)
    }

    fn linear_with(
        &mut self,
        x: &Act,
        names: &[&str],
        out_each: u32,
        activation: Activation,
        residual: Option<Act>,
        halves: Halves,
    ) -> Result<Act, Error> {
        let key = names.join("+");
        let weight_names: Vec<String> = names.iter().map(|n| format!("{n}.weight")).collect();
        let cols = x.channels;
        let w = self.matrix(&key, |up| {
            let parts: Vec<Part<'_>> = weight_names
                .iter()
                .map(|n| Part {
                    name: n,
                    rows: out_each,
                    cols,
                })
                .collect();
            up.matrix(&key, &parts, false)
        })?;
        let bias = if names.len() == 1 {
            self.bias(names[0], out_each)?
        } else if names.iter().any(|n| self.has_weight(&format!("{n}.bias"))) {
            let key_bias = format!("{key}.bias");
            match self.weights.vectors.get(&key_bias) {
                Some(v) => Some(v.clone()),
                None => {
                    let bias_names: Vec<String> =
                        names.iter().map(|n| format!("{n}.bias")).collect();
                    let parts: Vec<(Option<&str>, u32)> = bias_names
                        .iter()
                        .map(|n| (self.up.has(n).then_some(n.as_str()), out_each))
                        .collect();
                    let v = Arc::new(self.up.vector_with_zeros(&key_bias, &parts)?);
                    self.weights.bytes += v.size;
                    self.weights.vectors.insert(key_bias, v.clone());
                    Some(v)
                }
            }
        } else {
            None
        };
        self.product_with(x, w, bias, activation, residual, None, (x.h, x.w), halves)
    }

    /// A 2-D convolution `name` (`.weight` `[out][in][k][k]`, `.bias`) over a channel-last
    /// image, optionally reading the input upsampled 2× (nearest) first.
    #[allow(clippy::too_many_arguments)]
    pub fn conv(
        &mut self,
        x: &Act,
        name: &str,
        out: u32,
        k: u32,
        stride: u32,
        pad: u32,
        upsample: bool,
        residual: Option<Act>,
    ) -> Result<Act, Error> {
        let bias = self.bias(name, out)?;
        self.conv_with_bias(
            x,
            name,
            out,
            (k, stride, pad),
            upsample,
            bias,
            residual,
            Activation::None,
        )
    }

    /// As [`Builder::conv`] with `bias` in place of the layer's own.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_with_bias(
        &mut self,
        x: &Act,
        name: &str,
        out: u32,
        (k, stride, pad): (u32, u32, u32),
        upsample: bool,
        bias: Option<Arc<StorageBuffer>>,
        residual: Option<Act>,
        activation: Activation,
    ) -> Result<Act, Error> {
        let weight = format!("{name}.weight");
        let cin = x.channels;
        if k == 1 && stride == 1 && pad == 0 && !upsample {
            let w = self.matrix(&weight, |up| {
                up.reshaped_matrix(
                    &weight,
                    &weight,
                    &[out as usize, cin as usize, 1, 1],
                    out,
                    cin,
                )
            })?;
            return self.product(x, w, bias, activation, residual, None, (x.h, x.w));
        }
        let shape = Conv2dShape::new(x.h, x.w, cin, k, stride, pad, upsample);
        let w = self.matrix(&weight, |up| up.conv_matrix(&weight, &weight, out, cin, k))?;
        let out_hw = (shape.out_h(), shape.out_w);
        self.product(x, w, bias, activation, residual, Some(shape), out_hw)
    }

    /// GroupNorm `norm` with SiLU, then the 3×3 convolution `name` (stride 1, padding 1) with
    /// `bias`: where the convolution can apply the norm as it loads its input
    /// ([`MatMul::folds_input_norm`]), the norm only computes each channel's affine map and no
    /// normalised copy of `x` is written; elsewhere a GroupNorm pass, then the convolution.
    #[allow(clippy::too_many_arguments)]
    pub fn normed_conv(
        &mut self,
        x: &Act,
        norm: &str,
        (groups, eps): (u32, f32),
        name: &str,
        out: u32,
        bias: Option<Arc<StorageBuffer>>,
        residual: Option<Act>,
    ) -> Result<Act, Error> {
        let cin = x.channels;
        if !MatMul::folds_input_norm(self.gpu, cin) {
            let h = self.group_norm(x, norm, groups, eps, NormActivation::Silu)?;
            let three = (3, 1, 1);
            let y = self.conv_with_bias(
                &h,
                name,
                out,
                three,
                false,
                bias,
                residual,
                Activation::None,
            )?;
            self.release(h);
            return Ok(y);
        }
        let gamma = self.vector(&format!("{norm}.weight"), cin, Some(1.0))?;
        let beta = self.vector(&format!("{norm}.bias"), cin, None)?;
        // Each channel's scale, then each channel's shift.
        let folded = self.alloc(1, 2, cin)?;
        let shape = GroupNormShape {
            pixels: x.pixels(),
            channels: cin,
            groups,
            eps,
            activation: NormActivation::Silu,
        };
        let fold = GroupNorm::folded(self.gpu, shape, &gamma, &beta, &x.buf, &folded.buf)?;
        self.push(move |rec| fold.encode(rec));
        let weight = format!("{name}.weight");
        let w = self.matrix(&weight, |up| up.conv_matrix(&weight, &weight, out, cin, 3))?;
        let shape = Conv2dShape::new(x.h, x.w, cin, 3, 1, 1, false);
        let conv = ConvInput {
            shape,
            norm: Some(folded.buf.clone()),
        };
        let out_hw = (shape.out_h(), shape.out_w);
        let halves = Halves::default();
        let y = self.product_with(
            x,
            w,
            bias,
            Activation::None,
            residual,
            Some(conv),
            out_hw,
            halves,
        )?;
        self.release(folded);
        Ok(y)
    }

    /// diffusers' VAE-encoder downsampler: pad right and bottom by one, then a stride-2
    /// 3×3 convolution (the kernel reads zeros past the edge).
    pub fn conv_down_asymmetric(&mut self, x: &Act, name: &str, out: u32) -> Result<Act, Error> {
        let weight = format!("{name}.weight");
        let cin = x.channels;
        let bias = self.bias(name, out)?;
        let mut shape = Conv2dShape::new(x.h, x.w, cin, 3, 2, 0, false);
        shape.out_w = x.w.div_ceil(2);
        let w = self.matrix(&weight, |up| up.conv_matrix(&weight, &weight, out, cin, 3))?;
        self.product(
            x,
            w,
            bias,
            Activation::None,
            None,
            Some(shape),
            (x.h.div_ceil(2), shape.out_w),
        )
    }

    /// Token embeddings of `ids` (`tokens` u32 ids) plus learned positions.
    pub fn embed(
        &mut self,
        ids: &Arc<StorageBuffer>,
        tokens: u32,
        (table, vocab): (&str, u32),
        positions: &str,
        dim: u32,
    ) -> Result<Act, Error> {
        let key = table.to_owned();
        let table = self.matrix(&key, |up| {
            up.dense_matrix(
                &key,
                &[Part {
                    name: &key,
                    rows: vocab,
                    cols: dim,
                }],
                false,
            )
        })?;
        let positions = self.table(positions, tokens, dim)?;
        let seen = self
            .gpu
            .storage("seen tokens", u64::from(vocab.div_ceil(32)) * 4)?;
        let y = self.alloc(1, tokens, dim)?;
        let step = self.step(tokens);
        let embed = Embed::new(
            self.gpu,
            &table,
            Some(&positions),
            ids,
            &seen,
            &y.buf,
            &step,
            1.0,
        )?;
        self.push(move |rec| embed.encode(rec, tokens));
        Ok(y)
    }

    /// GroupNorm `name` (`.weight`, `.bias`), then `activation`.
    pub fn group_norm(
        &mut self,
        x: &Act,
        name: &str,
        groups: u32,
        eps: f32,
        activation: NormActivation,
    ) -> Result<Act, Error> {
        let gamma = self.vector(&format!("{name}.weight"), x.channels, Some(1.0))?;
        let beta = self.vector(&format!("{name}.bias"), x.channels, None)?;
        let y = self.alloc(x.h, x.w, x.channels)?;
        let shape = GroupNormShape {
            pixels: x.pixels(),
            channels: x.channels,
            groups,
            eps,
            activation,
        };
        let norm = GroupNorm::new(self.gpu, shape, &gamma, &beta, &x.buf, &y.buf)?;
        self.push(move |rec| norm.encode(rec));
        Ok(y)
    }

    /// LayerNorm `name` over each row.
    pub fn layer_norm(&mut self, x: &Act, name: &str, eps: f32) -> Result<Act, Error> {
        let gamma = self.vector(&format!("{name}.weight"), x.channels, Some(1.0))?;
        let beta = self.vector(&format!("{name}.bias"), x.channels, None)?;
        let y = self.alloc(x.h, x.w, x.channels)?;
        let rows = x.pixels();
        let step = self.step(rows);
        let norm = Norm::new(
            self.gpu,
            NormKind::Layer,
            x.channels,
            eps,
            &gamma,
            Some(&beta),
            &x.buf,
            &y.buf,
            &step,
        )?;
        self.push(move |rec| norm.encode(rec, rows));
        Ok(y)
    }

    /// Multi-head attention of `q`'s rows over `kv`'s (see [`FullLayout`]); the output has
    /// `heads·head_dim` channels per query.
    pub fn attention(
        &mut self,
        q: &Act,
        kv: &Act,
        layout: FullLayout,
        causal: bool,
    ) -> Result<Act, Error> {
        let queries = q.pixels();
        let out = self.alloc(q.h, q.w, layout.heads * layout.head_dim)?;
        let step = self.step(queries);
        let attn =
            FullAttention::with_mask(self.gpu, layout, &q.buf, &kv.buf, &out.buf, &step, causal)?;
        self.push(move |rec| attn.encode(rec, queries));
        Ok(out)
    }

    /// Single-head attention too wide for the fused kernel (the VAE's, 512 channels):
    /// scores as a product, row softmax, then the product with the transposed values.
    pub fn wide_attention(&mut self, q: &Act, k: &Act, v: &Act) -> Result<Act, Error> {
        let (n, c) = (q.pixels(), q.channels);
        if !c.is_multiple_of(crate::ops::ROW_ALIGN as u32) {
            return Err(Error::Invalid(format!(
                "attention over {c} channels: a multiple of {} is needed",
                crate::ops::ROW_ALIGN
            )));
        }
        let keys = as_matrix(k, n, c);
        let scores = self.product(
            q,
            Arc::new(keys),
            None,
            Activation::None,
            None,
            None,
            (q.h, q.w),
        )?;
        let softmax = softmax_rows(self.gpu, n, n, 1.0 / (c as f32).sqrt(), &scores.buf)?;
        self.push(move |rec| softmax.encode(rec));
        let stride = Matrix::padded_cols(n);
        let vt = self.alloc(1, c, stride)?;
        let t = transpose(self.gpu, n, c, stride, &v.buf, &vt.buf)?;
        self.push(move |rec| t.encode(rec));
        let values = as_matrix(&vt, c, n);
        let out = self.product(
            &scores,
            Arc::new(values),
            None,
            Activation::None,
            None,
            None,
            (q.h, q.w),
        )?;
        self.release(scores);
        self.release(vt);
        Ok(out)
    }

    /// `gate_up` `[rows][2·width]` → `[rows][width]` through GEGLU.
    fn geglu(&mut self, gate_up: &Act) -> Result<Act, Error> {
        let width = gate_up.channels / 2;
        let y = self.alloc(gate_up.h, gate_up.w, width)?;
        let rows = gate_up.pixels();
        let step = self.step(rows);
        let glu = Glu::new(
            self.gpu,
            GluKind::GeluErf,
            width,
            &gate_up.buf,
            &y.buf,
            &step,
        )?;
        self.push(move |rec| glu.encode(rec, rows));
        Ok(y)
    }

    pub fn silu(&mut self, x: &Act) -> Result<Act, Error> {
        let y = self.alloc(x.h, x.w, x.channels)?;
        let pass = silu(self.gpu, x.values(), &x.buf, &y.buf)?;
        self.push(move |rec| pass.encode(rec));
        Ok(y)
    }

    /// Channels of `a` then `b`, per pixel.
    pub fn concat(&mut self, a: &Act, b: &Act) -> Result<Act, Error> {
        let y = self.alloc(a.h, a.w, a.channels + b.channels)?;
        let pass = concat(
            self.gpu,
            a.pixels(),
            (&a.buf, a.channels),
            (&b.buf, b.channels),
            &y.buf,
        )?;
        self.push(move |rec| pass.encode(rec));
        Ok(y)
    }

    /// `x·scale + offset`.
    pub fn affine(&mut self, x: &Act, scale: f32, offset: f32) -> Result<Act, Error> {
        let y = self.alloc(x.h, x.w, x.channels)?;
        let pass = affine(self.gpu, x.values(), scale, offset, &x.buf, &y.buf)?;
        self.push(move |rec| pass.encode(rec));
        Ok(y)
    }

    /// `tanh(x / scale) · scale`.
    pub fn tanh_clamp(&mut self, x: &Act, scale: f32) -> Result<Act, Error> {
        let y = self.alloc(x.h, x.w, x.channels)?;
        let pass = tanh_clamp(self.gpu, x.values(), scale, &x.buf, &y.buf)?;
        self.push(move |rec| pass.encode(rec));
        Ok(y)
    }

    /// Channels `offset..offset + channels` of `x`.
    pub fn slice_channels(&mut self, x: &Act, offset: u32, channels: u32) -> Result<Act, Error> {
        let y = self.alloc(x.h, x.w, channels)?;
        let pass = slice_channels(
            self.gpu,
            x.pixels(),
            (offset, channels),
            x.channels,
            &x.buf,
            &y.buf,
        )?;
        self.push(move |rec| pass.encode(rec));
        Ok(y)
    }

    /// A copy of `x` (a residual to accumulate into).
    pub fn copy(&mut self, x: &Act) -> Result<Act, Error> {
        let y = self.alloc(x.h, x.w, x.channels)?;
        let (src, dst) = (x.buf.clone(), y.buf.clone());
        let bytes = u64::from(x.values()) * 4;
        self.push(move |rec| rec.copy(&src.buffer, 0, &dst.buffer, 0, bytes));
        Ok(y)
    }
}

/// An f32 activation `[rows][cols]` seen as a weight matrix (its rows already a whole number
/// of vec4 words).
fn as_matrix(x: &Act, rows: u32, cols: u32) -> Matrix {
    Matrix {
        buffer: StorageBuffer {
            buffer: x.buf.buffer.clone(),
            size: x.buf.size,
        },
        rows,
        cols,
        dtype: crate::ops::WeightDType::F32,
        quant: None,
    }
}
