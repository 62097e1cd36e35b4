//! Sparse mixture-of-experts MLPs as configs describe them: how many experts, how many each
//! token takes, how the chosen ones are weighted, which layers have them, and the experts'
//! activation.

use serde_json::Value;

use super::config::SpecError;

/// How an expert turns its gate and up rows into its hidden row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertActivation {
    /// silu(gate) · up (Qwen3-MoE).
    SwiGlu,
    /// GPT-OSS: gate clamped above at `limit`, up clamped to ±`limit`, then
    /// gate · sigmoid(`alpha` · gate) · (up + 1).
    ClampedSwiGlu { alpha: f32, limit: f32 },
}

/// How the chosen experts' weights come from the router's logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterWeights {
    /// A softmax over the chosen experts' logits (GPT-OSS; Qwen3-MoE with `norm_topk_prob`).
    SoftmaxOfChosen,
    /// The chosen experts' probabilities from a softmax over all experts, not renormalized
    /// (Qwen3-MoE without `norm_topk_prob`).
    SoftmaxOfAll,
}

/// The experts of a decoder's sparse layers.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSpec {
    pub experts: u32,
    /// Experts each token is routed to.
    pub top_k: u32,
    /// Hidden width of one expert.
    pub intermediate: u32,
    pub weights: RouterWeights,
    pub activation: ExpertActivation,
    /// The router and the experts have biases (GPT-OSS).
    pub biases: bool,
    /// Per layer: whether its MLP is sparse (else the dense MLP of `DecoderSpec::intermediate`).
    pub sparse: Vec<bool>,
    /// A shared expert beside the routed ones on every sparse layer (Qwen3.5-MoE): a SwiGLU
    /// of `DecoderSpec::intermediate`, its output scaled by sigmoid of a one-row product.
    pub shared: bool,
}

impl MoeSpec {
    /// Whether layer `i` routes its MLP through the experts.
    pub fn is_sparse(&self, layer: u32) -> bool {
        self.sparse.get(layer as usize).copied().unwrap_or(false)
    }

    /// Expert weights (gate, up and down, with biases) of one sparse layer, and of the part a
    /// token reads (its `top_k` experts), in parameters.
    pub fn layer_parameters(&self, hidden: u32) -> (u64, u64) {
        let per_expert = 3 * u64::from(hidden) * u64::from(self.intermediate)
            + if self.biases {
                2 * u64::from(self.intermediate) + u64::from(hidden)
            } else {
                0
            };
        let router = u64::from(self.experts) * (u64::from(hidden) + 1);
        (
            u64::from(self.experts) * per_expert + router,
            u64::from(self.top_k) * per_expert + router,
        )
    }

    pub(super) fn check(&self) -> Result<(), SpecError> {
        if self.experts == 0 || self.top_k == 0 || self.top_k > self.experts {
            return Err(SpecError::Invalid(format!(
                "{} experts per token out of {} is not a valid routing",
                self.top_k, self.experts
            )));
        }
        if self.top_k > MAX_TOP_K {
            return Err(SpecError::Invalid(format!(
                "{} experts per token: at most {MAX_TOP_K} are supported",
                self.top_k
            )));
        }
        if self.experts > MAX_EXPERTS {
            return Err(SpecError::Invalid(format!(
                "{} experts: at most {MAX_EXPERTS} are supported",
                self.experts
            )));
        }
        if self.intermediate == 0 {
            return Err(SpecError::Invalid("experts of width 0".into()));
        }
        Ok(())
    }
}

/// The most experts a token may take (the routing kernel keeps them in registers).
pub const MAX_TOP_K: u32 = 16;
/// The most experts a layer may have (the grouping kernel's workgroup counts them).
pub const MAX_EXPERTS: u32 = 1024;

fn opt_u32(c: &Value, key: &str) -> Option<u32> {
    c.get(key)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
}

fn req_u32(c: &Value, keys: &[&str]) -> Result<u32, SpecError> {
    keys.iter()
        .find_map(|k| opt_u32(c, k))
        .filter(|&v| v > 0)
        .ok_or_else(|| SpecError::Invalid(format!("missing or invalid {:?}", keys[0])))
}

/// Qwen3-MoE (`qwen3_moe`): layer i is sparse unless listed in `mlp_only_layers`, and then
/// only every `decoder_sparse_step`-th layer (transformers' rule).
pub(super) fn qwen3_moe(c: &Value, layers: u32) -> Result<MoeSpec, SpecError> {
    let step = opt_u32(c, "decoder_sparse_step").unwrap_or(1).max(1);
    let dense_only: Vec<u64> = c
        .get("mlp_only_layers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    // transformers 5 writes `num_local_experts`, the published configs `num_experts`.
    let experts = req_u32(c, &["num_experts", "num_local_experts"])?;
    let sparse = (0..layers)
        .map(|i| !dense_only.contains(&u64::from(i)) && (i + 1) % step == 0)
        .collect();
    let norm = c
        .get("norm_topk_prob")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let spec = MoeSpec {
        experts,
        top_k: req_u32(c, &["num_experts_per_tok"])?,
        intermediate: req_u32(c, &["moe_intermediate_size"])?,
        weights: if norm {
            RouterWeights::SoftmaxOfChosen
        } else {
            RouterWeights::SoftmaxOfAll
        },
        activation: ExpertActivation::SwiGlu,
        biases: false,
        sparse,
        shared: false,
    };
    spec.check()?;
    Ok(spec)
}

/// GPT-OSS (`gpt_oss`): every layer sparse, biased router and experts, the clamped SwiGLU.
/// The published config names the routing `experts_per_token` as well as
/// `num_experts_per_tok`.
pub(super) fn gpt_oss(c: &Value, layers: u32) -> Result<MoeSpec, SpecError> {
    let limit = c.get("swiglu_limit").and_then(Value::as_f64).unwrap_or(7.0) as f32;
    let alpha = c
        .get("swiglu_alpha")
        .and_then(Value::as_f64)
        .unwrap_or(1.702) as f32;
    let spec = MoeSpec {
        experts: req_u32(c, &["num_local_experts", "num_experts"])?,
        top_k: req_u32(c, &["num_experts_per_tok", "experts_per_token"])?,
        intermediate: req_u32(c, &["intermediate_size"])?,
        weights: RouterWeights::SoftmaxOfChosen,
        activation: ExpertActivation::ClampedSwiGlu { alpha, limit },
        biases: true,
        sparse: vec![true; layers as usize],
        shared: false,
    };
    spec.check()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qwen3_moe_sparse_layers_follow_the_step_and_the_dense_list() {
        let c = json!({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                       "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": true});
        let spec = qwen3_moe(&c, 6).expect("parses");
        assert_eq!(spec.sparse, [false, true, false, false, false, true]);
        assert_eq!(spec.weights, RouterWeights::SoftmaxOfChosen);
        let c = json!({"num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 16});
        assert!(qwen3_moe(&c, 2).is_err());
    }

    #[test]
    fn gpt_oss_takes_either_name_of_the_routing() {
        let c = json!({"num_local_experts": 32, "experts_per_token": 4, "intermediate_size": 2880});
        let spec = gpt_oss(&c, 2).expect("parses");
        assert_eq!((spec.experts, spec.top_k), (32, 4));
        assert_eq!(
            spec.activation,
            ExpertActivation::ClampedSwiGlu {
                alpha: 1.702,
                limit: 7.0
            }
        );
    }
}
