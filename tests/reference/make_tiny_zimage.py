#!/usr/bin/env python3
"""Build a tiny random Z-Image pipeline (diffusers folder layout) and golden outputs from
diffusers, for testing Backpack's diffusion-transformer path without downloading a real model.

What it makes (no arguments; CPU only, no network; needs torch, transformers 5, diffusers 0.42,
Pillow, safetensors, numpy):

    tests/fixtures/models/tiny-zimage/
        model_index.json            ZImagePipeline; the text encoder as Qwen3Model, as published
        scheduler/                  Z-Image-Turbo's scheduler_config.json, verbatim (shift 3.0)
        text_encoder/               Qwen3Model (no "model." prefix, tied embeddings): hidden 48,
                                    3 layers, 4 heads over 2 KV heads of 16
        tokenizer/                  tiny-qwen3's tokenizer.json (448-entry byte BPE + the three
                                    Qwen specials); tokenizer_config.json carries Z-Image-Turbo's
                                    published chat template (with enable_thinking) verbatim
        transformer/                ZImageTransformer2DModel: dim 96, 3 heads of 32 (an odd head
                                    count), axes_dims [8, 12, 12], 2 refiner and 2 main layers,
                                    8 latent channels, caption width 48
        vae/                        AutoencoderKL, 8 latent channels, 3 levels (1/4 latents),
                                    scaling 0.3611 and shift 0.1159 (the Flux VAE's), no quant convs
        tiny-zimage-original.safetensors   the same transformer in the model's original key layout
                                    (fused attention.qkv, x_embedder, final_layer, the
                                    "model.diffusion_model." prefix), as ComfyUI's files and
                                    the Z-Image repository have it; checked by converting it back
                                    with diffusers' own single-file converter
    tests/reference/configs/z-image-turbo/   Z-Image-Turbo's published configs with the tiny
                                    tokenizer, for benchmarks at the real shapes with random
                                    weights (backpack bench-image, bench_zimage_diffusers.py)
    tests/fixtures/goldens/
        tiny-zimage.safetensors     float32 tensors in diffusers' layouts (NCHW; images from
                                    output_type="np" are NHWC floats in 0..1)
        tiny-zimage.json            what each golden is, the image cases, and the flow-matching
                                    sigma tables (static shift and dynamic, exponential shift)

Weights are stored in bfloat16 as published (the goldens are computed in float32 from those
values). They are drawn from a seeded generator: matrices N(0, 1/fan_in), norm scales 1 + 0.1 N, biases
and the padding tokens 0.05 N and 0.5 N, so that no modulation or gate is left at its zero init.
Image sizes are chosen so that the patch grid is not a multiple of 32 (the image's padding
tokens are exercised) and captions pad too.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    ZImageImg2ImgPipeline,
    ZImagePipeline,
    ZImageTransformer2DModel,
)
from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
GOLDENS = ROOT / "tests" / "fixtures" / "goldens"
CORPUS = ROOT / "tests" / "conformance" / "models"
NAME = "tiny-zimage"


def randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            n = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * n)
            elif name.endswith("bias"):
                p.copy_(0.05 * n)
            elif "pad_token" in name:
                p.copy_(0.5 * n)
            elif p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(n / fan_in**0.5)
            else:
                p.copy_(0.1 * n)


def text_encoder():
    config = Qwen3Config(
        vocab_size=451,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=448,
        eos_token_id=450,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    model = Qwen3Model(config)
    randomize(model, 1)
    return model.eval()


def transformer():
    model = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=8,
        dim=96,
        n_layers=2,
        n_refiner_layers=2,
        n_heads=3,
        n_kv_heads=3,
        norm_eps=1e-5,
        qk_norm=True,
        cap_feat_dim=48,
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=[8, 12, 12],
        axes_lens=[512, 64, 64],
    )
    randomize(model, 2)
    return model.eval()


def vae():
    model = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 32),
        layers_per_block=1,
        latent_channels=8,
        norm_num_groups=8,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    randomize(model, 3)
    return model.eval()


def tokenizer(folder):
    folder.mkdir(parents=True, exist_ok=True)
    tiny = MODELS / "tiny-qwen3"
    shutil.copy(tiny / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    published = json.loads((CORPUS / "Tongyi-MAI--Z-Image-Turbo/tokenizer/tokenizer_config.json").read_text())
    config["chat_template"] = published["chat_template"]
    config["model_max_length"] = 1024
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return AutoTokenizer.from_pretrained(folder)


def build(folder):
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    # Stored in bfloat16, as the published weights are; the goldens come from these files.
    text_encoder().to(torch.bfloat16).save_pretrained(folder / "text_encoder")
    transformer().to(torch.bfloat16).save_pretrained(folder / "transformer")
    vae().to(torch.bfloat16).save_pretrained(folder / "vae")
    tokenizer(folder / "tokenizer")
    (folder / "scheduler").mkdir()
    shutil.copy(
        CORPUS / "Tongyi-MAI--Z-Image-Turbo/scheduler/scheduler_config.json",
        folder / "scheduler" / "scheduler_config.json",
    )
    shutil.copy(CORPUS / "Tongyi-MAI--Z-Image-Turbo/model_index.json", folder / "model_index.json")


def bench_config():
    """The real shapes for benchmarks: every published config, the tiny tokenizer."""
    folder = ROOT / "tests" / "reference" / "configs" / "z-image-turbo"
    if folder.exists():
        shutil.rmtree(folder)
    published = CORPUS / "Tongyi-MAI--Z-Image-Turbo"
    for rel in ["model_index.json", "scheduler/scheduler_config.json", "transformer/config.json",
                "vae/config.json", "text_encoder/config.json", "text_encoder/generation_config.json"]:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(published / rel, folder / rel)
    tokenizer(folder / "tokenizer")


def original_layout(folder):
    """The transformer in the original key layout: the inverse of diffusers'
    convert_z_image_transformer_checkpoint_to_diffusers, verified through it."""
    from safetensors.torch import load_file
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers

    ours = load_file(folder / "transformer" / "diffusion_pytorch_model.safetensors")
    out = {}
    for name, t in ours.items():
        if any(f".attention.to_{x}.weight" in name for x in "kv"):
            continue
        key = name.replace("all_final_layer.2-1.", "final_layer.").replace("all_x_embedder.2-1.", "x_embedder.")
        key = key.replace(".attention.to_out.0.", ".attention.out.")
        key = key.replace(".attention.norm_k.", ".attention.k_norm.").replace(".attention.norm_q.", ".attention.q_norm.")
        if ".attention.to_q.weight" in name:
            k, v = (ours[name.replace("to_q", w)] for w in ("to_k", "to_v"))
            key = key.replace(".attention.to_q.weight", ".attention.qkv.weight")
            t = torch.cat([t, k, v], dim=0)
        out["model.diffusion_model." + key] = t.contiguous()
    back = convert_z_image_transformer_checkpoint_to_diffusers(dict(out))
    assert back.keys() == ours.keys(), set(back) ^ set(ours)
    assert all(torch.equal(back[k], ours[k]) for k in ours), "the converter reads it back unchanged"
    save_file(out, MODELS / "tiny-zimage-original.safetensors", metadata={"format": "pt"})


CASES = [
    {"name": "turbo_2_steps", "prompt": "a red fox in the snow, watercolour", "negative_prompt": "",
     "steps": 2, "guidance": 0.0, "width": 48, "height": 32, "seed": 11},
    {"name": "guided_2_steps", "prompt": "A lighthouse at dusk", "negative_prompt": "blurry, low quality, extra fingers",
     "steps": 2, "guidance": 2.5, "width": 32, "height": 32, "seed": 12},
    {"name": "one_step", "prompt": "東京の夜景 🌃", "negative_prompt": "",
     "steps": 1, "guidance": 0.0, "width": 32, "height": 48, "seed": 13},
]


def img2img(pipe, g):
    """ZImageImg2ImgPipeline from a smooth start image, strength 0.6 over 4 steps (3 run), with
    the VAE posterior's draw replayed as zeros (its mean, as Backpack encodes) and the noise kept."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_tiny_diffusion import patched_randn

    i2i = ZImageImg2ImgPipeline(**pipe.components)
    i2i.set_progress_bar_config(disable=True)
    h, w, steps, strength = 32, 48, 4, 0.6
    ys, xs = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    init = torch.stack([xs, ys, 0.5 + 0.4 * torch.sin(6 * xs * ys)]).unsqueeze(0).float()
    gen = torch.Generator().manual_seed(21)
    noise = torch.randn((1, 8, h // 4, w // 4), generator=gen)
    posterior = torch.zeros((1, 8, h // 4, w // 4))
    prompt = "an oil painting of a harbour"
    with torch.no_grad(), patched_randn([posterior, noise]):
        image = i2i(prompt=prompt, image=init.clone(), strength=strength, num_inference_steps=steps,
                    guidance_scale=0.0, output_type="np").images
    g["img2img.init"] = init
    g["img2img.noise"] = noise
    g["img2img.image"] = torch.from_numpy(np.ascontiguousarray(image)).float()
    return {"prompt": prompt, "steps": steps, "strength": strength, "width": w, "height": h, "guidance": 0.0,
            "rule": "init_timestep = min(steps * strength, steps); t_start = int(max(steps - init_timestep, 0)); "
                    "the first kept sigma noises the encoder's mean latent: sigma * noise + (1 - sigma) * x0",
            "random_draws": ["the VAE posterior's draw, replayed as zeros", "img2img.noise"]}


def sigma_tables():
    static = json.loads((CORPUS / "Tongyi-MAI--Z-Image-Turbo/scheduler/scheduler_config.json").read_text())
    base = json.loads((CORPUS / "Tongyi-MAI--Z-Image/scheduler/scheduler_config.json").read_text())
    dynamic = json.loads((CORPUS / "black-forest-labs--FLUX.2-klein-4B/scheduler/scheduler_config.json").read_text())
    out = []
    for label, config in [("z-image-turbo", static), ("z-image", base), ("flux2-klein", dynamic)]:
        sched = FlowMatchEulerDiscreteScheduler.from_config(config)
        for steps in (1, 4, 9, 28):
            for tokens in (64, 1024, 4096, 6000):
                base_sigmas = torch.linspace(1.0, 1 / steps, steps).tolist()
                mu = None
                if sched.config.use_dynamic_shifting:
                    m = (sched.config.max_shift - sched.config.base_shift) / (
                        sched.config.max_image_seq_len - sched.config.base_image_seq_len)
                    b = sched.config.base_shift - m * sched.config.base_image_seq_len
                    mu = tokens * m + b
                sched.set_timesteps(sigmas=base_sigmas, mu=mu)
                out.append({"scheduler": label, "steps": steps, "tokens": tokens,
                            "sigmas": sched.sigmas.tolist(), "timesteps": sched.timesteps.tolist()})
    return {"configs": {"z-image-turbo": static, "z-image": base, "flux2-klein": dynamic}, "cases": out}


def main():
    torch.manual_seed(0)
    folder = MODELS / NAME
    build(folder)
    original_layout(folder)
    bench_config()
    pipe = ZImagePipeline.from_pretrained(folder, torch_dtype=torch.float32)
    g = {}
    info = {"folder": f"tests/fixtures/models/{NAME}", "golden": f"tests/fixtures/goldens/{NAME}.safetensors",
            "made_by": "tests/reference/make_tiny_zimage.py with diffusers 0.42.0, transformers 5.24.0, torch 2.15 (CPU, float32)"}

    # Captions: the encoder's hidden_states[-2] over the chat-templated prompt.
    prompt = CASES[0]["prompt"]
    text = pipe.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                              add_generation_prompt=True, enable_thinking=True)
    ids = pipe.tokenizer(text).input_ids
    caption = pipe.encode_prompt(prompt, do_classifier_free_guidance=False)[0][0]
    g["prompt.ids"] = torch.tensor(ids, dtype=torch.float32)
    g["caption"] = caption.float().contiguous()
    info["caption"] = {"prompt": prompt, "rendered": text}

    # One transformer call at two model times (0 = noise) on a 12×8 latent (6×4 patches).
    gen = torch.Generator().manual_seed(5)
    latents = torch.randn((1, 8, 8, 12), generator=gen)
    g["transformer.latents"] = latents
    for label, t in (("t0", 0.25), ("t1", 0.9)):
        with torch.no_grad():
            out = pipe.transformer([latents[0].unsqueeze(1)], torch.tensor([t]), [caption], return_dict=False)[0]
        g[f"transformer.out.{label}"] = out[0].squeeze(1).unsqueeze(0).float().contiguous()
    info["transformer"] = {"times": {"t0": 0.25, "t1": 0.9}, "latents": "transformer.latents"}

    # The VAE decoder on a latent as the transformer sees it.
    vae_latents = torch.randn((1, 8, 6, 10), generator=gen)
    with torch.no_grad():
        image = pipe.vae.decode(vae_latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor).sample
    g["vae.latents"] = vae_latents
    g["vae.image"] = image.float().contiguous()

    # Whole images from given latents.
    for case in CASES:
        gen = torch.Generator().manual_seed(case["seed"])
        shape = (1, 8, case["height"] // 4, case["width"] // 4)
        start = torch.randn(shape, generator=gen)
        with torch.no_grad():
            result = pipe(prompt=case["prompt"], negative_prompt=case["negative_prompt"] or None,
                          height=case["height"], width=case["width"], num_inference_steps=case["steps"],
                          guidance_scale=case["guidance"], latents=start.clone(), output_type="np").images
        g[f"{case['name']}.latents"] = start
        g[f"{case['name']}.image"] = torch.from_numpy(np.ascontiguousarray(result)).float()
    info["cases"] = CASES
    info["img2img"] = img2img(pipe, g)
    info["schedulers"] = sigma_tables()

    GOLDENS.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in g.items()}, GOLDENS / f"{NAME}.safetensors", metadata={"format": "pt"})
    (GOLDENS / f"{NAME}.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n")
    print("wrote", folder, "and", GOLDENS / f"{NAME}.safetensors")


if __name__ == "__main__":
    main()
