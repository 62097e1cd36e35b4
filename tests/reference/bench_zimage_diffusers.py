#!/usr/bin/env python3
"""Peer benchmark: Z-Image speed of Hugging Face diffusers (PyTorch, SDPA attention).

The numbers `backpack bench-image --config tests/reference/configs/z-image-turbo` is compared
with. The pipeline is built from a diffusers folder that holds only configs (the published
Z-Image-Turbo configs, the tiny tokenizer) with random weights, so no checkpoint or network is
needed; speed does not depend on the weight values. Both engines read the same folder, so the
prompt is the same number of tokens on both.

    python3 tests/reference/bench_zimage_diffusers.py --config tests/reference/configs/z-image-turbo \\
        [--size 1024] [--steps 8] [--dtype bf16|fp16|fp32] [--repeats 3] [--warmup 1]

Measured for each --size (batch 1, guidance 0 as Turbo runs, median of --repeats runs after
--warmup runs, each synchronised):
  text_encode_s     pipe.encode_prompt on one prompt (chat template, tokenizer, Qwen3 to the
                    second-to-last layer)
  transformer_s     one transformer call on [1, 16, size/8, size/8] latents with that caption
  vae_decode_s      vae.decode(latents / scaling_factor + shift_factor)
  image_s           the whole pipeline call: --steps steps, guidance 0, output_type "np"
  peak_mem_gib      torch.cuda.max_memory_allocated over that size's runs
Prints one JSON line per size. diffusers (pure Python) can be unpacked from its wheel onto
PYTHONPATH where it is not installed; see bench_diffusers.py.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import diffusers  # noqa: E402
from diffusers import (  # noqa: E402
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    ZImagePipeline,
    ZImageTransformer2DModel,
)
from transformers import AutoTokenizer, Qwen3Config, Qwen3Model  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PROMPT = "a lighthouse on a cliff at sunset, oil painting"


def timed(fn, device, repeats, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def config(folder, name):
    with open(os.path.join(folder, name, "config.json")) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def build(folder, device, dtype):
    with torch.device(device):
        transformer = ZImageTransformer2DModel(**config(folder, "transformer")).to(dtype)
        vae = AutoencoderKL(**config(folder, "vae")).to(dtype)
        text_config = Qwen3Config.from_pretrained(os.path.join(folder, "text_encoder"))
        text = Qwen3Model._from_config(text_config, attn_implementation="sdpa", dtype=dtype)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(folder, "scheduler"))
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(folder, "tokenizer"))
    pipe = ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text.eval(), tokenizer=tokenizer,
                          transformer=transformer.eval())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--size", type=int, action="append")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dtype", choices=DTYPES, default="bf16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    pipe = build(args.config, device, dtype)
    for size in args.size or [1024]:
        torch.cuda.reset_peak_memory_stats(device)
        with torch.no_grad():
            caption = pipe.encode_prompt(PROMPT, device=device, do_classifier_free_guidance=False)[0]
            latents = torch.randn((1, 16, size // 8, size // 8), device=device, dtype=dtype)
            t = torch.tensor([0.5], device=device, dtype=dtype)
            vae_in = latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
            row = {
                "size": size,
                "caption_tokens": caption[0].shape[0],
                "text_encode_s": timed(
                    lambda: pipe.encode_prompt(PROMPT, device=device, do_classifier_free_guidance=False),
                    device, args.repeats, args.warmup),
                "transformer_s": timed(
                    lambda: pipe.transformer([latents[0].unsqueeze(1)], t, caption, return_dict=False),
                    device, args.repeats, args.warmup),
                "vae_decode_s": timed(lambda: pipe.vae.decode(vae_in), device, args.repeats, args.warmup),
                "image_s": timed(
                    lambda: pipe(PROMPT, height=size, width=size, num_inference_steps=args.steps,
                                 guidance_scale=0.0, output_type="np"),
                    device, args.repeats, args.warmup),
                "steps": args.steps,
            }
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        row.update({"dtype": args.dtype, "torch": torch.__version__, "diffusers": diffusers.__version__,
                    "gpu": torch.cuda.get_device_name(device)})
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
