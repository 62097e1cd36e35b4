//! GPT-OSS: the Llama layout's attention (with q/k/v/o biases, which its config announces)
//! plus a learned sink logit per query head; the MLP is routed experts (`experts.rs`).

use super::family::{Family, LayerNames};
use super::llama;

pub(super) const FAMILY: Family = Family {
    layer: LayerNames {
        sinks: Some("{P}layers.{L}.self_attn.sinks"),
        ..llama::FAMILY.layer
    },
    ..llama::FAMILY
};
