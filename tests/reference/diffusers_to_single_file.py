#!/usr/bin/env python3
"""Convert a diffusers Stable Diffusion folder (SD 1.x, SD 2.x or SDXL) into one `.safetensors` file
with the original Stable Diffusion key names (CompVis/LDM for SD 1.x/2.x, Stability's SGM for SDXL),
the layout of the single-file checkpoints people download (v1-5-pruned-emaonly.safetensors,
sd_turbo.safetensors, sd_xl_turbo_1.0_fp16.safetensors, ...).

    python3 tests/reference/diffusers_to_single_file.py FOLDER OUT.safetensors \\
        [--dtype fp32|fp16] [--variant fp16] [--keys-json KEYS.json] [--no-extras] [--no-verify]
    python3 tests/reference/diffusers_to_single_file.py --print-rules

The mapping is the inverse of diffusers' own loader (diffusers/loaders/single_file_utils.py:
convert_ldm_unet_checkpoint, convert_ldm_vae_checkpoint, convert_ldm_clip_checkpoint and
convert_open_clip_checkpoint with the DIFFUSERS_TO_LDM_MAPPING table). After writing, the file is read
back and converted with exactly those diffusers functions, and every tensor must equal the folder's
(after the cast to --dtype): `verify()`.

Which text encoder layout is written:
    SD 1.x (one CLIPTextModel, quick_gelu)   cond_stage_model.transformer.text_model.*   (HF names)
    SD 2.x (one CLIPTextModel, gelu)         cond_stage_model.model.*                     (OpenCLIP names)
    SDXL (text_encoder + text_encoder_2)     conditioner.embedders.0.transformer.text_model.*  (HF names)
                                             conditioner.embedders.1.model.*                   (OpenCLIP names)
The SD 1.x / 2.x choice follows the text encoder's hidden_act ("quick_gelu" = OpenAI CLIP-L,
"gelu" = OpenCLIP-H), unless --text-layout says otherwise.

`--keys-json` writes every {original key -> diffusers "component/name"} pair, with the fused, reshaped
and transposed tensors marked; `mapping_rules()` (printed by --print-rules) states the same mapping as
general rules for any block count, layers_per_block and transformer depth.

"Extras" (on unless --no-extras) are tensors real single-file checkpoints carry that diffusers does not
load, added so a loader is tested on ignoring them: for LDM files (SD 1.x / 2.x) the DDPM schedule
buffers (betas, alphas_cumprod, ... as the LDM training code registers them, float32 [1000]) and, for
SD 1.x, cond_stage_model.transformer.text_model.embeddings.position_ids (int64 [1, 77]); for SDXL,
conditioner.embedders.1.model.logit_scale (scalar). Real SD 2.x files also hold a 24th OpenCLIP
resblock (index 23) and cond_stage_model.model.text_projection, both unused (diffusers' SD 2 text
encoder has 23 layers: it is the penultimate-layer output); this converter writes only the layers the
folder has.
"""

import argparse
import json
import math
import os
import sys
from types import SimpleNamespace

import torch
from safetensors import safe_open
from safetensors.torch import save_file

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
SD1_CLIP_PREFIX = "cond_stage_model.transformer."
SD2_OPENCLIP_PREFIX = "cond_stage_model.model."
SDXL_CLIP_PREFIX = "conditioner.embedders.0.transformer."
SDXL_OPENCLIP_PREFIX = "conditioner.embedders.1.model."

UNET_FIXED = {
    "time_embedding.linear_1": "time_embed.0",
    "time_embedding.linear_2": "time_embed.2",
    "conv_in": "input_blocks.0.0",
    "conv_norm_out": "out.0",
    "conv_out": "out.2",
    "add_embedding.linear_1": "label_emb.0.0",
    "add_embedding.linear_2": "label_emb.0.2",
}
UNET_RESNET = {
    "norm1": "in_layers.0",
    "conv1": "in_layers.2",
    "time_emb_proj": "emb_layers.1",
    "norm2": "out_layers.0",
    "conv2": "out_layers.3",
    "conv_shortcut": "skip_connection",
}
VAE_FIXED = {
    "encoder.conv_in": "encoder.conv_in",
    "encoder.conv_out": "encoder.conv_out",
    "encoder.conv_norm_out": "encoder.norm_out",
    "decoder.conv_in": "decoder.conv_in",
    "decoder.conv_out": "decoder.conv_out",
    "decoder.conv_norm_out": "decoder.norm_out",
    "quant_conv": "quant_conv",
    "post_quant_conv": "post_quant_conv",
}
VAE_ATTN = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
OPENCLIP_FIXED = {
    "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
    "text_model.embeddings.position_embedding.weight": "positional_embedding",
    "text_model.final_layer_norm.weight": "ln_final.weight",
    "text_model.final_layer_norm.bias": "ln_final.bias",
}
OPENCLIP_LAYER = {
    "layer_norm1": "ln_1",
    "layer_norm2": "ln_2",
    "mlp.fc1": "mlp.c_fc",
    "mlp.fc2": "mlp.c_proj",
    "self_attn.out_proj": "attn.out_proj",
}


