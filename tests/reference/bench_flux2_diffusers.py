#!/usr/bin/env python3
"""Peer benchmark: FLUX.2 [klein] speed of Hugging Face diffusers (PyTorch, SDPA attention).

The numbers `backpack bench-image --config tests/reference/configs/flux2-klein-4b` is compared
with. The pipeline is built from a diffusers folder that holds only configs (the published
FLUX.2-klein-4B configs, the tiny tokenizer) with random weights, so no checkpoint or network is
needed; speed does not depend on the weight values. Both engines pad the prompt to 512 tokens.

    python3 tests/reference/bench_flux2_diffusers.py --config tests/reference/configs/flux2-klein-4b \\
        [--size 1024] [--steps 4] [--dtype bf16|fp16|fp32] [--repeats 3] [--warmup 1]

Measured for each --size (batch 1, the distilled model's settings: no guidance; median of
--repeats runs after --warmup runs, each synchronised):
  text_encode_s     pipe.encode_prompt on one prompt (chat template, tokenizer, Qwen3 to layer 27)
  transformer_s     one transformer call on the packed [1, size²/256, 128] latents
  vae_decode_s      the batch-norm de-normalisation, unpatchify and vae.decode
  image_s           the whole pipeline call: --steps steps, output_type "np"
  peak_mem_gib      torch.cuda.max_memory_allocated over that size's runs
Prints one JSON line per size.
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
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Transformer2DModel,
)
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

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
        return {k: v for k, v in json.load(f).items() if not k.startswith("_") and k != "force_upcast"}


def build(folder, device, dtype):
    with torch.device(device):
        transformer = Flux2Transformer2DModel(**config(folder, "transformer")).to(dtype)
        vae = AutoencoderKLFlux2(**config(folder, "vae")).to(dtype)
        text_config = Qwen3Config.from_pretrained(os.path.join(folder, "text_encoder"))
        text = Qwen3ForCausalLM._from_config(text_config, attn_implementation="sdpa", dtype=dtype)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(folder, "scheduler"))
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(folder, "tokenizer"))
    pipe = Flux2KleinPipeline(scheduler=scheduler, vae=vae, text_encoder=text.eval(), tokenizer=tokenizer,
                              transformer=transformer.eval(), is_distilled=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--size", type=int, action="append")
    ap.add_argument("--steps", type=int, default=4)
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
            caption, text_ids = pipe.encode_prompt(PROMPT, device=device)
            latents = torch.randn((1, 128, size // 16, size // 16), device=device, dtype=dtype)
            latent_ids = pipe._prepare_latent_ids(latents).to(device)
            packed = pipe._pack_latents(latents)
            t = torch.tensor([0.5], device=device, dtype=dtype)
            mean = pipe.vae.bn.running_mean.view(1, -1, 1, 1)
            std = torch.sqrt(pipe.vae.bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps)

            def decode():
                return pipe.vae.decode(pipe._unpatchify_latents(latents * std + mean))

            row = {
                "size": size,
                "caption_tokens": caption.shape[1],
                "text_encode_s": timed(lambda: pipe.encode_prompt(PROMPT, device=device),
                                       device, args.repeats, args.warmup),
                "transformer_s": timed(
                    lambda: pipe.transformer(hidden_states=packed, timestep=t, guidance=None,
                                             encoder_hidden_states=caption, txt_ids=text_ids,
                                             img_ids=latent_ids, return_dict=False),
                    device, args.repeats, args.warmup),
                "vae_decode_s": timed(decode, device, args.repeats, args.warmup),
                "image_s": timed(
                    lambda: pipe(prompt=PROMPT, height=size, width=size, num_inference_steps=args.steps,
                                 guidance_scale=1.0, output_type="np"),
                    device, args.repeats, args.warmup),
                "steps": args.steps,
            }
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        row.update({"dtype": args.dtype, "torch": torch.__version__, "diffusers": diffusers.__version__,
                    "gpu": torch.cuda.get_device_name(device)})
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
