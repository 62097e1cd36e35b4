"""Tensor names and shapes of real Stable Diffusion single-file checkpoints, without weights.

Writes tests/fixtures/goldens/sd_checkpoint_layouts.json.gz: for SD 1.5, SD 2.1 and SDXL base,
  checkpoint    [name, dtype, shape] of every tensor the original (LDM / SGM) file holds
  unet, vae, text_encoder, text_encoder_2
                {name: shape} of the diffusers / transformers models those tensors load into
  *_config      the diffusers folder's config.json values (what the hub repositories ship)

The networks are built on torch's meta device from the configs below, so nothing is allocated.
The checkpoint names come from inverting diffusers' single-file conversion (the inverse of
diffusers/loaders/single_file_utils.py, as scripts/convert_diffusers_to_original_*.py do), and
the script then runs diffusers' own converters (convert_ldm_unet_checkpoint,
convert_ldm_vae_checkpoint, convert_ldm_clip_checkpoint, convert_open_clip_checkpoint) on them
and checks they give back exactly the models' tensors: the names are what diffusers reads.

  python3 tests/reference/make_sd_checkpoint_layouts.py
"""

import gzip
import json
import os

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.loaders import single_file_utils as sfu
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "goldens", "sd_checkpoint_layouts.json.gz"
)

VAE = {
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "in_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "out_channels": 3,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
}
SD_UNET = {
    "block_out_channels": [320, 640, 1280, 1280],
    "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
    "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
    "in_channels": 4,
    "out_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
}
CLIP_L = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "vocab_size": 49408,
    "hidden_act": "quick_gelu",
    "projection_dim": 768,
}

MODELS = {
    "sd15": {
        "unet": dict(SD_UNET, attention_head_dim=8, cross_attention_dim=768, sample_size=64),
        "vae": dict(VAE, sample_size=512, scaling_factor=0.18215),
        "text_encoder": dict(CLIP_L),
    },
    "sd21": {
        "unet": dict(
            SD_UNET,
            attention_head_dim=[5, 10, 20, 20],
            cross_attention_dim=1024,
            use_linear_projection=True,
            upcast_attention=True,
            sample_size=96,
        ),
        "vae": dict(VAE, sample_size=768, scaling_factor=0.18215),
        "text_encoder": {
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 23,
            "num_attention_heads": 16,
            "max_position_embeddings": 77,
            "vocab_size": 49408,
            "hidden_act": "gelu",
            "projection_dim": 512,
        },
    },
    "sdxl": {
        "unet": {
            "addition_embed_type": "text_time",
            "addition_embed_type_num_heads": 64,
            "addition_time_embed_dim": 256,
            "attention_head_dim": [5, 10, 20],
            "block_out_channels": [320, 640, 1280],
            "cross_attention_dim": 2048,
            "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
            "in_channels": 4,
            "layers_per_block": 2,
            "norm_num_groups": 32,
            "out_channels": 4,
            "projection_class_embeddings_input_dim": 2816,
            "sample_size": 128,
            "transformer_layers_per_block": [1, 2, 10],
            "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
            "use_linear_projection": True,
        },
        "vae": dict(VAE, sample_size=1024, scaling_factor=0.13025, force_upcast=True),
        "text_encoder": dict(CLIP_L),
        "text_encoder_2": {
            "hidden_size": 1280,
            "intermediate_size": 5120,
            "num_hidden_layers": 32,
            "num_attention_heads": 20,
            "max_position_embeddings": 77,
            "vocab_size": 49408,
            "hidden_act": "gelu",
            "projection_dim": 1280,
        },
    },
}


