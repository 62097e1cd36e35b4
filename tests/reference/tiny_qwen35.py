"""Qwen3.5 (the Gated DeltaNet hybrid) for make_tiny_models.py: its config, the weights the
generic initialisation does not suit, and the folder rewritten as the published checkpoints
are laid out (Qwen3_5ForConditionalGeneration: `model.language_model.*`, the text settings
under `text_config`, a vision tower and a multi-token-prediction head that text chat skips).

Shapes follow transformers' modeling_qwen3_5.py / modeling_qwen3_5_moe.py: three linear-
attention layers to one full-attention layer (`full_attention_interval` 4), q/k heads of the
linear layers shared by groups of value heads, gated full attention with partial interleaved
multimodal RoPE (plain partial RoPE for text), and for the MoE variant routed experts plus a
gated shared expert on every layer.
"""

import json
import os

import torch
import transformers
from safetensors.torch import load_file, save_file

ARCHS = ("qwen3_5", "qwen3_5_moe")


def config(spec, vocab_size, special_ids, init_std):
    """The text config of a tiny Qwen3.5 (dense, or MoE with `experts`)."""
    check_rotary(spec)
    heads, head_dim = spec["heads"], spec["head_dim"]
    rotary = int(head_dim * 0.25)
    # Sections of the rotary frequencies per position stream (t, h, w), as mrope_section.
    pairs = rotary // 2
    sections = [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3]
    common = dict(
        vocab_size=vocab_size, hidden_size=spec["hidden"], num_hidden_layers=spec["layers"],
        num_attention_heads=heads, num_key_value_heads=spec["kv_heads"], head_dim=head_dim,
        max_position_embeddings=256, hidden_act="silu", initializer_range=init_std,
        rms_norm_eps=1e-6, tie_word_embeddings=spec["tie"],
        linear_conv_kernel_dim=4, linear_key_head_dim=spec["key_dim"],
        linear_value_head_dim=spec["value_dim"], linear_num_key_heads=spec["key_heads"],
        linear_num_value_heads=spec["value_heads"], full_attention_interval=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": sections,
                         "mrope_interleaved": True},
        bos_token_id=special_ids["<|endoftext|>"], eos_token_id=special_ids["<|endoftext|>"],
        pad_token_id=special_ids["<|endoftext|>"],
    )
    if spec["arch"] == "qwen3_5_moe":
        return transformers.Qwen3_5MoeTextConfig(
            num_experts=spec["experts"], num_experts_per_tok=spec["top_k"],
            moe_intermediate_size=spec["expert_intermediate"],
            shared_expert_intermediate_size=spec["shared_intermediate"], **common)
    return transformers.Qwen3_5TextConfig(intermediate_size=spec["intermediate"], **common)


def init(module_name, param_name, param, noise, norm_std):
    """Sets the parameters the generic initialisation does not suit; returns whether it did.

    The RMSNorms scale by (1 + w), so their w centre on 0; the linear layers' gated output
    norm scales by w, so it centres on 1. A_log spreads the heads' decay rates, dt_bias and the
    convolution get enough weight to matter."""
    if param_name == "A_log":
        param.copy_(torch.log(torch.linspace(0.3, 6.0, param.numel())) + 0.1 * noise)
    elif param_name == "dt_bias":
        param.copy_(0.5 * noise)
    elif module_name.endswith("conv1d"):
        param.copy_(0.4 * noise)
    elif module_name.endswith("linear_attn.norm"):
        param.copy_(1.0 + norm_std * noise)
    elif module_name.endswith("norm"):
        param.copy_(norm_std * noise)
    else:
        return False
    return True


def write_published_layout(out_dir, seed):
    """Rewrites a saved text-only folder the way Qwen's checkpoints are published: the text
    model under `model.language_model.`, the config nested as `text_config` of a
    Qwen3_5(Moe)ForConditionalGeneration, plus a small vision tower and a multi-token-prediction
    head (random; text chat reads neither)."""
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        text = json.load(f)
    moe = text["model_type"] == "qwen3_5_moe_text"
    weights_path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(weights_path)
    renamed = {}
    for name, t in tensors.items():
        renamed[name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name] = t
    gen = torch.Generator().manual_seed(seed + 1000)
    dtype = next(iter(tensors.values())).dtype
    hidden = text["hidden_size"]
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
              "in_channels": 3, "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
              "out_hidden_size": hidden, "num_position_embeddings": 64,
              "deepstack_visual_indexes": [], "hidden_act": "gelu_pytorch_tanh",
              "model_type": "qwen3_5_moe_vision" if moe else "qwen3_5_vision"}

    def rand(*shape):
        return (0.02 * torch.randn(shape, generator=gen)).to(dtype)

    renamed.update({
        "model.visual.patch_embed.proj.weight": rand(32, 3, 2, 16, 16),
        "model.visual.patch_embed.proj.bias": rand(32),
        "model.visual.pos_embed.weight": rand(64, 32),
        "model.visual.blocks.0.norm1.weight": rand(32),
        "model.visual.blocks.0.attn.qkv.weight": rand(96, 32),
        "model.visual.merger.linear_fc2.weight": rand(hidden, 128),
        "mtp.fc.weight": rand(hidden, 2 * hidden),
        "mtp.norm.weight": rand(hidden),
    })
    os.remove(weights_path)
    save_file(renamed, weights_path, metadata={"format": "pt"})
    text_config = {k: v for k, v in text.items() if k not in ("architectures", "transformers_version")}
    outer = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": text_config,
        "vision_config": vision,
        "image_token_id": 5, "video_token_id": 6, "vision_start_token_id": 7, "vision_end_token_id": 8,
        "tie_word_embeddings": text["tie_word_embeddings"],
        "transformers_version": text.get("transformers_version"),
    }
    with open(cfg_path, "w") as f:
        json.dump(outer, f, indent=2, sort_keys=True)
        f.write("\n")


def load_published_layout(out_dir):
    """transformers reading the published folder (the goldens come from this model)."""
    with open(os.path.join(out_dir, "config.json")) as f:
        moe = json.load(f)["model_type"] == "qwen3_5_moe"
    cls = (transformers.Qwen3_5MoeForConditionalGeneration if moe
           else transformers.Qwen3_5ForConditionalGeneration)
    model = cls.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def check_rotary(spec):
    """The tiny heads keep a whole number of rotary pairs, at least one per position stream."""
    rotary = int(spec["head_dim"] * 0.25)
    if rotary % 2 or rotary < 6:
        raise SystemExit(f"head_dim {spec['head_dim']} leaves {rotary} rotary dims (need an even 6+)")