def mapping_rules():
    """The key mapping as general rules (L = layers_per_block, n = number of VAE up blocks)."""
    return {
        "unet": {
            "prefix": UNET_PREFIX,
            "fixed_modules": UNET_FIXED,
            "resnet_renames": UNET_RESNET,
            "down": [
                "down_blocks.{b}.resnets.{l}.<resnet>      -> input_blocks.{1 + b*(L+1) + l}.0.<resnet renamed>",
                "down_blocks.{b}.attentions.{l}.<rest>     -> input_blocks.{1 + b*(L+1) + l}.1.<rest>",
                "down_blocks.{b}.downsamplers.0.conv.<p>   -> input_blocks.{1 + b*(L+1) + L}.0.op.<p>",
            ],
            "mid": [
                "mid_block.resnets.0.<resnet>   -> middle_block.0.<resnet renamed>",
                "mid_block.attentions.0.<rest>  -> middle_block.1.<rest>",
                "mid_block.resnets.1.<resnet>   -> middle_block.2.<resnet renamed>",
            ],
            "up": [
                "up_blocks.{b}.resnets.{l}.<resnet>     -> output_blocks.{b*(L+1) + l}.0.<resnet renamed>   (l = 0..L)",
                "up_blocks.{b}.attentions.{l}.<rest>    -> output_blocks.{b*(L+1) + l}.1.<rest>",
                "up_blocks.{b}.upsamplers.0.conv.<p>    -> output_blocks.{b*(L+1) + L}.{2 if up block b has attentions else 1}.conv.<p>",
            ],
            "note": "<rest> inside a Transformer2DModel is unchanged: norm, proj_in, proj_out, "
            "transformer_blocks.{k}.{norm1,norm2,norm3,attn1.to_q,...,attn2.to_out.0,ff.net.0.proj,ff.net.2}. "
            "proj_in/proj_out are 1x1 convs [C,C,1,1] when use_linear_projection is false (SD 1.x) and "
            "linear [C,C] when true (SD 2.x, SDXL); either way the tensor is stored as diffusers has it. "
            "SDXL's add_embedding (addition_embed_type text_time) is label_emb.0.{0,2}.",
        },
        "vae": {
            "prefix": VAE_PREFIX,
            "fixed_modules": VAE_FIXED,
            "resnet_renames": {"conv_shortcut": "nin_shortcut"},
            "encoder": [
                "encoder.down_blocks.{i}.resnets.{j}.<r>          -> encoder.down.{i}.block.{j}.<r>",
                "encoder.down_blocks.{i}.downsamplers.0.conv.<p>  -> encoder.down.{i}.downsample.conv.<p>",
                "encoder.mid_block.resnets.{j}.<r>                -> encoder.mid.block_{j+1}.<r>",
                "encoder.mid_block.attentions.0.<a>               -> encoder.mid.attn_1.<a renamed>",
            ],
            "decoder": [
                "decoder.up_blocks.{i}.resnets.{j}.<r>            -> decoder.up.{n-1-i}.block.{j}.<r>   (order reversed)",
                "decoder.up_blocks.{i}.upsamplers.0.conv.<p>      -> decoder.up.{n-1-i}.upsample.conv.<p>",
                "decoder.mid_block.resnets.{j}.<r>                -> decoder.mid.block_{j+1}.<r>",
                "decoder.mid_block.attentions.0.<a>               -> decoder.mid.attn_1.<a renamed>",
            ],
            "attention_renames": VAE_ATTN,
            "attention_reshape": "to_q/to_k/to_v/to_out.0 weights are linear [C,C] in diffusers and 1x1 "
            "convs [C,C,1,1] in the original file (biases unchanged). Older diffusers folders name them "
            "query/key/value/proj_attn.",
        },
        "clip_hf": {
            "prefix": {"sd1": SD1_CLIP_PREFIX, "sdxl_text_encoder": SDXL_CLIP_PREFIX},
            "rule": "text_model.<rest> -> <prefix>text_model.<rest> (names unchanged)",
        },
        "openclip": {
            "prefix": {"sd2": SD2_OPENCLIP_PREFIX, "sdxl_text_encoder_2": SDXL_OPENCLIP_PREFIX},
            "fixed": OPENCLIP_FIXED,
            "text_projection": "text_projection.weight [proj, hidden] -> text_projection [hidden, proj] "
            "(transposed; SDXL text_encoder_2 only)",
            "layer": "text_model.encoder.layers.{n}.<m> -> transformer.resblocks.{n}.<m renamed>",
            "layer_renames": OPENCLIP_LAYER,
            "fused_qkv": "self_attn.{q,k,v}_proj.weight [H,H] each -> attn.in_proj_weight [3H,H] "
            "(rows 0..H = q, H..2H = k, 2H..3H = v); the same for .bias -> attn.in_proj_bias [3H]",
        },
    }


