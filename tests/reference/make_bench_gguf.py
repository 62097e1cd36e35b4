#!/usr/bin/env python3
"""Random-weight GGUF files at real model shapes, for speed comparisons with llama.cpp.

Subcommands:

    tokenizer --gguf FILE --out TOK.json[.xz]
        Extracts the `tokenizer.ggml.*` metadata (model, pre, tokens, token types, merges, special
        ids, add-BOS/space-prefix flags) of a GGUF file into JSON (xz-compressed when the name
        ends in .xz), so files can be written without the original model at hand.

    model --config CONFIG.json --format {q4_0,q4_k,q8_0,f16,mxfp4} --tokenizer TOK.json[.xz] --out FILE
        Writes a GGUF of the shape the HF config describes (`llama` architecture for Llama and
        SmolLM2 configs, `qwen2` with Q/K/V biases for Qwen2 ones, `qwen3moe` and `gpt-oss`
        with their experts as 3-D tensors, routers, and GPT-OSS's sinks and biases, `qwen35`
        and `qwen35moe` with Gated DeltaNet layers as llama.cpp's converter lays them out) with
        random weights; mxfp4 (mixture-of-experts shapes only) keeps the experts in MXFP4 and the rest
        in Q8_0.
        Exits with status 3, writing nothing, when the format cannot hold the shape (Q4_K needs
        rows that are a multiple of 256 values; SmolLM2-135M's 576-wide matrices are not).

    prompt --tokenizer TOK.json[.xz] --len N
        Prints {"ids": [...], "text": "..."}: N token ids and a text that the tokenizer splits
        into exactly those ids (common words that are single tokens with a leading space, so
        the byte-level pre-tokenizer makes one piece, and one token, of each).

What the files hold:

* every 2-D weight matrix, the token embedding included, in the chosen format (the embedding
  also serves as the LM head when the config ties them, as in all four reference shapes);
  norms and biases in F32. Nothing is quantized from real values: the block bytes are random,
  with the block scales set so that each matrix's values have a standard deviation of about
  1/sqrt(row length) and a mean near zero (Q4_K: 6-bit sub-block scales 8..15, mins chosen to
  centre the 4-bit values, `dmin` = 2·`d`), which keeps activations finite through every layer.
  Speed does not depend on the values; finiteness keeps both engines on their normal paths.
* mixture-of-experts shapes: a token embedding MOE_EMBEDDING_SCALE times larger. Which experts
  a prompt's tokens choose sets how full the prompts' expert tiles are, so it does set speed.
  In a random model each layer's attention adds the average of the context's values, nearly
  the same vector for every later token, and it swamps the embedding: in the last layer of a
  504-token prompt every token chose the same 8 of Qwen3-30B-A3B's 128 experts (34 of 128 at
  the scale of the other matrices, `backpack bench --profile`), where trained routers spread
  a prompt over nearly all of them. At this scale the embedding keeps each token's own
  routing through all 48 layers (about 31.5 assignments an expert).
* the LM-head rows of the tokenizer's control tokens (end of text among them) and of the
  byte-level tokens that are no UTF-8 text on their own all zero: their logit is exactly 0
  while the largest of the other random logits is positive, so greedy decoding never picks
  them. Never an end-of-text token: both engines generate the full count. Never a piece of a
  character: llama-server refuses to return text that is not UTF-8.
* the tokenizer of the JSON file; a config vocabulary larger than the tokenizer's is padded
  with unique normal tokens `<|filler_N|>` that no merge produces.
* Llama 3 rope scaling as `rope_freqs.weight` (one divisor per frequency), as llama.cpp's
  converter writes it.

Needs numpy and the `gguf` package (gguf-py of llama.cpp). gguf imports PyYAML only for model
cards; a stand-in module is used when PyYAML is absent.
"""

import argparse
import json
import lzma
import math
import os
import sys
import time
import types

import numpy as np

try:
    import yaml  # noqa: F401
except ImportError:  # gguf.metadata imports it at module level but none of this uses it
    sys.modules["yaml"] = types.ModuleType("yaml")

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import GGUFValueType as VT  # noqa: E402

SKIP = 3

