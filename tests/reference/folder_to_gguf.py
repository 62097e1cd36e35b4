#!/usr/bin/env python3
"""Write GGUF files from the tiny Hugging Face fixture folders, the way llama.cpp's converter lays
them out, so the GGUF loader is checked against the folders' transformers goldens.

Writes (default, no arguments):

    tests/fixtures/models/tiny-qwen3.gguf   `qwen3` architecture from tests/fixtures/models/tiny-qwen3/
    tests/fixtures/models/tiny-gpt2.gguf    `gpt2` architecture from tests/fixtures/models/tiny-gpt2/
    tests/fixtures/models/tiny-phi3.gguf    `phi3` architecture from tests/fixtures/models/tiny-phi3/
    tests/fixtures/models/tiny-gemma3.gguf  `gemma3` architecture from tests/fixtures/models/tiny-gemma3/
    tests/fixtures/models/tiny-qwen3-moe.gguf      `qwen3moe` from tests/fixtures/models/tiny-qwen3-moe/
    tests/fixtures/models/tiny-gpt-oss-mxfp4.gguf  `gpt-oss` (MXFP4 experts) from tiny-gpt-oss-mxfp4/
    tests/fixtures/models/tiny-qwen3-5.gguf        `qwen35` from tiny-qwen3-5/
    tests/fixtures/models/tiny-qwen3-5-moe.gguf    `qwen35moe` from tiny-qwen3-5-moe/

Layout: llama.cpp tensor names (`token_embd`, `blk.N.attn_q`, `attn_q_norm`, `attn_qkv`, `ffn_up`,
...), matrices as F16 and norms, biases and position embeddings as F32 (the converter's choice for
an f16 output); Phi-3 longrope as `rope_factors_long` / `rope_factors_short` tensors with
`rope.scaling.original_context_length` and `rope.scaling.attn_factor`; GPT-2's Conv1D matrices
transposed to `[out][in]` as the converter does; Qwen's Q/K rows left in HF order (only the
`llama` architecture is permuted); Gemma's norm weights stored with the 1 of its (1 + w) added,
as the converter does, and its sliding-window layers listed (one flag per layer) in
`gemma3.attention.sliding_window_pattern` (llama.cpp itself assumes every sixth layer global for
`gemma3`; the tiny model has its own pattern). Metadata: the architecture's
hyperparameter keys, the byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`, tokens, token
types, merges, `pre = gpt2` since the fixtures' pre-tokenizer is GPT-2's ByteLevel regex), BOS /
EOS / padding ids and the chat template from tokenizer_config.json.

Run from anywhere (CPU only; needs gguf, numpy, torch, safetensors):

    python3 tests/reference/folder_to_gguf.py
    python3 tests/reference/folder_to_gguf.py --model DIR --out FILE

The output depends only on the folder, so reruns write identical files.
"""

import argparse
import json
import math
import os

import gguf
import numpy as np
from safetensors.torch import load_file

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULTS = ["tiny-qwen3", "tiny-gpt2", "tiny-phi3", "tiny-gemma3", "tiny-qwen3-moe", "tiny-gpt-oss-mxfp4",
            "tiny-qwen3-5", "tiny-qwen3-5-moe"]