# --------------------------------------------------------------------------------------------------
# reading a diffusers folder


def _weights_file(folder, comp, variant):
    names = ["model", "diffusion_pytorch_model"]
    suffix = f".{variant}.safetensors" if variant else ".safetensors"
    for n in names:
        p = os.path.join(folder, comp, n + suffix)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"no {suffix} weights in {os.path.join(folder, comp)}")


def read_component(folder, comp, variant=None):
    """State dict of one component, keys as diffusers / transformers name them. CLIPTextModel weights
    saved by transformers >= 5.6 lack the "text_model." prefix that every published checkpoint has;
    it is put back so both spellings map the same way."""
    out = {}
    with safe_open(_weights_file(folder, comp, variant), "pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
    if comp.startswith("text_encoder") and not any(k.startswith("text_model.") for k in out):
        out = {"text_model." + k: v for k, v in out.items()}
    return out


def read_config(folder, comp):
    name = "config.json"
    with open(os.path.join(folder, comp, name)) as f:
        return json.load(f)


# --------------------------------------------------------------------------------------------------
# diffusers -> original


def _resnet(rest, renames):
    head, _, tail = rest.partition(".")
    return renames.get(head, head) + "." + tail


def unet_key(dkey, cfg):
    """Original (LDM/SGM) name of a diffusers UNet2DConditionModel key, without the prefix."""
    module, _, param = dkey.rpartition(".")
    if module in UNET_FIXED:
        return UNET_FIXED[module] + "." + param
    L = cfg["layers_per_block"]
    p = dkey.split(".")
    if p[0] == "down_blocks":
        b, kind = int(p[1]), p[2]
        if kind == "resnets":
            return f"input_blocks.{1 + b * (L + 1) + int(p[3])}.0." + _resnet(".".join(p[4:]), UNET_RESNET)
        if kind == "attentions":
            return f"input_blocks.{1 + b * (L + 1) + int(p[3])}.1." + ".".join(p[4:])
        if kind == "downsamplers":  # down_blocks.b.downsamplers.0.conv.<p>
            return f"input_blocks.{1 + b * (L + 1) + L}.0.op." + param
    if p[0] == "mid_block":
        kind, j = p[1], int(p[2])
        rest = ".".join(p[3:])
        if kind == "resnets":
            return f"middle_block.{2 * j}." + _resnet(rest, UNET_RESNET)
        if kind == "attentions":
            return "middle_block.1." + rest
    if p[0] == "up_blocks":
        b, kind = int(p[1]), p[2]
        if kind == "resnets":
            return f"output_blocks.{b * (L + 1) + int(p[3])}.0." + _resnet(".".join(p[4:]), UNET_RESNET)
        if kind == "attentions":
            return f"output_blocks.{b * (L + 1) + int(p[3])}.1." + ".".join(p[4:])
        if kind == "upsamplers":
            has_attn = "CrossAttn" in cfg["up_block_types"][b]
            return f"output_blocks.{b * (L + 1) + L}.{2 if has_attn else 1}.conv." + param
    raise KeyError(f"unmapped UNet key {dkey}")


def vae_key(dkey, cfg):
    """(original name without prefix, needs 1x1-conv reshape) for a diffusers AutoencoderKL key."""
    module, _, param = dkey.rpartition(".")
    if module in VAE_FIXED:
        return VAE_FIXED[module] + "." + param, False
    n_up = len(cfg["up_block_types"])
    p = dkey.split(".")
    side = p[0]
    if p[1] == "down_blocks":
        i = int(p[2])
        if p[3] == "resnets":
            return f"{side}.down.{i}.block.{p[4]}." + _resnet(".".join(p[5:]), {"conv_shortcut": "nin_shortcut"}), False
        if p[3] == "downsamplers":
            return f"{side}.down.{i}.downsample.conv." + param, False
    if p[1] == "up_blocks":
        i = int(p[2])
        if p[3] == "resnets":
            return f"{side}.up.{n_up - 1 - i}.block.{p[4]}." + _resnet(".".join(p[5:]), {"conv_shortcut": "nin_shortcut"}), False
        if p[3] == "upsamplers":
            return f"{side}.up.{n_up - 1 - i}.upsample.conv." + param, False
    if p[1] == "mid_block":
        if p[2] == "resnets":
            return f"{side}.mid.block_{int(p[3]) + 1}." + _resnet(".".join(p[4:]), {"conv_shortcut": "nin_shortcut"}), False
        if p[2] == "attentions":
            rest = ".".join(p[4:])
            mod, _, prm = rest.rpartition(".")
            legacy = {"query": "q", "key": "k", "value": "v", "proj_attn": "proj_out"}
            mod = VAE_ATTN.get(mod, legacy.get(mod, mod))
            return f"{side}.mid.attn_1.{mod}.{prm}", prm == "weight" and mod in ("q", "k", "v", "proj_out")
    raise KeyError(f"unmapped VAE key {dkey}")


def openclip_entries(sd, prefix, comp):
    """Entries for an HF CLIPTextModel(WithProjection) state dict written in OpenCLIP layout."""
    entries = []
    for dk, ok in OPENCLIP_FIXED.items():
        entries.append({"original": prefix + ok, "diffusers": f"{comp}/{dk}", "tensor": sd[dk]})
    if "text_projection.weight" in sd:
        entries.append({"original": prefix + "text_projection", "diffusers": f"{comp}/text_projection.weight",
                        "transpose": True, "tensor": sd["text_projection.weight"].T.contiguous()})
    n_layers = 1 + max(int(k.split(".")[3]) for k in sd if k.startswith("text_model.encoder.layers."))
    for n in range(n_layers):
        src = f"text_model.encoder.layers.{n}."
        dst = f"{prefix}transformer.resblocks.{n}."
        for d_mod, o_mod in OPENCLIP_LAYER.items():
            for prm in ("weight", "bias"):
                entries.append({"original": dst + f"{o_mod}.{prm}", "diffusers": f"{comp}/{src}{d_mod}.{prm}",
                                "tensor": sd[src + f"{d_mod}.{prm}"]})
        for prm in ("weight", "bias"):
            parts = [sd[src + f"self_attn.{x}_proj.{prm}"] for x in "qkv"]
            h = parts[0].shape[0]
            entries.append({"original": dst + f"attn.in_proj_{prm}",
                            "diffusers": [f"{comp}/{src}self_attn.{x}_proj.{prm}" for x in "qkv"],
                            "rows": [[0, h], [h, 2 * h], [2 * h, 3 * h]], "tensor": torch.cat(parts, 0)})
    used = set(OPENCLIP_FIXED) | {"text_projection.weight"}
    used |= {k for k in sd if k.startswith("text_model.encoder.layers.")}
    left = sorted(k for k in sd if k not in used and not k.endswith("position_ids"))
    if left:
        raise KeyError(f"{comp}: keys the OpenCLIP layout has no place for: {left[:5]}")
    return entries


def ldm_schedule_buffers(beta_start=0.00085, beta_end=0.012, n=1000):
    """The DDPM buffers LatentDiffusion registers (ldm/models/diffusion/ddpm.py register_schedule,
    v_posterior 0, "linear" schedule = scaled_linear in diffusers' terms), as float32."""
    betas = torch.linspace(beta_start ** 0.5, beta_end ** 0.5, n, dtype=torch.float64) ** 2
    alphas = 1.0 - betas
    ac = torch.cumprod(alphas, 0)
    ac_prev = torch.cat([torch.ones(1, dtype=torch.float64), ac[:-1]])
    post_var = betas * (1.0 - ac_prev) / (1.0 - ac)
    bufs = {
        "betas": betas,
        "alphas_cumprod": ac,
        "alphas_cumprod_prev": ac_prev,
        "sqrt_alphas_cumprod": ac.sqrt(),
        "sqrt_one_minus_alphas_cumprod": (1.0 - ac).sqrt(),
        "log_one_minus_alphas_cumprod": (1.0 - ac).log(),
        "sqrt_recip_alphas_cumprod": (1.0 / ac).sqrt(),
        "sqrt_recipm1_alphas_cumprod": (1.0 / ac - 1).sqrt(),
        "posterior_variance": post_var,
        "posterior_log_variance_clipped": torch.log(torch.clamp(post_var, min=1e-20)),
        "posterior_mean_coef1": betas * ac_prev.sqrt() / (1.0 - ac),
        "posterior_mean_coef2": (1.0 - ac_prev) * alphas.sqrt() / (1.0 - ac),
    }
    return {k: v.float() for k, v in bufs.items()}


def detect_kind(folder, text_layout=None):
    with open(os.path.join(folder, "model_index.json")) as f:
        index = json.load(f)
    if "text_encoder_2" in index and index["text_encoder_2"][0] is not None:
        return "sdxl"
    if text_layout:
        return text_layout
    act = read_config(folder, "text_encoder").get("hidden_act")
    return "sd1" if act == "quick_gelu" else "sd2"


def convert(folder, variant=None, dtype=torch.float32, extras=True, text_layout=None):
    """All entries (dicts with original, diffusers, tensor and optional rows / reshape / transpose /
    note) for the folder, in a fixed order: UNet, VAE, text encoder(s), extras."""
    kind = detect_kind(folder, text_layout)
    entries = []
    ucfg = read_config(folder, "unet")
    for dk, t in read_component(folder, "unet", variant).items():
        entries.append({"original": UNET_PREFIX + unet_key(dk, ucfg), "diffusers": f"unet/{dk}", "tensor": t})
    vcfg = read_config(folder, "vae")
    for dk, t in read_component(folder, "vae", variant).items():
        ok, reshape = vae_key(dk, vcfg)
        e = {"original": VAE_PREFIX + ok, "diffusers": f"vae/{dk}", "tensor": t}
        if reshape and t.ndim == 2:
            e["tensor"] = t[:, :, None, None]
            e["reshape"] = list(e["tensor"].shape)
        entries.append(e)
    te = read_component(folder, "text_encoder", variant)
    if kind == "sd1":
        for dk, t in te.items():
            if dk.endswith("position_ids"):
                continue
            entries.append({"original": SD1_CLIP_PREFIX + dk, "diffusers": f"text_encoder/{dk}", "tensor": t})
    elif kind == "sd2":
        entries += openclip_entries(te, SD2_OPENCLIP_PREFIX, "text_encoder")
    else:
        for dk, t in te.items():
            if dk.endswith("position_ids"):
                continue
            entries.append({"original": SDXL_CLIP_PREFIX + dk, "diffusers": f"text_encoder/{dk}", "tensor": t})
        entries += openclip_entries(read_component(folder, "text_encoder_2", variant), SDXL_OPENCLIP_PREFIX,
                                    "text_encoder_2")
    for e in entries:
        if e["tensor"].is_floating_point():
            e["tensor"] = e["tensor"].to(dtype)
    if extras:
        note = "not used by diffusers; present in real single-file checkpoints"
        if kind in ("sd1", "sd2"):
            for k, v in ldm_schedule_buffers().items():
                entries.append({"original": k, "diffusers": None, "note": note + " (DDPM schedule buffer, float32)",
                                "tensor": v})
        if kind == "sd1":
            entries.append({"original": SD1_CLIP_PREFIX + "text_model.embeddings.position_ids", "diffusers": None,
                            "note": note + " (int64 buffer 0..76)", "tensor": torch.arange(77, dtype=torch.int64)[None]})
        if kind == "sdxl":
            entries.append({"original": SDXL_OPENCLIP_PREFIX + "logit_scale", "diffusers": None,
                            "note": note + " (OpenCLIP logit scale)", "tensor": torch.tensor(math.log(100.0)).to(dtype)})
    names = [e["original"] for e in entries]
    assert len(set(names)) == len(names), "duplicate original keys"
    return kind, entries


def write(entries, out_path):
    save_file({e["original"]: e["tensor"].contiguous() for e in entries}, out_path, metadata={"format": "pt"})


def keys_listing(kind, entries, out_name, dtype_name):
    rows = []
    for e in entries:
        r = {"original": e["original"], "diffusers": e["diffusers"], "shape": list(e["tensor"].shape)}
        for k in ("rows", "reshape", "transpose", "note"):
            if k in e:
                r[k] = e[k]
        rows.append(r)
    return {"file": out_name, "kind": kind, "dtype": dtype_name, "count": len(rows), "keys": rows}


# --------------------------------------------------------------------------------------------------
# verification with diffusers' own loader functions


def verify(out_path, folder, variant=None, dtype=torch.float32, text_layout=None):
    """Read `out_path` back, convert it with diffusers' single-file functions and compare every tensor
    with the folder's (cast to `dtype`). Returns the number of tensors compared."""
    from diffusers.loaders import single_file_utils as sfu

    kind = detect_kind(folder, text_layout)
    ckpt = {}
    with safe_open(out_path, "pt") as f:
        for k in f.keys():
            ckpt[k] = f.get_tensor(k)

    def same(name, got, want):
        want = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in want.items()
                if not k.endswith("position_ids")}
        got = {k: v for k, v in got.items() if not k.endswith("position_ids")}
        if set(got) != set(want):
            raise AssertionError(f"{name}: key sets differ: only converted {sorted(set(got) - set(want))[:5]}, "
                                 f"only folder {sorted(set(want) - set(got))[:5]}")
        for k in want:
            if got[k].shape != want[k].shape or not torch.equal(got[k], want[k]):
                raise AssertionError(f"{name}: tensor {k} differs")
        return len(want)

    n = 0
    n += same("unet", sfu.convert_ldm_unet_checkpoint(ckpt, read_config(folder, "unet")),
              read_component(folder, "unet", variant))
    n += same("vae", sfu.convert_ldm_vae_checkpoint(ckpt, read_config(folder, "vae")),
              read_component(folder, "vae", variant))
    te = read_component(folder, "text_encoder", variant)
    hidden = read_config(folder, "text_encoder")["hidden_size"]
    if kind == "sd1":
        n += same("text_encoder", sfu.convert_ldm_clip_checkpoint(ckpt), te)
    elif kind == "sd2":
        model = SimpleNamespace(config=SimpleNamespace(hidden_size=hidden))
        n += same("text_encoder", sfu.convert_open_clip_checkpoint(model, ckpt, prefix=SD2_OPENCLIP_PREFIX), te)
    else:
        n += same("text_encoder", sfu.convert_ldm_clip_checkpoint(ckpt), te)
        hidden2 = read_config(folder, "text_encoder_2")["hidden_size"]
        model = SimpleNamespace(config=SimpleNamespace(hidden_size=hidden2))
        n += same("text_encoder_2", sfu.convert_open_clip_checkpoint(model, ckpt, prefix=SDXL_OPENCLIP_PREFIX),
                  read_component(folder, "text_encoder_2", variant))
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32")
    ap.add_argument("--variant", default=None, help="read <name>.<variant>.safetensors weights")
    ap.add_argument("--keys-json", default=None)
    ap.add_argument("--text-layout", choices=["sd1", "sd2"], default=None)
    ap.add_argument("--no-extras", action="store_true")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--print-rules", action="store_true")
    args = ap.parse_args()
    if args.print_rules:
        print(json.dumps(mapping_rules(), indent=1))
        if not args.folder:
            return
    if not (args.folder and args.out):
        ap.error("FOLDER and OUT are required")
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    kind, entries = convert(args.folder, args.variant, dtype, not args.no_extras, args.text_layout)
    write(entries, args.out)
    if args.keys_json:
        with open(args.keys_json, "w") as f:
            json.dump(keys_listing(kind, entries, os.path.basename(args.out), args.dtype), f, indent=1)
    if not args.no_verify:
        n = verify(args.out, args.folder, args.variant, dtype, args.text_layout)
        print(f"{args.out}: {kind}, {len(entries)} tensors written, {n} verified equal after diffusers' conversion",
              file=sys.stderr)


if __name__ == "__main__":
    main()