def unet_to_ldm(name, config):
    """A diffusers UNet2DConditionModel tensor name → the original `model.diffusion_model.` one."""
    per = config["layers_per_block"] + 1
    levels = len(config["block_out_channels"])
    resnet = [
        ("norm1", "in_layers.0"),
        ("conv1", "in_layers.2"),
        ("norm2", "out_layers.0"),
        ("conv2", "out_layers.3"),
        ("time_emb_proj", "emb_layers.1"),
        ("conv_shortcut", "skip_connection"),
    ]
    fixed = {
        "time_embedding.linear_1": "time_embed.0",
        "time_embedding.linear_2": "time_embed.2",
        "add_embedding.linear_1": "label_emb.0.0",
        "add_embedding.linear_2": "label_emb.0.2",
        "conv_in": "input_blocks.0.0",
        "conv_norm_out": "out.0",
        "conv_out": "out.2",
    }
    for old, new in fixed.items():
        if name.startswith(old + "."):
            return new + name[len(old) :]
    parts = name.split(".")

    def res(rest):
        for old, new in resnet:
            if rest.startswith(old + "."):
                return new + rest[len(old) :]
        raise ValueError(name)

    if parts[0] == "down_blocks":
        b, kind = int(parts[1]), parts[2]
        if kind == "downsamplers":
            return f"input_blocks.{(b + 1) * per}.0.op." + ".".join(parts[5:])
        j, rest = int(parts[3]), ".".join(parts[4:])
        index = b * per + j + 1
        return f"input_blocks.{index}.0." + res(rest) if kind == "resnets" else f"input_blocks.{index}.1." + rest
    if parts[0] == "mid_block":
        j, rest = int(parts[2]), ".".join(parts[3:])
        if parts[1] == "resnets":
            return f"middle_block.{2 * j}." + res(rest)
        return "middle_block.1." + rest
    if parts[0] == "up_blocks":
        b, kind = int(parts[1]), parts[2]
        if kind == "upsamplers":
            has_attention = config["up_block_types"][b].startswith("CrossAttn")
            return f"output_blocks.{b * per + per - 1}.{2 if has_attention else 1}." + ".".join(parts[4:])
        j, rest = int(parts[3]), ".".join(parts[4:])
        index = b * per + j
        return f"output_blocks.{index}.0." + res(rest) if kind == "resnets" else f"output_blocks.{index}.1." + rest
    raise ValueError(f"unmapped UNet tensor {name} ({levels} levels)")


def vae_to_ldm(name, shape, config):
    """A diffusers AutoencoderKL tensor name → the original `first_stage_model.` one (and shape)."""
    levels = len(config["block_out_channels"])
    name = name.replace("conv_shortcut", "nin_shortcut").replace("conv_norm_out", "norm_out")
    parts = name.split(".")
    if parts[1] == "down_blocks":
        i = parts[2]
        if parts[3] == "downsamplers":
            return f"encoder.down.{i}.downsample." + ".".join(parts[5:]), shape
        return f"encoder.down.{i}.block." + ".".join(parts[4:]), shape
    if parts[1] == "up_blocks":
        i = levels - 1 - int(parts[2])
        if parts[3] == "upsamplers":
            return f"decoder.up.{i}.upsample." + ".".join(parts[5:]), shape
        return f"decoder.up.{i}.block." + ".".join(parts[4:]), shape
    if parts[1] == "mid_block":
        if parts[2] == "resnets":
            return f"{parts[0]}.mid.block_{int(parts[3]) + 1}." + ".".join(parts[4:]), shape
        layer = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out": "proj_out"}[parts[4]]
        tail = parts[-1]
        conv = shape + [1, 1] if len(shape) == 2 else shape
        return f"{parts[0]}.mid.attn_1.{layer}.{tail}", conv if layer != "norm" else shape
    return name, shape


