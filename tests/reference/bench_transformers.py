#!/usr/bin/env python3
"""Peer benchmark: prefill and decode speed of Hugging Face transformers (eager, PyTorch).

Gives the numbers Backpack's own benchmark is compared with. The model is built
from a config.json (see tests/reference/configs/) with random weights, so no
checkpoint or network is needed; speed does not depend on the weight values.

    python3 tests/reference/bench_transformers.py --config tests/reference/configs/qwen2.5-0.5b.json \\
        [--prompt-len 128] [--gen 128] [--dtype float16|bfloat16] [--repeats 3]

Measured (batch 1, greedy, KV cache, best of --repeats runs after one warm-up):
  prefill_s        one forward over the prompt with use_cache=True
  ttft_s           prefill plus picking the first token and reading it back to the host
  decode_s         a hand-written greedy loop of --gen single-token forwards reusing
                   past_key_values (the token stays on the GPU; one synchronize at the end)
  generate_s       transformers' own model.generate(max_new_tokens=gen, min_new_tokens=gen)
Prints one JSON line.
"""

import argparse
import json
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_config(path):
    with open(path) as f:
        d = json.load(f)
    d = {k: v for k, v in d.items() if k not in ("transformers_version", "architectures")}
    model_type = d.pop("model_type")
    return AutoConfig.for_model(model_type, **d)


def build(config, dtype, device):
    # transformers 5 renamed from_config's torch_dtype to dtype.
    dt_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    with torch.device(device):  # initialise the random weights directly on the device
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", **{dt_key: dtype})
    return model.to(device=device, dtype=dtype).eval()


@torch.no_grad()
def prefill(model, ids, device):
    sync(device)
    t0 = time.perf_counter()
    out = model(ids, use_cache=True)
    sync(device)
    t1 = time.perf_counter()
    first = int(out.logits[0, -1].argmax())  # .item() reads the token back to the host
    t2 = time.perf_counter()
    return out, first, t1 - t0, t2 - t0


@torch.no_grad()
def decode(model, out, gen, device):
    past = out.past_key_values
    tok = out.logits[:, -1:].argmax(-1)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(gen):
        o = model(tok, past_key_values=past, use_cache=True)
        past = o.past_key_values
        tok = o.logits[:, -1:].argmax(-1)
    sync(device)
    return time.perf_counter() - t0


@torch.no_grad()
def hf_generate(model, ids, gen, device):
    sync(device)
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen,
                         min_new_tokens=gen, do_sample=False, pad_token_id=0)
    sync(device)
    assert out.shape[1] == ids.shape[1] + gen
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="HF config.json of the model to emulate")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--dtype", choices=list(DTYPES), default="float16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = ap.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    config = load_config(args.config)
    dtype = DTYPES[args.dtype]
    model = build(config, dtype, device)
    model.generation_config.eos_token_id = None  # never stop early on random weights
    ids = torch.randint(0, config.vocab_size, (1, args.prompt_len), device=device)

    # Warm-up: kernels, allocator and cache paths for every measured step.
    out, _, _, _ = prefill(model, ids, device)
    decode(model, out, min(args.gen, 8), device)
    hf_generate(model, ids, min(args.gen, 8), device)

    pre, ttft, dec, gen_s = [], [], [], []
    for _ in range(args.repeats):
        out, _, p, t = prefill(model, ids, device)
        pre.append(p)
        ttft.append(t)
        dec.append(decode(model, out, args.gen, device))
        del out
        gen_s.append(hf_generate(model, ids, args.gen, device))

    p, t, d, g = min(pre), min(ttft), min(dec), min(gen_s)
    result = {
        "engine": "transformers-eager",
        "config": args.config,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "dtype": args.dtype,
        "prompt_len": args.prompt_len,
        "gen": args.gen,
        "repeats": args.repeats,
        "params": sum(x.numel() for x in model.parameters()),
        "prefill_s": p,
        "prefill_tok_s": args.prompt_len / p,
        "ttft_s": t,
        "decode_s": d,
        "decode_tok_s": args.gen / d,
        "decode_ms_per_tok": 1000.0 * d / args.gen,
        "generate_s": g,
        "generate_tok_s": args.gen / g,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "cuda_version": torch.version.cuda,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
