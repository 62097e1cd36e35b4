//! Qwen3.5: Qwen3's attention layout (q/k head norms; the query product carrying a gate head
//! after each query head) on the full-attention layers, Gated DeltaNet layers between them,
//! (1 + w) RMSNorms. Published checkpoints keep the text model under
//! `model.language_model.`; the vision tower and the multi-token-prediction head are never read.

use std::ops::Range;

use super::super::weights::{Part, Uploader};
use super::family::{
    Family, LayerNames, LayerWeights, LinearInputs, LinearNames, Name, Projection,
    SharedExpertNames, norm_pair,
};
use super::qwen3;
use crate::Error;
use crate::load::{DecoderSpec, GgmlType, LinearLayers};
use crate::ops::{DeltaNetWeights, Matrix};

pub(super) const FAMILY: Family = Family {
    prefixes: &["model.language_model.", "model."],
    layer: LayerNames {
        linear: Some(LinearNames {
            in_proj: Projection::Separate(&[
                "{P}layers.{L}.linear_attn.in_proj_qkv.weight",
                "{P}layers.{L}.linear_attn.in_proj_z.weight",
                "{P}layers.{L}.linear_attn.in_proj_b.weight",
                "{P}layers.{L}.linear_attn.in_proj_a.weight",
            ]),
            conv: "{P}layers.{L}.linear_attn.conv1d.weight",
            a_log: "{P}layers.{L}.linear_attn.A_log",
            dt_bias: "{P}layers.{L}.linear_attn.dt_bias",
            norm: "{P}layers.{L}.linear_attn.norm.weight",
            out: "{P}layers.{L}.linear_attn.out_proj.weight",
        }),
        shared_expert: Some(SharedExpertNames {
            up: Projection::Separate(&[
                "{P}layers.{L}.mlp.shared_expert.gate_proj.weight",
                "{P}layers.{L}.mlp.shared_expert.up_proj.weight",
            ]),
            down: "{P}layers.{L}.mlp.shared_expert.down_proj.weight",
            gate: "{P}layers.{L}.mlp.shared_expert_gate.weight",
        }),
        ..qwen3::FAMILY.layer
    },
    norm_plus_one: true,
    ..qwen3::FAMILY
};

impl Family {
    /// Uploads Gated DeltaNet layer `i`: its input projections (rows q/k/v, z, b, a) stacked
    /// into as few products as their formats allow, the output projection, and the small
    /// weights.
    pub(super) fn load_linear_layer(
        &self,
        up: &mut Uploader<'_>,
        spec: &DecoderSpec,
        linear: &LinearLayers,
        prefix: &str,
        i: u32,
    ) -> Result<LayerWeights, Error> {
        let Some(names) = &self.layer.linear else {
            return Err(Error::Invalid(format!(
                "{:?} checkpoints have no linear-attention layers, but the config asks for them",
                spec.arch
            )));
        };
        let n = |name: Name| self.name(prefix, name, i);
        let (s, d) = (&linear.shape, spec.hidden);
        let label = format!("layer {i}");
        let offset = self.norm_offset(up);
        let values = s.value_heads * s.value_dim;
        let rows = [s.channels(), values, s.value_heads, s.value_heads];
        let (qkv, linear_in) = match &names.in_proj {
            Projection::Separate(parts) => {
                let names: Vec<String> = parts.iter().map(|p| n(p)).collect();
                let parts: Vec<Part<'_>> = names
                    .iter()
                    .zip(rows)
                    .map(|(name, rows)| Part {
                        name,
                        rows,
                        cols: d,
                    })
                    .collect();
                self.input_products(up, &label, &parts)?
            }
            fused => {
                let qkv = self.stacked(up, &format!("{label} in"), fused, &rows, d, &n)?;
                (qkv, LinearInputs::stacked(s.channels(), values))
            }
        };
        let o = self.single(up, &format!("{label} out"), &n(names.out), d, values)?;
        let delta = DeltaNetWeights {
            conv: up.vector(
                &label,
                &[(&n(names.conv), s.channels() * s.conv_kernel)],
                None,
            )?,
            decay_a: up.decay_vector(&label, &n(names.a_log), s.value_heads)?,
            dt_bias: up.vector(&label, &[(&n(names.dt_bias), s.value_heads)], None)?,
            norm: up.vector(&label, &[(&n(names.norm), s.value_dim)], Some(1.0))?,
        };
        let layer = &self.layer;
        let attn_norm = norm_pair(up, &label, &n(layer.attn_norm), None, d, offset)?;
        let mlp_norm = norm_pair(up, &label, &n(layer.mlp_norm), None, d, offset)?;
        let (mlp, shared_expert) = self.mlp(up, spec, prefix, i, &label, &n)?;
        Ok(LayerWeights {
            attn_norm,
            qkv,
            qkv_bias: None,
            qk_norm: None,
            o,
            o_bias: None,
            mlp_norm,
            post_norms: None,
            sinks: None,
            mlp,
            delta: Some(delta),
            linear_in: Some(linear_in),
            shared_expert,
        })
    }

