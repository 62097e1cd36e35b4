//! A sparse layer's router and experts, in whichever form the checkpoint holds them:
//!
//! - Qwen3-MoE as published: one tensor per expert and projection
//!   (`mlp.experts.{e}.gate_proj.weight`), router `mlp.gate.weight`;
//! - transformers 5's fused form: `mlp.experts.gate_up_proj` `[experts][2·I][hidden]` (each
//!   expert's gate rows, then its up rows) and `mlp.experts.down_proj` `[experts][hidden][I]`;
//! - GPT-OSS as published: MXFP4 `mlp.experts.gate_up_proj_blocks` / `_scales` with gate and up
//!   rows alternating, biases, router `mlp.router.weight` / `.bias`; or its bf16 form, stored
//!   `[in][out]` per expert;
//! - GGUF: `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps` (3-D, any block format; biases for
//!   GPT-OSS) and `ffn_gate_inp`.

use crate::Error;
use crate::load::{Arch, DecoderSpec, MoeSpec};
use crate::ops::{ExpertWeights, GateUpRows};

use super::super::weights::{Part, Uploader};

/// Uploads the router and experts of sparse layer `layer`.
pub(super) fn load(
    up: &mut Uploader<'_>,
    spec: &DecoderSpec,
    moe: &MoeSpec,
    prefix: &str,
    layer: u32,
) -> Result<ExpertWeights, Error> {
    let mlp = format!("{prefix}layers.{layer}.mlp.");
    let label = format!("layer {layer} experts");
    let (e, i, d) = (moe.experts, moe.intermediate, spec.hidden);
    let router_name = match spec.arch {
        Arch::GptOss => format!("{mlp}router.weight"),
        _ => format!("{mlp}gate.weight"),
    };
    let router = up.f32_matrix(&format!("{label} router"), &router_name, e, d)?;
    let router_bias = moe
        .biases
        .then(|| up.flat_vector(&label, &format!("{mlp}router.bias"), e))
        .transpose()?;
    let experts = format!("{mlp}experts.");
    let (gate_up, gate_up_rows, down) = if up.is_random() {
        let gate_up = one(up, &label, "gate/up", 2 * e * i, d)?;
        let down = one(up, &label, "down", e * d, i)?;
        (gate_up, GateUpRows::per_expert(i), down)
    } else if up.is_gguf() {
        // Synthetic names the GGUF mapping knows (`ffn_gate_exps` and its kin).
        let gate_up = up.matrix(
            &format!("{label} gate/up"),
            &[
                Part {
                    name: &format!("{experts}gate_proj"),
                    rows: e * i,
                    cols: d,
                },
                Part {
                    name: &format!("{experts}up_proj"),
                    rows: e * i,
                    cols: d,
                },
            ],
            false,
        )?;
        let down = one(up, &label, &format!("{experts}down_proj"), e * d, i)?;
        (gate_up, GateUpRows::gates_then_ups(e, i), down)
    } else if up.has(&format!("{experts}gate_up_proj_blocks")) {
        let gate_up = up.mxfp4_matrix(
            &format!("{label} gate/up"),
            &format!("{experts}gate_up_proj_blocks"),
            &format!("{experts}gate_up_proj_scales"),
            2 * e * i,
            d,
        )?;
        let down = up.mxfp4_matrix(
            &format!("{label} down"),
            &format!("{experts}down_proj_blocks"),
            &format!("{experts}down_proj_scales"),
            e * d,
            i,
        )?;
        (gate_up, GateUpRows::interleaved(i), down)
    } else if up.has(&format!("{experts}gate_up_proj")) {
        let fused = format!("{experts}gate_up_proj");
        let down_name = format!("{experts}down_proj");
        if spec.arch == Arch::GptOss {
            // Stored [in][out] per expert, gate and up columns alternating.
            let gate_up = up.transposed_experts(&label, &fused, e, 2 * i, d)?;
            let down = up.transposed_experts(&label, &down_name, e, d, i)?;
            (gate_up, GateUpRows::interleaved(i), down)
        } else {
            let gate_up = one(up, &label, &fused, 2 * e * i, d)?;
            let down = one(up, &label, &down_name, e * d, i)?;
            (gate_up, GateUpRows::per_expert(i), down)
        }
    } else {
        per_expert_tensors(up, &label, &experts, e, i, d)?
    };
    let (gate_up_bias, down_bias) = if moe.biases {
        let gate_up_bias = if up.is_gguf() {
            up.vector(
                &label,
                &[
                    (&format!("{experts}gate_proj_bias"), e * i),
                    (&format!("{experts}up_proj_bias"), e * i),
                ],
                None,
            )?
        } else {
            up.flat_vector(&label, &format!("{experts}gate_up_proj_bias"), 2 * e * i)?
        };
        let down_bias = up.flat_vector(&label, &format!("{experts}down_proj_bias"), e * d)?;
        (Some(gate_up_bias), Some(down_bias))
    } else {
        (None, None)
    };
    Ok(ExpertWeights {
        router,
        router_bias,
        gate_up,
        gate_up_rows,
        gate_up_bias,
        down,
        down_bias,
    })
}

fn one(
    up: &mut Uploader<'_>,
    label: &str,
    name: &str,
    rows: u32,
    cols: u32,
) -> Result<crate::ops::Matrix, Error> {
    up.matrix(label, &[Part { name, rows, cols }], false)
}

/// Qwen3-MoE as published: a gate, up and down tensor per expert, stacked expert by expert.
fn per_expert_tensors(
    up: &mut Uploader<'_>,
    label: &str,
    experts: &str,
    e: u32,
    i: u32,
    d: u32,
) -> Result<(crate::ops::Matrix, GateUpRows, crate::ops::Matrix), Error> {
    let name = |x: u32, proj: &str| format!("{experts}{x}.{proj}.weight");
    let gate_up_names: Vec<String> = (0..e)
        .flat_map(|x| [name(x, "gate_proj"), name(x, "up_proj")])
        .collect();
    let gate_up = up.matrix(
        &format!("{label} gate/up"),
        &parts(&gate_up_names, i, d),
        false,
    )?;
    let down_names: Vec<String> = (0..e).map(|x| name(x, "down_proj")).collect();
    let down = up.matrix(&format!("{label} down"), &parts(&down_names, d, i), false)?;
    Ok((gate_up, GateUpRows::per_expert(i), down))
}

/// Tensors `names`, each `rows`×`cols`, as the parts of one matrix.
fn parts(names: &[String], rows: u32, cols: u32) -> Vec<Part<'_>> {
    names
        .iter()
        .map(|name| Part {
            name: name.as_str(),
            rows,
            cols,
        })
        .collect()
}