FORMATS = {
    "q4_0": (QT.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "q4_k": (QT.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    "q8_0": (QT.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "f16": (QT.F16, gguf.LlamaFileType.MOSTLY_F16),
    # Experts in MXFP4, everything else in Q8_0 (how llama.cpp's MXFP4 files of GPT-OSS are
    # laid out); only for mixture-of-experts shapes.
    "mxfp4": (QT.MXFP4, gguf.LlamaFileType.MOSTLY_MXFP4_MOE),
}

# GGUF architecture names of the HF model types.
ARCHES = {"llama": "llama", "qwen2": "qwen2", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss",
          "qwen3_5_text": "qwen35", "qwen3_5_moe_text": "qwen35moe"}


def open_text(path, mode):
    return lzma.open(path, mode + "t", encoding="utf-8") if path.endswith(".xz") else open(
        path, mode, encoding="utf-8"
    )


# ---------------------------------------------------------------------------------------------
# tokenizer


def extract_tokenizer(gguf_path):
    reader = gguf.GGUFReader(gguf_path)

    def value(key, default=None):
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    tok = {
        "source": os.path.basename(gguf_path),
        "model": value("tokenizer.ggml.model"),
        "pre": value("tokenizer.ggml.pre", "default"),
        "tokens": value("tokenizer.ggml.tokens"),
        "token_type": [int(t) for t in value("tokenizer.ggml.token_type")],
        "merges": value("tokenizer.ggml.merges"),
    }
    for key in (
        "bos_token_id",
        "eos_token_id",
        "unknown_token_id",
        "padding_token_id",
        "add_bos_token",
        "add_eos_token",
        "add_space_prefix",
    ):
        v = value("tokenizer.ggml." + key)
        if v is not None:
            tok[key] = v if isinstance(v, bool) else int(v)
    if tok["model"] != "gpt2" or not tok["tokens"] or not tok["merges"]:
        raise SystemExit(f"{gguf_path}: expected a byte-level BPE (gpt2) tokenizer with merges")
    return tok


def load_tokenizer(path):
    with open_text(path, "r") as f:
        return json.load(f)


def byte_level_decoder():
    """GPT-2's byte-level BPE alphabet, character to byte: printable bytes stand for
    themselves, the rest are shifted to code points from 256 on."""
    kept = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in kept:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def broken_utf8_tokens(tokens):
    """Ids of byte-level tokens whose bytes are no UTF-8 text on their own (a piece of a
    multi-byte character). Random weights generate them in any order, and llama-server
    refuses to answer with text that is not UTF-8 ("does not match the expected Content-only
    format"), so their LM-head rows are zeroed with the control tokens'."""
    chars = byte_level_decoder()
    broken = []
    for i, t in enumerate(tokens):
        if not all(c in chars for c in t):
            continue  # not a byte-level token (added and special tokens)
        try:
            bytes(chars[c] for c in t).decode("utf-8")
        except UnicodeDecodeError:
            broken.append(i)
    return broken


def cmd_tokenizer(args):
    tok = extract_tokenizer(args.gguf)
    with open_text(args.out, "w") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
    print(
        f"{args.out}: {len(tok['tokens'])} tokens, {len(tok['merges'])} merges, pre {tok['pre']!r}",
        file=sys.stderr,
    )


PROMPT_WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "was",
                "on", "be", "at", "by", "this", "from", "or", "an"]


def make_prompt(tok, n):
    index = {t: i for i, t in enumerate(tok["tokens"])}
    # "Ġ" is the byte-level alphabet's space: " the" is the single token "Ġthe".
    words = [(w, index["\u0120" + w]) for w in PROMPT_WORDS if "\u0120" + w in index]
    if not words:
        raise SystemExit("the tokenizer has none of the common words as single tokens")
    ids, text = [], []
    bos = tok.get("bos_token_id")
    if tok.get("add_bos_token") and bos is not None:
        ids.append(bos)
    # A word never follows itself, so no pre-tokenizer rule can join two of them.
    i = 0
    while len(ids) < n:
        w, t = words[i % len(words)]
        ids.append(t)
        text.append(" " + w)
        i += 1
    return {"ids": ids, "text": "".join(text)}


def cmd_prompt(args):
    print(json.dumps(make_prompt(load_tokenizer(args.tokenizer), args.len)))


# ---------------------------------------------------------------------------------------------
# random blocks


# Multiplies the random token embedding of mixture-of-experts shapes: the residual stream
# stays dominated by each token's own embedding, so prompts spread over the experts as a
# trained model's do (see the module docstring).
MOE_EMBEDDING_SCALE = 3000.0


def f16_bits(x):
    return np.asarray(x, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_matrix(rng, qtype, rows, cols, zero_rows=(), scale=1.0):
    """Random block bytes of a rows×cols matrix, as (rows, bytes per row) uint8: values of
    standard deviation `scale`/sqrt(cols)."""
    std = scale / math.sqrt(cols)
    if qtype == QT.F16:
        # Sign, 10 random mantissa bits and an exponent 0..3 below the top one: magnitudes in
        # [2^(e-3), 2^(e+1)), a standard deviation near `std`, no float conversion pass.
        bits = rng.integers(0, 1 << 16, size=rows * cols, dtype=np.uint16)
        e = np.uint16(15 + math.floor(math.log2(std)))
        bits = (bits & np.uint16(0x83FF)) | ((e - ((bits >> np.uint16(10)) & np.uint16(3))) << np.uint16(10))
        out = bits.view(np.uint8).reshape(rows, cols * 2)
    else:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nb = rows * cols // block
        blocks = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
        jitter = rng.uniform(0.75, 1.25, size=nb)
        if qtype == QT.Q8_0:
            # d·q, q uniform in -128..127 (standard deviation 73.9).
            blocks[:, 0:2] = f16_bits(std / 73.9 * jitter)
        elif qtype == QT.Q4_0:
            # d·(q - 8), q uniform in 0..15 (standard deviation 4.61, mean -0.5); d of random
            # sign, so the means of the blocks cancel.
            sign = np.where(blocks[:, 2] & 1, 1.0, -1.0)
            blocks[:, 0:2] = f16_bits(std / 4.61 * jitter * sign)
        elif qtype == QT.MXFP4:
            # e2m1 codes (doubled values ±0..12, standard deviation about 5.3) times the
            # halved e8m0 scale 2^(e - 128): e puts it near std / 5.3.
            blocks[:, 0] = 128 + np.rint(np.log2(std / 5.3 * jitter)).astype(np.int64)
        elif qtype == QT.Q4_K:
            # d·sc·q - dmin·m per 32-value sub-block; sc 8..15, dmin = 2d, m = round(3.75·sc)
            # puts the mean at d·sc·7.5 - 2d·m ≈ 0; standard deviation ≈ d·11.5·4.61.
            d = std / (11.5 * 4.61) * jitter
            blocks[:, 0:2] = f16_bits(d)
            blocks[:, 2:4] = f16_bits(2 * d)
            sc = 8 + (blocks[:, 16:24] & 7)  # qs bytes as the random source
            m = np.rint(sc * 3.75).astype(np.uint8)
            s = np.empty((nb, 12), dtype=np.uint8)
            s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
            s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
            s[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
            blocks[:, 4:16] = s
        else:
            raise ValueError(qtype)
        out = blocks.reshape(rows, cols // block * size)
    for r in zero_rows:
        out[r] = 0
    return out


def rope_factors(cfg, head_dim):
    """Llama 3 frequency divisors, as llama.cpp's converter computes them."""
    s = cfg.get("rope_scaling") or {}
    if (s.get("rope_type") or s.get("type") or "").lower() != "llama3":
        return None
    base = cfg.get("rope_theta", 10000.0)
    factor = s.get("factor", 8.0)
    low = s.get("low_freq_factor", 1.0)
    high = s.get("high_freq_factor", 4.0)
    old = s.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# model


def shape_of(cfg):
    cfg = cfg.get("text_config", cfg)
    mt = cfg.get("model_type", "llama")
    if mt not in ARCHES:
        raise SystemExit(f"model_type {mt!r}: only {sorted(ARCHES)} configs are supported")
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    return {
        "arch": ARCHES[mt],
        "hidden": hidden,
        "inter": cfg.get("intermediate_size") or cfg["moe_intermediate_size"],
        "layers": cfg["num_hidden_layers"],
        "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads", heads),
        "head_dim": cfg.get("head_dim") or hidden // heads,
        "vocab": cfg["vocab_size"],
        "tied": cfg.get("tie_word_embeddings", False),
        "qkv_bias": mt in ("qwen2", "gpt_oss") or cfg.get("attention_bias", False),
        "qk_norm": mt == "qwen3_moe",
        "experts": experts,
        "top_k": cfg.get("num_experts_per_tok") or cfg.get("experts_per_token"),
        "expert_inter": cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
        "gpt_oss": mt == "gpt_oss",
        "qwen35": mt in ("qwen3_5_text", "qwen3_5_moe_text"),
        "linear": qwen35_linear(cfg) if mt in ("qwen3_5_text", "qwen3_5_moe_text") else None,
        "shared_inter": cfg.get("shared_expert_intermediate_size"),
    }


def qwen35_linear(cfg):
    """A Qwen3.5 text config's Gated DeltaNet shape and which layers use it."""
    interval = cfg.get("full_attention_interval", 4)
    n = cfg["num_hidden_layers"]
    kinds = cfg.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    rope = cfg.get("rope_parameters") or {}
    return {
        "nk": cfg["linear_num_key_heads"], "nv": cfg["linear_num_value_heads"],
        "dk": cfg["linear_key_head_dim"], "dv": cfg["linear_value_head_dim"],
        "conv": cfg["linear_conv_kernel_dim"], "interval": interval,
        "layers": [k == "linear_attention" for k in kinds],
        "rotary": int(cfg["head_dim"] * rope.get("partial_rotary_factor", 0.25)),
        "sections": list(rope.get("mrope_section", [11, 11, 10])) + [0],
        "theta": float(rope.get("rope_theta", 1e7)),
    }


def qwen35_layer(b, h, sh, linear_layer):
    """One Qwen3.5 layer's mixer tensors: a Gated DeltaNet's (its small projections b and a in
    F32, as published files keep them) or gated attention's (q carries the gate heads)."""
    hd = sh["head_dim"]
    if not linear_layer:
        return [
            (b + "attn_q.weight", 2 * sh["heads"] * hd, h, "matrix"),
            (b + "attn_k.weight", sh["kv_heads"] * hd, h, "matrix"),
            (b + "attn_v.weight", sh["kv_heads"] * hd, h, "matrix"),
            (b + "attn_q_norm.weight", hd, None, "norm"),
            (b + "attn_k_norm.weight", hd, None, "norm"),
            (b + "attn_output.weight", h, sh["heads"] * hd, "matrix"),
        ]
    li = sh["linear"]
    values = li["nv"] * li["dv"]
    channels = 2 * li["nk"] * li["dk"] + values
    return [
        (b + "attn_qkv.weight", channels, h, "matrix"),
        (b + "attn_gate.weight", values, h, "matrix"),
        (b + "ssm_beta.weight", li["nv"], h, "dense"),
        (b + "ssm_alpha.weight", li["nv"], h, "dense"),
        (b + "ssm_conv1d.weight", channels, li["conv"], "dense"),
        (b + "ssm_a", li["nv"], None, "decay"),
        (b + "ssm_dt.bias", li["nv"], None, "bias"),
        (b + "ssm_norm.weight", li["dv"], None, "norm"),
        (b + "ssm_out.weight", h, values, "matrix"),
    ]


def tensor_plan(cfg, sh):
    """(name, rows, cols, kind) of the weights: 2-D matrices, 3-D expert stacks ("experts":
    rows are experts × their rows), F32 vectors."""
    h, hd = sh["hidden"], sh["head_dim"]
    q, kv = sh["heads"] * hd, sh["kv_heads"] * hd
    plan = [("token_embd.weight", sh["vocab"], h, "matrix")]
    factors = rope_factors(cfg, hd)
    if factors is not None:
        plan.append(("rope_freqs.weight", len(factors), None, "rope"))
    for i in range(sh["layers"]):
        b = f"blk.{i}."
        if sh["qwen35"]:
            plan.append((b + "attn_norm.weight", h, None, "norm"))
            plan += qwen35_layer(b, h, sh, sh["linear"]["layers"][i])
            plan.append((b + "post_attention_norm.weight", h, None, "norm"))
            if sh["experts"]:
                # Routed experts as 3-D stacks, and the shared expert with its one-row gate
                # stored as a vector (llama.cpp's converter for qwen35moe).
                e, w, sw = sh["experts"], sh["expert_inter"], sh["shared_inter"]
                plan += [
                    (b + "ffn_gate_inp.weight", e * h, None, "router"),
                    (b + "ffn_gate_exps.weight", e * w, h, "experts"),
                    (b + "ffn_up_exps.weight", e * w, h, "experts"),
                    (b + "ffn_down_exps.weight", e * h, w, "experts"),
                    (b + "ffn_gate_shexp.weight", sw, h, "matrix"),
                    (b + "ffn_up_shexp.weight", sw, h, "matrix"),
                    (b + "ffn_down_shexp.weight", h, sw, "matrix"),
                    (b + "ffn_gate_inp_shexp.weight", h, None, "bias"),
                ]
            else:
                plan += [
                    (b + "ffn_gate.weight", sh["inter"], h, "matrix"),
                    (b + "ffn_up.weight", sh["inter"], h, "matrix"),
                    (b + "ffn_down.weight", h, sh["inter"], "matrix"),
                ]
            continue
        plan += [
            (b + "attn_norm.weight", h, None, "norm"),
            (b + "attn_q.weight", q, h, "matrix"),
            (b + "attn_k.weight", kv, h, "matrix"),
            (b + "attn_v.weight", kv, h, "matrix"),
        ]
        if sh["qkv_bias"]:
            plan += [
                (b + "attn_q.bias", q, None, "bias"),
                (b + "attn_k.bias", kv, None, "bias"),
                (b + "attn_v.bias", kv, None, "bias"),
            ]
        if sh["qk_norm"]:
            plan += [
                (b + "attn_q_norm.weight", hd, None, "norm"),
                (b + "attn_k_norm.weight", hd, None, "norm"),
            ]
        plan.append((b + "attn_output.weight", h, q, "matrix"))
        if sh["gpt_oss"]:
            plan += [
                (b + "attn_output.bias", h, None, "bias"),
                (b + "attn_sinks.weight", sh["heads"], None, "bias"),
                (b + "post_attention_norm.weight", h, None, "norm"),
            ]
        else:
            plan.append((b + "ffn_norm.weight", h, None, "norm"))
        if sh["experts"]:
            e, w = sh["experts"], sh["expert_inter"]
            plan += [
                (b + "ffn_gate_inp.weight", e * h, None, "router"),
                (b + "ffn_gate_exps.weight", e * w, h, "experts"),
                (b + "ffn_up_exps.weight", e * w, h, "experts"),
                (b + "ffn_down_exps.weight", e * h, w, "experts"),
            ]
            if sh["gpt_oss"]:
                plan += [
                    (b + "ffn_gate_inp.bias", e, None, "bias"),
                    (b + "ffn_gate_exps.bias", e * w, None, "bias"),
                    (b + "ffn_up_exps.bias", e * w, None, "bias"),
                    (b + "ffn_down_exps.bias", e * h, None, "bias"),
                ]
        else:
            plan += [
                (b + "ffn_gate.weight", sh["inter"], h, "matrix"),
                (b + "ffn_up.weight", sh["inter"], h, "matrix"),
                (b + "ffn_down.weight", h, sh["inter"], "matrix"),
            ]
    plan.append(("output_norm.weight", h, None, "norm"))
    if not sh["tied"]:
        plan.append(("output.weight", sh["vocab"], h, "matrix"))
    return plan, factors


def tensor_shape(sh, tname, rows, cols, kind):
    """The tensor's dimensions, slowest first: expert stacks are 3-D, routers `[experts][hidden]`,
    expert biases `[experts][n]`."""
    if kind == "experts":
        return (sh["experts"], rows // sh["experts"], cols)
    if kind == "router":
        return (sh["experts"], rows // sh["experts"])
    if tname.endswith("_exps.bias"):
        return (sh["experts"], rows // sh["experts"])
    return (rows,) if cols is None else (rows, cols)


def matrix_type(qtype, kind):
    """The format of a weight: MXFP4 files keep it for experts, Q8_0 elsewhere."""
    if qtype == QT.MXFP4 and kind != "experts":
        return QT.Q8_0
    return qtype


def unfit(plan, qtype):
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    bad = sorted({cols for _, _, cols, kind in plan if kind in ("matrix", "experts") and cols % block})
    if bad:
        return f"{qtype.name} needs rows of a multiple of {block} values; this shape has rows of {bad}"
    return None


def cmd_model(args):
    t0 = time.time()
    with open(args.config, encoding="utf-8") as f:
        cfg = json.load(f)
    sh = shape_of(cfg)
    qtype, ftype = FORMATS[args.format]
    plan, factors = tensor_plan(cfg, sh)
    if qtype == QT.MXFP4 and not sh["experts"]:
        print("skip: mxfp4 is for mixture-of-experts shapes", file=sys.stderr)
        return SKIP
    reason = unfit(plan, qtype)
    if reason:
        print(f"skip: {reason}", file=sys.stderr)
        return SKIP

    tok = load_tokenizer(args.tokenizer)
    tokens, types_ = list(tok["tokens"]), list(tok["token_type"])
    if sh["vocab"] < len(tokens):
        raise SystemExit(
            f"config vocab_size {sh['vocab']} is smaller than the tokenizer's {len(tokens)} tokens"
        )
    for i in range(len(tokens), sh["vocab"]):
        tokens.append(f"<|filler_{i}|>")
        types_.append(1)
    control = [i for i, t in enumerate(tok["token_type"]) if t == 3]
    control += broken_utf8_tokens(tok["tokens"])
    for key in ("eos_token_id", "bos_token_id", "padding_token_id"):
        if key in tok and tok[key] not in control:
            control.append(tok[key])

    arch = sh["arch"]
    name = args.name or os.path.splitext(os.path.basename(args.config))[0]
    w = gguf.GGUFWriter(args.out, arch)
    w.add_string("general.type", "model")
    w.add_string("general.name", f"{name} random {args.format}")
    w.add_uint32(f"{arch}.context_length", int(cfg.get("max_position_embeddings", 4096)))
    w.add_uint32(f"{arch}.embedding_length", sh["hidden"])
    w.add_uint32(f"{arch}.block_count", sh["layers"])
    w.add_uint32(f"{arch}.feed_forward_length", sh["inter"])
    w.add_uint32(f"{arch}.attention.head_count", sh["heads"])
    w.add_uint32(f"{arch}.attention.head_count_kv", sh["kv_heads"])
    theta = sh["linear"]["theta"] if sh["linear"] else cfg.get("rope_theta", 10000.0)
    w.add_float32(f"{arch}.rope.freq_base", float(theta))
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(cfg.get("rms_norm_eps", 1e-6)))
    li = sh["linear"]
    w.add_uint32(f"{arch}.rope.dimension_count", li["rotary"] if li else sh["head_dim"])
    if li:
        w.add_rope_dimension_sections(li["sections"])
        w.add_ssm_conv_kernel(li["conv"])
        w.add_ssm_state_size(li["dk"])
        w.add_ssm_group_count(li["nk"])
        w.add_ssm_time_step_rank(li["nv"])
        w.add_ssm_inner_size(li["nv"] * li["dv"])
        w.add_uint32(f"{arch}.full_attention_interval", li["interval"])
    if sh["head_dim"] != sh["hidden"] // sh["heads"] or li:
        w.add_uint32(f"{arch}.attention.key_length", sh["head_dim"])
        w.add_uint32(f"{arch}.attention.value_length", sh["head_dim"])
    w.add_uint32(f"{arch}.vocab_size", sh["vocab"])
    if sh["experts"]:
        w.add_uint32(f"{arch}.expert_count", sh["experts"])
        w.add_uint32(f"{arch}.expert_used_count", sh["top_k"])
        w.add_uint32(f"{arch}.expert_feed_forward_length", sh["expert_inter"])
        if sh["shared_inter"]:
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length", sh["shared_inter"])
    if sh["gpt_oss"]:
        w.add_uint32(f"{arch}.attention.sliding_window", int(cfg["sliding_window"]))
        rs = cfg.get("rope_scaling") or {}
        if rs.get("rope_type") == "yarn":
            w.add_string(f"{arch}.rope.scaling.type", "yarn")
            w.add_float32(f"{arch}.rope.scaling.factor", float(rs["factor"]))
            w.add_uint32(f"{arch}.rope.scaling.original_context_length",
                         int(rs["original_max_position_embeddings"]))
    w.add_uint32("general.file_type", int(ftype))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    w.add_string("tokenizer.ggml.model", tok["model"])
    w.add_string("tokenizer.ggml.pre", tok["pre"])
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_key_value("tokenizer.ggml.token_type", types_, VT.ARRAY, sub_type=VT.INT32)
    w.add_array("tokenizer.ggml.merges", tok["merges"])
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        if key in tok:
            w.add_uint32("tokenizer.ggml." + key, tok[key])
    for key in ("add_bos_token", "add_eos_token", "add_space_prefix"):
        if key in tok:
            w.add_bool("tokenizer.ggml." + key, tok[key])

    # Tensor infos first, then the data one tensor at a time: memory stays at one tensor.
    head = "token_embd.weight" if sh["tied"] else "output.weight"
    for tname, rows, cols, kind in plan:
        dims = tensor_shape(sh, tname, rows, cols, kind)
        if kind in ("matrix", "experts"):
            ty = matrix_type(qtype, kind)
            if ty == QT.F16:
                w.add_tensor_info(tname, dims, np.dtype(np.float16), rows * cols * 2)
            else:
                block, size = gguf.GGML_QUANT_SIZES[ty]
                nbytes = rows * cols // block * size
                byte_dims = (*dims[:-1], cols // block * size)
                w.add_tensor_info(tname, byte_dims, np.dtype(np.uint8), nbytes, raw_dtype=ty)
        else:
            values = rows * (cols or 1)
            w.add_tensor_info(tname, dims, np.dtype(np.float32), values * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(args.seed)
    total = 0
    for tname, rows, cols, kind in plan:
        if kind in ("matrix", "experts"):
            ty = matrix_type(qtype, kind)
            scale = MOE_EMBEDDING_SCALE if tname == "token_embd.weight" and sh["experts"] else 1.0
            data = random_matrix(rng, ty, rows, cols, control if tname == head else (), scale)
            if ty == QT.F16:
                data = data.view(np.float16)
        elif kind == "router":
            data = (rng.standard_normal(rows) / math.sqrt(sh["hidden"])).astype(np.float32)
        elif kind == "norm":
            data = rng.uniform(0.8, 1.2, size=rows).astype(np.float32)
        elif kind == "bias":
            data = (rng.standard_normal(rows) * 0.02).astype(np.float32)
        elif kind == "dense":
            data = (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32)
        elif kind == "decay":
            # A = −exp(A_log), as the converter stores it: decay rates of 0.5 to 8.
            data = -np.exp(rng.uniform(-0.7, 2.1, size=rows)).astype(np.float32)
        else:
            data = factors
        w.write_tensor_data(data)
        total += data.nbytes
    w.close()
    print(
        f"{args.out}: {arch}, {sh['layers']} layers × {sh['hidden']}, vocab {sh['vocab']}, "
        f"{args.format}, {total / 2**20:.0f} MiB of tensors in {time.time() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tokenizer", help="extract tokenizer.ggml.* metadata into JSON")
    p.add_argument("--gguf", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("model", help="write a random-weight GGUF")
    p.add_argument("--config", required=True, help="HF config.json (llama or qwen2)")
    p.add_argument("--format", required=True, choices=sorted(FORMATS))
    p.add_argument("--tokenizer", required=True, help="JSON from the tokenizer subcommand")
    p.add_argument("--out", required=True)
    p.add_argument("--name", help="general.name prefix (default: the config's file name)")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("prompt", help="token ids and a text that tokenizes to them")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--len", type=int, required=True)
    args = ap.parse_args()
    return {"tokenizer": cmd_tokenizer, "model": cmd_model, "prompt": cmd_prompt}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