    /// The input projections `parts` (q/k/v, z, b, a) as products: one where they keep one
    /// format on the GPU, else one per run of equal formats. Published GGUFs store b and a in
    /// F32 and q/k/v often in a wider block format than z; stacking them regardless would
    /// upload all of it dense.
    fn input_products(
        &self,
        up: &mut Uploader<'_>,
        label: &str,
        parts: &[Part<'_>],
    ) -> Result<(Matrix, LinearInputs), Error> {
        let mut formats = Vec::with_capacity(parts.len());
        for part in parts {
            formats.push(up.kept_format(part)?);
        }
        let runs = input_runs(&formats);
        let mut products = Vec::with_capacity(runs.len());
        for (k, run) in runs.iter().enumerate() {
            let what = match k {
                0 => format!("{label} in"),
                k => format!("{label} in {k}"),
            };
            products.push(up.matrix(&what, &parts[run.clone()], self.transposed(up))?);
        }
        // Where part `p` (1: z, 2: the gates) lands: its run and the rows before it there.
        let place = |p: usize| {
            let k = runs.iter().position(|r| r.contains(&p)).unwrap_or(0);
            let before: u32 = parts[runs[k].start..p].iter().map(|q| q.rows).sum();
            (k, before)
        };
        let (z, gates) = (place(1), place(2));
        let mut products = products.into_iter();
        let first = products
            .next()
            .ok_or_else(|| Error::Invalid(format!("{label}: no input projections")))?;
        Ok((
            first,
            LinearInputs {
                extra: products.collect(),
                z,
                gates,
            },
        ))
    }
}

/// Runs of the input projections q/k/v, z and [b, a] (parts 0, 1 and 2–3) that stack into one
/// product each: equal kept formats, b and a counted as one (their own format where they
/// share one, else dense).
fn input_runs(formats: &[Option<GgmlType>]) -> Vec<Range<usize>> {
    let kept = |i: usize| formats.get(i).copied().flatten();
    let gates = if kept(2) == kept(3) { kept(2) } else { None };
    let units = [(0..1, kept(0)), (1..2, kept(1)), (2..4, gates)];
    let mut runs: Vec<(Range<usize>, Option<GgmlType>)> = Vec::new();
    for (range, format) in units {
        match runs.last_mut() {
            Some((run, f)) if *f == format => run.end = range.end,
            _ => runs.push((range, format)),
        }
    }
    runs.into_iter().map(|(run, _)| run).collect()
}

impl LinearInputs {
    /// One product making everything: z after the `channels` q/k/v rows, the gates after z.
    fn stacked(channels: u32, values: u32) -> Self {
        Self {
            extra: Vec::new(),
            z: (0, channels),
            gates: (0, channels + values),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::input_runs;
    use crate::load::GgmlType::{Q4K, Q5K};
    use std::ops::Range;

    #[test]
    fn input_projections_stack_by_kept_format() {
        // All dense (safetensors, f16/f32 GGUF) or all in one block format: one product.
        let whole = [Range { start: 0, end: 4 }];
        assert_eq!(input_runs(&[None; 4]), whole);
        assert_eq!(input_runs(&[Some(Q4K); 4]), whole);
        // q/k/v and z in one block format, b and a F32 (published Q4_K_M files).
        assert_eq!(
            input_runs(&[Some(Q4K), Some(Q4K), None, None]),
            [0..2, 2..4]
        );
        // q/k/v wider than z.
        assert_eq!(
            input_runs(&[Some(Q5K), Some(Q4K), None, None]),
            [0..1, 1..2, 2..4]
        );
        // b and a in different formats go dense together.
        assert_eq!(
            input_runs(&[Some(Q4K), Some(Q4K), Some(Q4K), None]),
            [0..2, 2..4]
        );
    }
}
