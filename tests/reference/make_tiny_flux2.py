#!/usr/bin/env python3
"""Build a tiny random FLUX.2 [klein] pipeline (diffusers folder layout) and golden outputs from
diffusers, for testing Backpack's FLUX.2 path without downloading a real model.

What it makes (no arguments; CPU only, no network; needs torch, transformers 5, diffusers 0.42,
Pillow, safetensors, numpy):

    tests/fixtures/models/tiny-flux2/
        model_index.json            FLUX.2-klein-4B's, verbatim (Flux2KleinPipeline, is_distilled)
        scheduler/                  FLUX.2-klein-4B's scheduler_config.json, verbatim (dynamic,
                                    exponential shift)
        text_encoder/               Qwen3ForCausalLM ("model." prefix, tied embeddings): hidden
                                    16, 28 layers (the pipeline stacks layers 9, 18 and 27),
                                    2 heads of 8 over 1 KV head
        tokenizer/                  tiny-qwen3's tokenizer.json (448-entry byte BPE + the three
                                    Qwen specials), FLUX.2-klein-4B's chat_template.jinja verbatim
                                    in its own file, pad token <|endoftext|>
        transformer/                Flux2Transformer2DModel: 3 heads of 16 (an odd head count),
                                    axes_dims_rope [4, 4, 4, 4], 2 double- and 3 single-stream
                                    blocks, mlp_ratio 3, 24 packed channels (6 latent channels),
                                    caption width 48 (3 × 16), 32 time channels
        vae/                        AutoencoderKLFlux2: 6 latent channels, 3 levels (1/4 latents),
                                    quant convs, batch-norm statistics drawn at random,
                                    sample_size 32 (the default image size)
    tests/fixtures/goldens/
        tiny-flux2.safetensors      float32 tensors in diffusers' layouts (NCHW; images from
                                    output_type="np" are NHWC floats in 0..1)
        tiny-flux2.json             what each golden is, the image cases, and the sigma tables
                                    under the pipeline's empirical mu
        tiny-flux2-reference.png    the reference picture of the reference-image case
    tests/fixtures/models/tiny-flux2-original.safetensors   the same transformer in Black Forest
                                    Labs' original key layout (fused qkv, linear1/linear2, the
                                    final layer's shift before its scale, the
                                    "model.diffusion_model." prefix), as ComfyUI's single files have
                                    it; checked by converting it back with diffusers' own converter
    tests/reference/configs/flux2-klein-4b/   FLUX.2-klein-4B's published configs with the tiny
                                    tokenizer, for benchmarks at the real shapes with random
                                    weights (backpack bench-image, bench_flux2_diffusers.py)

The guided case runs the same weights with `is_distilled` false (FLUX.2-klein-base's index);
the test swaps in that model_index.json. Weights are stored in bfloat16 as published (the
goldens are computed in float32 from those values), drawn from a seeded generator: matrices
N(0, 1/fan_in), norm scales 1 + 0.1 N, everything else 0.1 N.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Transformer2DModel,
)
from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
GOLDENS = ROOT / "tests" / "fixtures" / "goldens"
CORPUS = ROOT / "tests" / "conformance" / "models"
KLEIN = CORPUS / "black-forest-labs--FLUX.2-klein-4B"
NAME = "tiny-flux2"


def randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            n = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * n)
            elif p.ndim >= 2:
                p.copy_(n / p[0].numel() ** 0.5)
            else:
                p.copy_(0.1 * n)


def text_encoder():
    config = Qwen3Config(
        vocab_size=451, hidden_size=16, intermediate_size=32, num_hidden_layers=28,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=1024,
        rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True,
        bos_token_id=448, eos_token_id=450,
    )
    model = Qwen3ForCausalLM(config)
    randomize(model, 1)
    return model.eval()


def transformer():
    model = Flux2Transformer2DModel(
        patch_size=1, in_channels=24, num_layers=2, num_single_layers=3, attention_head_dim=16,
        num_attention_heads=3, joint_attention_dim=48, timestep_guidance_channels=32, mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 4, 4), rope_theta=2000, eps=1e-6, guidance_embeds=False,
    )
    randomize(model, 2)
    return model.eval()


def vae():
    model = AutoencoderKLFlux2(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(16, 32, 32), layers_per_block=1,
        latent_channels=6, norm_num_groups=8, patch_size=(2, 2), batch_norm_eps=1e-4, sample_size=32,
    )
    randomize(model, 3)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        model.bn.running_mean.copy_(0.3 * torch.randn(model.bn.running_mean.shape, generator=g))
        model.bn.running_var.copy_(0.5 + torch.rand(model.bn.running_var.shape, generator=g))
    return model.eval()


def tokenizer(folder):
    folder.mkdir(parents=True, exist_ok=True)
    tiny = MODELS / "tiny-qwen3"
    shutil.copy(tiny / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    config["model_max_length"] = 1024
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy(KLEIN / "tokenizer" / "chat_template.jinja", folder / "chat_template.jinja")
    return AutoTokenizer.from_pretrained(folder)


def build(folder):
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    text_encoder().to(torch.bfloat16).save_pretrained(folder / "text_encoder")
    transformer().to(torch.bfloat16).save_pretrained(folder / "transformer")
    vae().to(torch.bfloat16).save_pretrained(folder / "vae")
    tokenizer(folder / "tokenizer")
    (folder / "scheduler").mkdir()
    shutil.copy(KLEIN / "scheduler" / "scheduler_config.json", folder / "scheduler" / "scheduler_config.json")
    shutil.copy(KLEIN / "model_index.json", folder / "model_index.json")


def bench_config():
    """The real shapes for benchmarks: every published config, the tiny tokenizer."""
    folder = ROOT / "tests" / "reference" / "configs" / "flux2-klein-4b"
    if folder.exists():
        shutil.rmtree(folder)
    for rel in ["model_index.json", "scheduler/scheduler_config.json", "transformer/config.json",
                "vae/config.json", "text_encoder/config.json", "text_encoder/generation_config.json"]:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(KLEIN / rel, folder / rel)
    tokenizer(folder / "tokenizer")


def original_layout(folder):
    """The transformer in Black Forest Labs' original key layout (ComfyUI's single files): the
    inverse of diffusers' convert_flux2_transformer_checkpoint_to_diffusers, verified through it."""
    from safetensors.torch import load_file
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    ours = load_file(folder / "transformer" / "diffusion_pytorch_model.safetensors")
    renames = {
        "x_embedder.": "img_in.", "context_embedder.": "txt_in.",
        "time_guidance_embed.timestep_embedder.linear_1.": "time_in.in_layer.",
        "time_guidance_embed.timestep_embedder.linear_2.": "time_in.out_layer.",
        "double_stream_modulation_img.linear.": "double_stream_modulation_img.lin.",
        "double_stream_modulation_txt.linear.": "double_stream_modulation_txt.lin.",
        "single_stream_modulation.linear.": "single_stream_modulation.lin.",
        "proj_out.": "final_layer.linear.",
    }
    double = {
        "attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
        "attn.to_out.0.weight": "img_attn.proj.weight", "ff.linear_in.weight": "img_mlp.0.weight",
        "ff.linear_out.weight": "img_mlp.2.weight", "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
        "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale", "attn.to_add_out.weight": "txt_attn.proj.weight",
        "ff_context.linear_in.weight": "txt_mlp.0.weight", "ff_context.linear_out.weight": "txt_mlp.2.weight",
    }
    single = {
        "attn.to_qkv_mlp_proj.weight": "linear1.weight", "attn.to_out.weight": "linear2.weight",
        "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale",
    }
    out = {}
    for name, t in ours.items():
        parts = name.split(".")
        if name.startswith("transformer_blocks."):
            block, rest = parts[1], ".".join(parts[2:])
            if rest in ("attn.to_q.weight", "attn.add_q_proj.weight"):
                stream = "img" if rest == "attn.to_q.weight" else "txt"
                names = ["to_q", "to_k", "to_v"] if stream == "img" else ["add_q_proj", "add_k_proj", "add_v_proj"]
                qkv = torch.cat([ours[f"transformer_blocks.{block}.attn.{n}.weight"] for n in names], dim=0)
                out[f"double_blocks.{block}.{stream}_attn.qkv.weight"] = qkv
            elif rest in double:
                out[f"double_blocks.{block}.{double[rest]}"] = t
            continue
        if name.startswith("single_transformer_blocks."):
            out[f"single_blocks.{parts[1]}.{single['.'.join(parts[2:])]}"] = t
            continue
        if name == "norm_out.linear.weight":
            scale, shift = t.chunk(2, dim=0)
            out["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale], dim=0)
            continue
        key = name
        for a, b in renames.items():
            key = key.replace(a, b)
        out[key] = t
    out = {"model.diffusion_model." + k: v.contiguous() for k, v in out.items()}
    plain = {k[len("model.diffusion_model."):]: v for k, v in out.items()}
    back = convert_flux2_transformer_checkpoint_to_diffusers(dict(plain))
    assert back.keys() == ours.keys(), set(back) ^ set(ours)
    assert all(torch.equal(back[k], ours[k]) for k in ours), "the converter reads it back unchanged"
    save_file(out, MODELS / f"{NAME}-original.safetensors", metadata={"format": "pt"})


CASES = [
    {"name": "distilled_2_steps", "prompt": "a red fox in the snow, watercolour", "steps": 2,
     "guidance": 1.0, "width": 48, "height": 32, "seed": 11, "base": False},
    {"name": "one_step", "prompt": "東京の夜景 🌃", "steps": 1, "guidance": 1.0, "width": 32,
     "height": 40, "seed": 13, "base": False},
    {"name": "base_guided_2_steps", "prompt": "A lighthouse at dusk", "steps": 2, "guidance": 3.5,
     "width": 40, "height": 32, "seed": 12, "base": True},
]


def reference_case(pipe, g):
    """A start image as the pipeline's `image`: a reference whose tokens join at t = 10 (the
    pipeline takes images of at least 64 pixels a side)."""
    h, w = 64, 72
    ys, xs = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    rgb = np.stack([xs, ys, 0.5 + 0.4 * np.sin(6 * xs * ys)], axis=-1)
    picture = Image.fromarray((rgb * 255).round().astype(np.uint8))
    picture.save(GOLDENS / f"{NAME}-reference.png")
    g["reference.pixels"] = torch.from_numpy(np.asarray(picture).astype(np.float32) / 255.0)
    gen = torch.Generator().manual_seed(31)
    start = torch.randn((1, 24, h // 8, w // 8), generator=gen)
    prompt = "the same scene at night"
    with torch.no_grad():
        image = pipe(prompt=prompt, image=picture, height=h, width=w, num_inference_steps=2,
                     guidance_scale=1.0, latents=start.clone(), output_type="np").images
    g["reference.latents"] = start
    g["reference.image"] = torch.from_numpy(np.ascontiguousarray(image)).float()
    return {"prompt": prompt, "steps": 2, "guidance": 1.0, "width": w, "height": h, "image": f"tests/fixtures/goldens/{NAME}-reference.png"}


def sigma_tables():
    config = json.loads((KLEIN / "scheduler" / "scheduler_config.json").read_text())
    sched = FlowMatchEulerDiscreteScheduler.from_config(config)
    out = []
    for steps in (1, 2, 4, 28):
        for tokens in (20, 1024, 4096, 6000):
            mu = compute_empirical_mu(tokens, steps)
            sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
            out.append({"steps": steps, "tokens": tokens, "mu": mu, "sigmas": sched.sigmas.tolist()})
    return out


def main():
    torch.manual_seed(0)
    folder = MODELS / NAME
    build(folder)
    original_layout(folder)
    bench_config()
    GOLDENS.mkdir(parents=True, exist_ok=True)
    pipe = Flux2KleinPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    base = Flux2KleinPipeline(**pipe.components, is_distilled=False)
    base.set_progress_bar_config(disable=True)
    g = {}
    info = {"folder": f"tests/fixtures/models/{NAME}", "golden": f"tests/fixtures/goldens/{NAME}.safetensors",
            "base_model_index": "tests/conformance/models/black-forest-labs--FLUX.2-klein-base-4B/model_index.json",
            "made_by": "tests/reference/make_tiny_flux2.py with diffusers 0.42.0, transformers 5, torch (CPU, float32)"}

    # Captions: hidden_states 9, 18 and 27 side by side over the padded, templated prompt.
    prompt = CASES[0]["prompt"]
    text = pipe.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                              add_generation_prompt=True, enable_thinking=False)
    ids = pipe.tokenizer(text).input_ids
    caption, _ = pipe.encode_prompt(prompt)
    g["prompt.ids"] = torch.tensor(ids, dtype=torch.float32)
    g["caption"] = caption[0].float().contiguous()
    info["caption"] = {"prompt": prompt, "rendered": text}

    # One transformer call at two sigmas on a packed 4×5 latent.
    gen = torch.Generator().manual_seed(5)
    latents = torch.randn((1, 24, 4, 5), generator=gen)
    packed = pipe._pack_latents(latents)
    latent_ids = pipe._prepare_latent_ids(latents)
    text_ids = pipe._prepare_text_ids(caption)
    g["transformer.latents"] = latents
    for label, sigma in (("s0", 0.8), ("s1", 0.3)):
        t = torch.tensor([sigma * 1000.0])
        with torch.no_grad():
            out = pipe.transformer(hidden_states=packed, timestep=t / 1000, guidance=None,
                                   encoder_hidden_states=caption, txt_ids=text_ids, img_ids=latent_ids,
                                   return_dict=False)[0]
        out = pipe._unpack_latents_with_ids(out, latent_ids, 4, 5)
        g[f"transformer.out.{label}"] = out.float().contiguous()
    info["transformer"] = {"sigmas": {"s0": 0.8, "s1": 0.3}, "latents": "transformer.latents"}

    # The VAE decoder on a packed latent as the transformer sees it.
    vae_latents = torch.randn((1, 24, 3, 4), generator=gen)
    bn_mean = pipe.vae.bn.running_mean.view(1, -1, 1, 1)
    bn_std = torch.sqrt(pipe.vae.bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps)
    with torch.no_grad():
        image = pipe.vae.decode(pipe._unpatchify_latents(vae_latents * bn_std + bn_mean)).sample
    g["vae.latents"] = vae_latents
    g["vae.image"] = image.float().contiguous()

    # Whole images from given latents.
    for case in CASES:
        gen = torch.Generator().manual_seed(case["seed"])
        start = torch.randn((1, 24, case["height"] // 8, case["width"] // 8), generator=gen)
        runner = base if case["base"] else pipe
        with torch.no_grad():
            result = runner(prompt=case["prompt"], height=case["height"], width=case["width"],
                            num_inference_steps=case["steps"], guidance_scale=case["guidance"],
                            latents=start.clone(), output_type="np").images
        g[f"{case['name']}.latents"] = start
        g[f"{case['name']}.image"] = torch.from_numpy(np.ascontiguousarray(result)).float()
    info["cases"] = CASES
    info["reference"] = reference_case(pipe, g)
    info["schedulers"] = sigma_tables()

    save_file({k: v.contiguous() for k, v in g.items()}, GOLDENS / f"{NAME}.safetensors", metadata={"format": "pt"})
    (GOLDENS / f"{NAME}.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n")
    print("wrote", folder, "and", GOLDENS / f"{NAME}.safetensors")


if __name__ == "__main__":
    main()
