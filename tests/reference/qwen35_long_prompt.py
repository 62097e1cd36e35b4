"""Goldens for a prompt longer than Gated DeltaNet's prefill chunks, on the tiny Qwen3.5 folders.

transformers computes a prompt through Qwen3.5's linear-attention layers in chunks of 64 tokens
(`torch_chunk_gated_delta_rule`) and decodes with the recurrent step. The shared goldens'
prompts (make_tiny_models.py) are shorter than one chunk; this prompt of 150 tokens crosses two
chunk boundaries, and the greedy continuation crosses the next. Writes
tests/fixtures/goldens/<model>-long.json: the prompt ids, the prompt logits at the positions
around the boundaries, the greedy tokens and each step's top-two margin.

Run from the repository root with transformers >= 5.2 (Qwen3.5):
    python3 tests/reference/qwen35_long_prompt.py
"""

import json
import os

import torch
import transformers

MODELS = ("tiny-qwen3-5", "tiny-qwen3-5-moe")
PROMPT_LEN = 150
NEW_TOKENS = 40
# Prompt positions whose logits are kept: both sides of each 64-token boundary, and the ends.
POSITIONS = [0, 1, 62, 63, 64, 65, 100, 127, 128, 129, 149]
SEED = 150


def prompt_ids(vocab, specials):
    """A fixed pseudo-random prompt of ordinary tokens (special ids left out)."""
    gen = torch.Generator().manual_seed(SEED)
    ordinary = [i for i in range(vocab) if i not in specials]
    picks = torch.randint(0, len(ordinary), (PROMPT_LEN,), generator=gen)
    return [ordinary[i] for i in picks.tolist()]


def golden(folder):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    vocab = model.config.vocab_size
    ids = prompt_ids(vocab, set(tokenizer.all_special_ids))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             output_scores=True, return_dict_in_generate=True,
                             eos_token_id=None, pad_token_id=0)
    tokens = out.sequences[0, len(ids):].tolist()
    margins = []
    for scores in out.scores:
        top = torch.topk(scores[0], 2).values
        margins.append(float(top[0] - top[1]))
    return {
        "generator": "tests/reference/qwen35_long_prompt.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "prompt_ids": ids,
        "positions": POSITIONS,
        "prompt_logits": [[round(float(v), 6) for v in logits[p]] for p in POSITIONS],
        "greedy_tokens": tokens,
        "top2_margins": [round(m, 6) for m in margins],
    }


def main():
    root = os.path.join("tests", "fixtures")
    for name in MODELS:
        data = golden(os.path.join(root, "models", name))
        path = os.path.join(root, "goldens", f"{name}-long.json")
        with open(path, "w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.write("\n")
        print(path, data["greedy_tokens"][:8], min(data["top2_margins"]))


if __name__ == "__main__":
    main()
