#!/usr/bin/env python3
"""Peer benchmark: Stable Diffusion speed of Hugging Face diffusers (PyTorch, SDPA attention).

Gives the numbers Backpack's own image-generation benchmark is compared with. The pipeline is built
from a diffusers folder that holds only configs (tests/reference/configs/sd-turbo, .../sdxl-turbo)
with random weights, so no checkpoint or network is needed; speed does not depend on the weight
values. Everything is read from the folder (tokenizer included); HF_HUB_OFFLINE is set.

    python3 tests/reference/bench_diffusers.py --config tests/reference/configs/sd-turbo \\
        [--size 512] [--size 1024 ...] [--dtype fp16|bf16|fp32] [--device cuda] [--repeats 5] [--warmup 2]
    python3 tests/reference/bench_diffusers.py --config DIR --count-params    # meta device, no GPU needed

Measured for each --size (batch 1, guidance 0 so no classifier-free-guidance batch, median of
--repeats runs after --warmup runs, each run synchronised):
  text_encode_s     pipe.encode_prompt on one prompt (tokenizer + text encoder(s); SDXL: both)
  unet_s            one UNet call on [1, 4, size/8, size/8] latents at t=999 (SDXL: with text_embeds
                    and time_ids)
  vae_decode_s      vae.decode(latents / scaling_factor) in --dtype
  vae_decode_fp32_s SDXL with fp16 only: the same in float32, which is what the SDXL pipeline runs
                    (its VAE config has force_upcast true)
  image_1step_s     the whole pipeline call: num_inference_steps 1, guidance_scale 0, output_type "np"
                    (text encoding, scheduler, one UNet call, VAE decode, copy to host)
  peak_mem_gib      torch.cuda.max_memory_allocated over that size's runs
Prints one JSON line.

Running where diffusers is not installed (e.g. a GPU machine with torch and transformers only):
diffusers is pure Python, so its wheel can be unpacked and put on PYTHONPATH. Where pip works:

    python3 -m pip download --no-deps diffusers==0.42.1 -d wheels
    python3 -m zipfile -e wheels/diffusers-0.42.1-py3-none-any.whl /tmp/diffusers-pkg
    PYTHONPATH=/tmp/diffusers-pkg python3 tests/reference/bench_diffusers.py --config ...

diffusers' own dependencies (huggingface_hub, safetensors, numpy, Pillow, regex, requests, filelock,
importlib_metadata) must be importable there too; transformers 5 provides CLIPTextModel.
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import diffusers  # noqa: E402
from diffusers import AutoencoderKL, StableDiffusionPipeline, StableDiffusionXLPipeline, UNet2DConditionModel  # noqa: E402
from diffusers.models.attention_processor import AttnProcessor2_0  # noqa: E402
from transformers import CLIPTextConfig, CLIPTokenizer  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PROMPT = "a photograph of a red fox in the snow, highly detailed, golden hour"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def text_model(folder, device):
    cfg = read_json(os.path.join(folder, "config.json"))
    cls = getattr(transformers, cfg["architectures"][0])
    config = CLIPTextConfig.from_pretrained(folder)
    with torch.device(device):  # random init directly on the device (or meta)
        try:
            return cls._from_config(config, attn_implementation="sdpa")
        except (TypeError, ValueError):
            return cls(config)


def build_models(cfg_dir, device):
    index = read_json(os.path.join(cfg_dir, "model_index.json"))
    xl = index["_class_name"] == "StableDiffusionXLPipeline"
    with torch.device(device):
        unet = UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(os.path.join(cfg_dir, "unet")))
        vae = AutoencoderKL.from_config(AutoencoderKL.load_config(os.path.join(cfg_dir, "vae")))
    models = {"unet": unet, "vae": vae, "text_encoder": text_model(os.path.join(cfg_dir, "text_encoder"), device)}
    if xl:
        models["text_encoder_2"] = text_model(os.path.join(cfg_dir, "text_encoder_2"), device)
    return index, xl, models


def count_params(models):
    return {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}


def build_pipeline(cfg_dir, dtype, device):
    index, xl, models = build_models(cfg_dir, device)
    for m in models.values():
        m.to(dtype=dtype).eval().requires_grad_(False)
    models["unet"].set_attn_processor(AttnProcessor2_0())
    models["vae"].set_attn_processor(AttnProcessor2_0())
    sched_cls = getattr(diffusers, index["scheduler"][1])
    scheduler = sched_cls.from_config(sched_cls.load_config(os.path.join(cfg_dir, "scheduler")))
    tok = CLIPTokenizer.from_pretrained(os.path.join(cfg_dir, "tokenizer"))
    if xl:
        tok2 = CLIPTokenizer.from_pretrained(os.path.join(cfg_dir, "tokenizer_2"))
        pipe = StableDiffusionXLPipeline(
            vae=models["vae"], text_encoder=models["text_encoder"], text_encoder_2=models["text_encoder_2"],
            tokenizer=tok, tokenizer_2=tok2, unet=models["unet"], scheduler=scheduler,
            force_zeros_for_empty_prompt=index.get("force_zeros_for_empty_prompt", True), add_watermarker=False)
    else:
        pipe = StableDiffusionPipeline(
            vae=models["vae"], text_encoder=models["text_encoder"], tokenizer=tok, unet=models["unet"],
            scheduler=scheduler, safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe, xl, count_params(models)


def bench(fn, device, repeats, warmup):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 6)


@torch.inference_mode()
def run_size(pipe, xl, size, dtype, device, repeats, warmup):
    res = {"size": size}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if xl:
        def encode():
            return pipe.encode_prompt(prompt=PROMPT, device=device, num_images_per_prompt=1,
                                      do_classifier_free_guidance=False)
    else:
        def encode():
            return pipe.encode_prompt(PROMPT, device, 1, False)
    res["text_encode_s"] = bench(encode, device, repeats, warmup)
    enc = encode()
    cond = enc[0]
    added = None
    if xl:
        time_ids = torch.tensor([[size, size, 0, 0, size, size]], dtype=dtype, device=device)
        added = {"text_embeds": enc[2], "time_ids": time_ids}
    latents = torch.randn(1, 4, size // 8, size // 8, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    t = torch.tensor([999.0], device=device)
    res["unet_s"] = bench(lambda: pipe.unet(latents, t, encoder_hidden_states=cond, added_cond_kwargs=added).sample,
                          device, repeats, warmup)
    sf = pipe.vae.config.scaling_factor
    res["vae_decode_s"] = bench(lambda: pipe.vae.decode(latents / sf).sample, device, repeats, warmup)
    if xl and dtype == torch.float16 and pipe.vae.config.force_upcast:
        vae32 = copy.deepcopy(pipe.vae).to(torch.float32)
        lat32 = latents.float()
        res["vae_decode_fp32_s"] = bench(lambda: vae32.decode(lat32 / sf).sample, device, repeats, warmup)
        del vae32

    def image():
        return pipe(prompt=PROMPT, height=size, width=size, num_inference_steps=1, guidance_scale=0.0,
                    output_type="np").images

    res["image_1step_s"] = bench(image, device, repeats, warmup)
    if device.type == "cuda":
        res["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="diffusers folder with configs and tokenizer(s)")
    ap.add_argument("--size", type=int, action="append", help="image width = height (repeatable; default 512)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--count-params", action="store_true", help="build on the meta device, print parameter counts")
    args = ap.parse_args()
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    versions = {"diffusers": diffusers.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    name = os.path.basename(os.path.normpath(args.config))
    if args.count_params:
        _, _, models = build_models(args.config, torch.device("meta"))
        counts = count_params(models)
        print(json.dumps({"bench": "diffusers", "config": name, "params": counts, "total": sum(counts.values()),
                          "versions": versions}))
        return
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    pipe, xl, counts = build_pipeline(args.config, dtype, device)
    results = [run_size(pipe, xl, s, dtype, device, args.repeats, args.warmup) for s in (args.size or [512])]
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    print(json.dumps({"bench": "diffusers", "config": name, "device": dev_name, "dtype": args.dtype,
                      "attention": "sdpa", "batch": 1, "guidance_scale": 0.0, "repeats": args.repeats,
                      "warmup": args.warmup, "params": counts, "versions": versions, "results": results}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