def tokenizer_metadata(writer, folder, config):
    tok = json.load(open(os.path.join(folder, "tokenizer.json"), encoding="utf-8"))
    tok_cfg = json.load(open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8"))
    model = tok["model"]
    if model["type"] != "BPE":
        raise SystemExit(f"{folder}: only byte-level BPE vocabularies are written, not {model['type']}")
    vocab_size = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, i in model["vocab"].items():
        tokens[i] = text
        types[i] = gguf.TokenType.NORMAL
    for added in tok["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(config["bos_token_id"])
    eos = tok_cfg.get("eos_token")
    writer.add_eos_token_id(ids[eos] if eos in ids else config["eos_token_id"])
    pad = tok_cfg.get("pad_token")
    if pad in ids:
        writer.add_pad_token_id(ids[pad])
    # A post-processor that prepends the BOS (Llama 3, Gemma) is GGUF's add_bos_token.
    post = json.dumps(tok.get("post_processor"))
    writer.add_add_bos_token("TemplateProcessing" in post)
    if "<end_of_turn>" in ids:
        writer.add_eot_token_id(ids["<end_of_turn>"])
    if tok_cfg.get("chat_template"):
        writer.add_chat_template(tok_cfg["chat_template"])


def f16(t):
    return t.float().numpy().astype(np.float16)


def f32(t):
    return t.float().numpy().astype(np.float32)


def llama_like(writer, config, weights, names, final_norm=None):
    """Hyperparameters, embedding, final norm, head and the layers of `names` (HF suffix ->
    (GGUF name, converter)) for the Llama-shaped architectures."""
    heads = config["num_attention_heads"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        writer.add_rope_dimension_count(int(head_dim * partial))
    writer.add_tensor("token_embd.weight", f16(weights["model.embed_tokens.weight"]))
    writer.add_tensor("output_norm.weight", (final_norm or f32)(weights["model.norm.weight"]))
    if not config.get("tie_word_embeddings", False):
        writer.add_tensor("output.weight", f16(weights["lm_head.weight"]))
    for layer in range(config["num_hidden_layers"]):
        for hf, (name, convert) in names.items():
            writer.add_tensor(f"blk.{layer}.{name}", convert(weights[f"model.layers.{layer}.{hf}"]))


def gemma3(writer, config, weights):
    rope = config["rope_parameters"]
    config = dict(config, rope_parameters=rope["full_attention"])
    plus_one = lambda t: f32(t) + np.float32(1.0)  # noqa: E731 - the converter's (1 + w)
    llama_like(writer, config, weights, {
        "input_layernorm.weight": ("attn_norm.weight", plus_one),
        "self_attn.q_proj.weight": ("attn_q.weight", f16),
        "self_attn.k_proj.weight": ("attn_k.weight", f16),
        "self_attn.v_proj.weight": ("attn_v.weight", f16),
        "self_attn.o_proj.weight": ("attn_output.weight", f16),
        "self_attn.q_norm.weight": ("attn_q_norm.weight", plus_one),
        "self_attn.k_norm.weight": ("attn_k_norm.weight", plus_one),
        "post_attention_layernorm.weight": ("post_attention_norm.weight", plus_one),
        "pre_feedforward_layernorm.weight": ("ffn_norm.weight", plus_one),
        "mlp.gate_proj.weight": ("ffn_gate.weight", f16),
        "mlp.up_proj.weight": ("ffn_up.weight", f16),
        "mlp.down_proj.weight": ("ffn_down.weight", f16),
        "post_feedforward_layernorm.weight": ("post_ffw_norm.weight", plus_one),
    }, final_norm=plus_one)
    full = rope["full_attention"]
    if full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    # llama.cpp derives Gemma 3's query scale from the head size (true of the published
    # models); the tiny model's query_pre_attn_scalar differs, so the file states the scale.
    writer.add_float32(gguf.Keys.Attention.SCALE.format(arch="gemma3"),
                       config["query_pre_attn_scalar"] ** -0.5)
    writer.add_sliding_window(config["sliding_window"])
    writer.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])


def qwen3(writer, config, weights):
    llama_like(writer, config, weights, {
        "input_layernorm.weight": ("attn_norm.weight", f32),
        "self_attn.q_proj.weight": ("attn_q.weight", f16),
        "self_attn.k_proj.weight": ("attn_k.weight", f16),
        "self_attn.v_proj.weight": ("attn_v.weight", f16),
        "self_attn.o_proj.weight": ("attn_output.weight", f16),
        "self_attn.q_norm.weight": ("attn_q_norm.weight", f32),
        "self_attn.k_norm.weight": ("attn_k_norm.weight", f32),
        "post_attention_layernorm.weight": ("ffn_norm.weight", f32),
        "mlp.gate_proj.weight": ("ffn_gate.weight", f16),
        "mlp.up_proj.weight": ("ffn_up.weight", f16),
        "mlp.down_proj.weight": ("ffn_down.weight", f16),
    })


def phi3(writer, config, weights):
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type")) in ("longrope", "su"):
        # As llama.cpp's converter stores longrope: both factor sets as tensors, the original
        # context and the attention factor from max / original positions.
        original = config.get("original_max_position_embeddings") or rope["original_max_position_embeddings"]
        scale = config["max_position_embeddings"] / original
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    # llama.cpp keeps Phi-3's fused projections: q/k/v in attn_qkv, gate then up in ffn_up.
    llama_like(writer, config, weights, {
        "input_layernorm.weight": ("attn_norm.weight", f32),
        "self_attn.qkv_proj.weight": ("attn_qkv.weight", f16),
        "self_attn.o_proj.weight": ("attn_output.weight", f16),
        "post_attention_layernorm.weight": ("ffn_norm.weight", f32),
        "mlp.gate_up_proj.weight": ("ffn_up.weight", f16),
        "mlp.down_proj.weight": ("ffn_down.weight", f16),
    })


def gpt2(writer, config, weights):
    prefix = "transformer." if "transformer.wte.weight" in weights else ""
    writer.add_context_length(config["n_positions"])
    writer.add_embedding_length(config["n_embd"])
    writer.add_block_count(config["n_layer"])
    writer.add_feed_forward_length(config.get("n_inner") or 4 * config["n_embd"])
    writer.add_head_count(config["n_head"])
    writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    writer.add_tensor("token_embd.weight", f16(weights[f"{prefix}wte.weight"]))
    writer.add_tensor("position_embd.weight", f32(weights[f"{prefix}wpe.weight"]))
    writer.add_tensor("output_norm.weight", f32(weights[f"{prefix}ln_f.weight"]))
    writer.add_tensor("output_norm.bias", f32(weights[f"{prefix}ln_f.bias"]))
    names = {
        "ln_1": "attn_norm",
        "attn.c_attn": "attn_qkv",
        "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm",
        "mlp.c_fc": "ffn_up",
        "mlp.c_proj": "ffn_down",
    }
    for layer in range(config["n_layer"]):
        for hf, name in names.items():
            w = weights[f"{prefix}h.{layer}.{hf}.weight"]
            if hf.startswith("ln_"):
                writer.add_tensor(f"blk.{layer}.{name}.weight", f32(w))
            else:
                # Conv1D stores [in][out].
                writer.add_tensor(f"blk.{layer}.{name}.weight", f16(w.T.contiguous()))
            writer.add_tensor(f"blk.{layer}.{name}.bias", f32(weights[f"{prefix}h.{layer}.{hf}.bias"]))


ATTENTION = {
    "input_layernorm.weight": ("attn_norm.weight", f32),
    "self_attn.q_proj.weight": ("attn_q.weight", f16),
    "self_attn.k_proj.weight": ("attn_k.weight", f16),
    "self_attn.v_proj.weight": ("attn_v.weight", f16),
    "self_attn.o_proj.weight": ("attn_output.weight", f16),
}


def moe_hyperparameters(writer, config, experts, top_k, width):
    writer.add_expert_count(experts)
    writer.add_expert_used_count(top_k)
    writer.add_expert_feed_forward_length(width)


def qwen3_moe(writer, config, weights):
    """Experts stacked into 3-D `ffn_{gate,up,down}_exps` as llama.cpp's converter does; a dense
    layer (`mlp_only_layers`) keeps `ffn_gate` / `ffn_up` / `ffn_down` and has no router."""
    llama_like(writer, config, weights, dict(ATTENTION, **{
        "self_attn.q_norm.weight": ("attn_q_norm.weight", f32),
        "self_attn.k_norm.weight": ("attn_k_norm.weight", f32),
        "post_attention_layernorm.weight": ("ffn_norm.weight", f32),
    }))
    experts = config.get("num_experts") or config["num_local_experts"]
    moe_hyperparameters(writer, config, experts, config["num_experts_per_tok"],
                        config["moe_intermediate_size"])
    for layer in range(config["num_hidden_layers"]):
        mlp = f"model.layers.{layer}.mlp."
        if f"{mlp}gate.weight" not in weights:
            for proj, name in (("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down")):
                writer.add_tensor(f"blk.{layer}.{name}.weight", f16(weights[f"{mlp}{proj}_proj.weight"]))
            continue
        writer.add_tensor(f"blk.{layer}.ffn_gate_inp.weight", f32(weights[f"{mlp}gate.weight"]))
        for proj, name in (("gate", "ffn_gate_exps"), ("up", "ffn_up_exps"), ("down", "ffn_down_exps")):
            stacked = np.stack([f16(weights[f"{mlp}experts.{e}.{proj}_proj.weight"])
                                for e in range(experts)])
            writer.add_tensor(f"blk.{layer}.{name}.weight", stacked)


def mxfp4_blocks(blocks, scales):
    """ggml's MXFP4 blocks (exponent, then element j in the low and j + 16 in the high nibble of
    byte j) from the published split form (element 2i low, 2i + 1 high in byte i)."""
    lo, hi = blocks & 0x0F, blocks >> 4
    elements = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    packed = elements[..., :16] | (elements[..., 16:] << 4)
    return np.concatenate([scales[..., None], packed], axis=-1).astype(np.uint8)


def gpt_oss(writer, config, weights):
    """GPT-OSS as llama.cpp's converter lays it out: gate and up split out of the interleaved
    `gate_up_proj`, experts in MXFP4 (from an MXFP4 folder's blocks) or F16, biases F32,
    `attn_sinks`, and the norm before the experts as `post_attention_norm`."""
    llama_like(writer, config, weights, dict(ATTENTION, **{
        "self_attn.q_proj.bias": ("attn_q.bias", f32),
        "self_attn.k_proj.bias": ("attn_k.bias", f32),
        "self_attn.v_proj.bias": ("attn_v.bias", f32),
        "self_attn.o_proj.bias": ("attn_output.bias", f32),
        "self_attn.sinks": ("attn_sinks.weight", f32),
        "post_attention_layernorm.weight": ("post_attention_norm.weight", f32),
        "mlp.router.weight": ("ffn_gate_inp.weight", f32),
        "mlp.router.bias": ("ffn_gate_inp.bias", f32),
    }))
    experts = config["num_local_experts"]
    width = config["intermediate_size"]
    moe_hyperparameters(writer, config, experts, config["num_experts_per_tok"], width)
    writer.add_sliding_window(config["sliding_window"])
    # llama.cpp fixes the published model's limit of 7; the tiny model's own is stated.
    writer.add_float32("gpt-oss.swiglu_limit", config["swiglu_limit"])
    rope = config["rope_parameters"]
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    for layer in range(config["num_hidden_layers"]):
        mlp = f"model.layers.{layer}.mlp.experts."
        bias = f32(weights[f"{mlp}gate_up_proj_bias"])
        writer.add_tensor(f"blk.{layer}.ffn_gate_exps.bias", bias[:, 0::2].copy())
        writer.add_tensor(f"blk.{layer}.ffn_up_exps.bias", bias[:, 1::2].copy())
        writer.add_tensor(f"blk.{layer}.ffn_down_exps.bias", f32(weights[f"{mlp}down_proj_bias"]))
        if f"{mlp}gate_up_proj_blocks" in weights:
            gate_up = mxfp4_blocks(weights[f"{mlp}gate_up_proj_blocks"].numpy(),
                                   weights[f"{mlp}gate_up_proj_scales"].numpy())
            down = mxfp4_blocks(weights[f"{mlp}down_proj_blocks"].numpy(),
                                weights[f"{mlp}down_proj_scales"].numpy())
            parts = {"ffn_gate_exps": gate_up[:, 0::2], "ffn_up_exps": gate_up[:, 1::2],
                     "ffn_down_exps": down}
            for name, blocks in parts.items():
                e, rows, nblocks, _ = blocks.shape
                writer.add_tensor(f"blk.{layer}.{name}.weight",
                                  np.ascontiguousarray(blocks).reshape(e, rows, nblocks * 17),
                                  raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            # Stored [experts][in][out]: [out][in] per expert, gate and up columns alternating.
            gate_up = f16(weights[f"{mlp}gate_up_proj"]).transpose(0, 2, 1)
            writer.add_tensor(f"blk.{layer}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, 0::2]))
            writer.add_tensor(f"blk.{layer}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, 1::2]))
            down = f16(weights[f"{mlp}down_proj"]).transpose(0, 2, 1)
            writer.add_tensor(f"blk.{layer}.ffn_down_exps.weight", np.ascontiguousarray(down))


def qwen35(writer, config, weights):
    """Qwen3.5 (dense) as llama.cpp's converter writes it: the text model of the published
    folder, (1 + w) norms stored as the sum except the linear layers' gated norm, A stored as
    −exp(A_log), the convolution squeezed to [channels][taps], and where value heads share key
    heads in groups, the value heads reordered from grouped (key head, j) to tiled (j, key head)
    in every tensor that has them."""
    text = config.get("text_config", config)
    w = {k.replace("model.language_model.", "model.", 1): v for k, v in weights.items()
         if k.startswith(("model.language_model.", "lm_head."))}
    nk, nv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dk, dv = text["linear_key_head_dim"], text["linear_value_head_dim"]
    r = nv // nk
    heads, head_dim = text["num_attention_heads"], text["head_dim"]
    rope = text["rope_parameters"]
    layers = text["num_hidden_layers"]
    interval = text.get("full_attention_interval", 4)
    layer_types = text.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]

    def reorder(a, dim, hd):
        # Grouped value heads (key head, j) become tiled (j, key head) along `dim`.
        a = np.moveaxis(a, dim, 0)
        rest = a.shape[1:]
        a = a.reshape(nk, r, hd, *rest).swapaxes(0, 1).reshape(nv * hd, *rest)
        return np.ascontiguousarray(np.moveaxis(a, 0, dim))

    def v_channels(a, dim, hd):
        # The value part of a q/k/v stack (after 2·nk·dk channels) reordered.
        a = np.moveaxis(a, dim, 0)
        qk = 2 * nk * dk
        a = np.concatenate([a[:qk], reorder(a[qk:], 0, hd)])
        return np.ascontiguousarray(np.moveaxis(a, 0, dim))

    plus_one = lambda t: f32(t) + np.float32(1.0)  # noqa: E731 - the converter's (1 + w)
    writer.add_context_length(text["max_position_embeddings"])
    writer.add_embedding_length(text["hidden_size"])
    writer.add_block_count(layers)
    moe = "num_experts" in text
    if moe:
        moe_hyperparameters(writer, text, text["num_experts"], text["num_experts_per_tok"],
                            text["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(text["shared_expert_intermediate_size"])
    else:
        writer.add_feed_forward_length(text["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(text["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(text["rms_norm_eps"])
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.25)))
    writer.add_rope_dimension_sections(list(rope.get("mrope_section", [11, 11, 10])) + [0])
    writer.add_ssm_conv_kernel(text["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(dk)
    writer.add_ssm_group_count(nk)
    writer.add_ssm_time_step_rank(nv)
    writer.add_ssm_inner_size(nv * dv)
    arch = "qwen35moe" if moe else "qwen35"
    writer.add_uint32(f"{arch}.full_attention_interval", interval)
    writer.add_tensor("token_embd.weight", f16(w["model.embed_tokens.weight"]))
    writer.add_tensor("output_norm.weight", plus_one(w["model.norm.weight"]))
    if not config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)):
        writer.add_tensor("output.weight", f16(w["lm_head.weight"]))
    for layer, kind in enumerate(layer_types):
        hf = lambda name: w[f"model.layers.{layer}.{name}"]  # noqa: E731
        put = lambda name, a: writer.add_tensor(f"blk.{layer}.{name}", a)  # noqa: E731
        put("attn_norm.weight", plus_one(hf("input_layernorm.weight")))
        put("post_attention_norm.weight", plus_one(hf("post_attention_layernorm.weight")))
        if moe:
            # Experts stacked into 3-D tensors as the converter does (from the per-expert
            # tensors the folder holds), the shared expert and its one-row gate.
            put("ffn_gate_inp.weight", f32(hf("mlp.gate.weight")))
            for proj, name in (("gate", "ffn_gate_exps"), ("up", "ffn_up_exps"),
                               ("down", "ffn_down_exps")):
                put(f"{name}.weight", np.stack([f16(hf(f"mlp.experts.{e}.{proj}_proj.weight"))
                                                for e in range(text["num_experts"])]))
            for proj, name in (("gate", "ffn_gate_shexp"), ("up", "ffn_up_shexp"),
                               ("down", "ffn_down_shexp")):
                put(f"{name}.weight", f16(hf(f"mlp.shared_expert.{proj}_proj.weight")))
            put("ffn_gate_inp_shexp.weight", f32(hf("mlp.shared_expert_gate.weight")).reshape(-1))
        else:
            for proj, name in (("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down")):
                put(f"{name}.weight", f16(hf(f"mlp.{proj}_proj.weight")))
        if kind == "full_attention":
            for proj, name in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_output")):
                put(f"{name}.weight", f16(hf(f"self_attn.{proj}_proj.weight")))
            put("attn_q_norm.weight", plus_one(hf("self_attn.q_norm.weight")))
            put("attn_k_norm.weight", plus_one(hf("self_attn.k_norm.weight")))
            continue
        la = "linear_attn."
        put("attn_qkv.weight", v_channels(f16(hf(la + "in_proj_qkv.weight")), 0, dv))
        put("attn_gate.weight", reorder(f16(hf(la + "in_proj_z.weight")), 0, dv))
        put("ssm_beta.weight", reorder(f16(hf(la + "in_proj_b.weight")), 0, 1))
        put("ssm_alpha.weight", reorder(f16(hf(la + "in_proj_a.weight")), 0, 1))
        put("ssm_conv1d.weight", v_channels(f32(hf(la + "conv1d.weight")).squeeze(1), 0, dv))
        put("ssm_a", reorder(-np.exp(f32(hf(la + "A_log"))), 0, 1))
        put("ssm_dt.bias", reorder(f32(hf(la + "dt_bias")), 0, 1))
        put("ssm_norm.weight", f32(hf(la + "norm.weight")))
        put("ssm_out.weight", reorder(f16(hf(la + "out_proj.weight")), 1, dv))


def convert(folder, out):
    config = json.load(open(os.path.join(folder, "config.json"), encoding="utf-8"))
    arch = {"gemma3_text": "gemma3", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss",
            "qwen3_5": "qwen35", "qwen3_5_text": "qwen35", "qwen3_5_moe": "qwen35moe",
            "qwen3_5_moe_text": "qwen35moe"}.get(
        config["model_type"], config["model_type"])
    writers = {"qwen3": qwen3, "phi3": phi3, "gpt2": gpt2, "gemma3": gemma3, "qwen3moe": qwen3_moe,
               "gpt-oss": gpt_oss, "qwen35": qwen35, "qwen35moe": qwen35}
    if arch not in writers:
        raise SystemExit(f"{folder}: architecture {arch!r} is not written (supported: {sorted(writers)})")
    weights = load_file(os.path.join(folder, "model.safetensors"))
    writer = gguf.GGUFWriter(out, arch)
    writer.add_name(os.path.basename(os.path.normpath(folder)))
    writers[arch](writer, config, weights)
    tokenizer_metadata(writer, folder, config.get("text_config", config))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{out}: {arch}, {os.path.getsize(out)} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a Hugging Face folder (qwen3, phi3, gemma3, gpt2, qwen3_moe, gpt_oss)")
    ap.add_argument("--out", help="the GGUF file to write")
    args = ap.parse_args()
    if args.model:
        if not args.out:
            ap.error("--model needs --out")
        convert(args.model, args.out)
        return
    models = os.path.join(REPO_ROOT, "tests", "fixtures", "models")
    for name in DEFAULTS:
        convert(os.path.join(models, name), os.path.join(models, f"{name}.gguf"))


if __name__ == "__main__":
    main()