def open_clip_to_ldm(name, shape, prefix, layers):
    """transformers CLIP text tensors → OpenCLIP ones; q/k/v fused into in_proj."""
    fixed = {
        "text_model.embeddings.position_embedding.weight": "positional_embedding",
        "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
        "text_model.final_layer_norm.weight": "ln_final.weight",
        "text_model.final_layer_norm.bias": "ln_final.bias",
    }
    if name in fixed:
        return [(prefix + fixed[name], shape)]
    if name == "text_projection.weight":
        return [(prefix + "text_projection", [shape[1], shape[0]])]
    assert name.startswith("text_model.encoder.layers."), name
    rest = name[len("text_model.encoder.layers.") :]
    layer, rest = rest.split(".", 1)
    base = f"{prefix}transformer.resblocks.{layer}."
    if rest.startswith("self_attn.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
        if rest.startswith("self_attn.q_proj"):
            kind = rest.split(".")[-1]
            return [(base + f"attn.in_proj_{kind}", [shape[0] * 3] + shape[1:])]
        return []
    for old, new in [
        ("self_attn.out_proj", "attn.out_proj"),
        ("layer_norm1", "ln_1"),
        ("layer_norm2", "ln_2"),
        ("mlp.fc1", "mlp.c_fc"),
        ("mlp.fc2", "mlp.c_proj"),
    ]:
        if rest.startswith(old):
            return [(base + new + rest[len(old) :], shape)]
    raise ValueError(name)


def shapes(model, with_text_model_prefix=False):
    out = {}
    for name, tensor in model.state_dict().items():
        if with_text_model_prefix and not name.startswith(("text_model.", "text_projection")):
            name = "text_model." + name
        out[name] = list(tensor.shape)
    return out


def meta(*shape):
    return torch.empty(shape, device="meta")


def build(kind, spec):
    with torch.device("meta"):
        unet = UNet2DConditionModel(**spec["unet"])
        vae = AutoencoderKL(**spec["vae"])
        text_configs = {k: CLIPTextConfig(**spec[k]) for k in ("text_encoder", "text_encoder_2") if k in spec}
        texts = {
            "text_encoder": CLIPTextModel(text_configs["text_encoder"]),
        }
        if "text_encoder_2" in text_configs:
            texts["text_encoder_2"] = CLIPTextModelWithProjection(text_configs["text_encoder_2"])
    models = {
        "unet": shapes(unet),
        "vae": shapes(vae),
    }
    for k, m in texts.items():
        models[k] = shapes(m, with_text_model_prefix=True)

    checkpoint = {}  # name → (dtype, shape)
    for name, shape in models["unet"].items():
        checkpoint["model.diffusion_model." + unet_to_ldm(name, spec["unet"])] = ("F16", shape)
    for name, shape in models["vae"].items():
        ldm, ldm_shape = vae_to_ldm(name, shape, spec["vae"])
        checkpoint["first_stage_model." + ldm] = ("F16", ldm_shape)
    if kind == "sd21":
        prefix = "cond_stage_model.model."
        for name, shape in models["text_encoder"].items():
            for ldm, s in open_clip_to_ldm(name, shape, prefix, 23):
                checkpoint[ldm] = ("F16", s)
        # The file holds all 24 OpenCLIP blocks and its projection; diffusers keeps 23 blocks.
        for name, shape in list(checkpoint.items()):
            if ".resblocks.22." in name:
                checkpoint[name.replace(".resblocks.22.", ".resblocks.23.")] = shape
        checkpoint[prefix + "text_projection"] = ("F16", [1024, 1024])
        checkpoint[prefix + "logit_scale"] = ("F16", [])
    else:
        te_prefix = "cond_stage_model.transformer." if kind == "sd15" else "conditioner.embedders.0.transformer."
        for name, shape in models["text_encoder"].items():
            checkpoint[te_prefix + name] = ("F16", shape)
        checkpoint[te_prefix + "text_model.embeddings.position_ids"] = ("I64", [1, 77])
    if kind == "sdxl":
        prefix = "conditioner.embedders.1.model."
        for name, shape in models["text_encoder_2"].items():
            for ldm, s in open_clip_to_ldm(name, shape, prefix, 32):
                checkpoint[ldm] = ("F16", s)
        checkpoint[prefix + "logit_scale"] = ("F16", [])
    else:
        for extra in ["alphas_cumprod", "betas", "sqrt_alphas_cumprod"]:
            checkpoint[extra] = ("F32", [1000])
        checkpoint["model_ema.decay"] = ("F32", [])
        checkpoint["model_ema.num_updates"] = ("I32", [])

    verify(kind, spec, checkpoint, models, texts)
    return {
        "checkpoint": [[n, d, s] for n, (d, s) in sorted(checkpoint.items())],
        **models,
        **{f"{k}_config": v for k, v in spec.items()},
    }


def verify(kind, spec, checkpoint, models, texts):
    """diffusers' own single-file converters must turn the names back into the models' tensors."""
    state = {n: meta(*s) for n, (_, s) in checkpoint.items()}
    unet_config = dict(spec["unet"])
    got = sfu.convert_ldm_unet_checkpoint(state, unet_config)
    check(kind, "unet", got, models["unet"])
    got = sfu.convert_ldm_vae_checkpoint(state, spec["vae"])
    check(kind, "vae", got, models["vae"])
    if kind == "sd21":
        got = sfu.convert_open_clip_checkpoint(texts["text_encoder"], state, prefix="cond_stage_model.model.")
        # diffusers' CLIPTextModel ignores the file's 24th block on loading (strict=False).
        got = {k: v for k, v in got.items() if ".layers.23." not in k}
    else:
        got = sfu.convert_ldm_clip_checkpoint(state)
        got = {k: v for k, v in got.items() if not k.endswith("position_ids")}
    check(kind, "text_encoder", got, models["text_encoder"])
    if kind == "sdxl":
        got = sfu.convert_open_clip_checkpoint(
            texts["text_encoder_2"], state, prefix="conditioner.embedders.1.model."
        )
        check(kind, "text_encoder_2", got, models["text_encoder_2"])


def check(kind, part, got, expected):
    got = {k: list(v.shape) for k, v in got.items()}
    if got != expected:
        missing = sorted(set(expected) - set(got))[:5]
        extra = sorted(set(got) - set(expected))[:5]
        wrong = [k for k in expected if k in got and got[k] != expected[k]][:5]
        raise SystemExit(f"{kind} {part}: missing {missing}, extra {extra}, shapes differ {wrong}")
    print(f"{kind} {part}: {len(got)} tensors round-trip through diffusers' converter")


def main():
    fixture = {kind: build(kind, spec) for kind, spec in MODELS.items()}
    text = json.dumps(fixture, separators=(",", ":"), sort_keys=True).encode()
    # mtime 0 and no file name: the same fixture gives the same bytes.
    with open(OUT, "wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as f:
        f.write(text)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
