"""Saves the CLIP fixture tokenizers in the form transformers 5 and current diffusers write:
tokenizer.json + tokenizer_config.json, with no vocab.json, merges.txt or special_tokens_map.json,
and records the ids transformers 5's CLIPTokenizer gives for the golden prompts.

Reads
  tests/fixtures/tokenizers/clip-tiny/ and clip-tiny-pad-bang/   (vocab.json + merges.txt form)
  tests/fixtures/goldens/clip_tokenizer.json                      (the prompts)
Writes
  tests/fixtures/tokenizers/clip-tiny-json/ and clip-tiny-pad-bang-json/
  tests/fixtures/goldens/clip_tokenizer_json.json

The files are written by transformers itself (`save_pretrained`), so the test reads the format
as the library publishes it, not as this project imagines it:
  pip install --target /tmp/tf5 transformers tokenizers
  PYTHONPATH=/tmp/tf5 python3 tests/reference/make_clip_tokenizer_json.py
"""

import json
import os
import shutil
import tempfile

import transformers
from transformers import CLIPTokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOKENIZERS = os.path.join(ROOT, "fixtures", "tokenizers")
GOLDENS = os.path.join(ROOT, "fixtures", "goldens")
MAX_LENGTH = 77


def save_json_form(name):
    source = os.path.join(TOKENIZERS, name)
    dest = os.path.join(TOKENIZERS, name + "-json")
    tokenizer = CLIPTokenizer.from_pretrained(source)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        names = sorted(os.listdir(tmp))
        assert "tokenizer.json" in names and "vocab.json" not in names, names
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        for file in names:
            shutil.copy(os.path.join(tmp, file), dest)
    # The saved config names the folder it came from; nothing reads it.
    config_path = os.path.join(dest, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.pop("name_or_path", None)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False, sort_keys=True)
        f.write("\n")
    return dest


def main():
    with open(os.path.join(GOLDENS, "clip_tokenizer.json")) as f:
        golden = json.load(f)
    out = {"transformers": transformers.__version__, "max_length": MAX_LENGTH, "folders": {}}
    for name, folder in golden["folders"].items():
        dest = save_json_form(name)
        tokenizer = CLIPTokenizer.from_pretrained(dest)
        cases = []
        for case in folder["cases"]:
            ids = tokenizer(
                case["prompt"], padding="max_length", max_length=MAX_LENGTH, truncation=True
            )["input_ids"]
            cases.append({"prompt": case["prompt"], "ids": ids})
        out["folders"][os.path.basename(dest)] = {"from": name, "cases": cases}
    with open(os.path.join(GOLDENS, "clip_tokenizer_json.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
