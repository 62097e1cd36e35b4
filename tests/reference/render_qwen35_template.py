"""Records what transformers renders from Qwen3.5's published chat template.

Reads tests/conformance/models/Qwen--Qwen3.5-35B-A3B/chat_template.jinja and writes
tests/conformance/models/transformers5-render--Qwen3.5-35B-A3B/chat_template_renders.json:
for each case, the messages, the keyword arguments and the exact string
`transformers.utils.chat_template_utils.render_jinja_template` renders.

Run from the repository root with transformers >= 5.2:
    python3 tests/reference/render_qwen35_template.py
"""

import json
import os

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.join("tests", "conformance", "models")
TEMPLATE = os.path.join(ROOT, "Qwen--Qwen3.5-35B-A3B", "chat_template.jinja")
OUT = os.path.join(ROOT, "transformers5-render--Qwen3.5-35B-A3B", "chat_template_renders.json")

HELLO = [{"role": "user", "content": "Hello! What is 2 + 2?"}]
TURNS = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "<think>\nTwo is the smallest.\n</think>\n\n2"},
    {"role": "user", "content": "Another one?"},
]
LAST_ASSISTANT = TURNS[:3]

CASES = [
    ("user, thinking by default", HELLO, {"add_generation_prompt": True}),
    ("user, thinking off", HELLO, {"add_generation_prompt": True, "enable_thinking": False}),
    ("user, thinking on", HELLO, {"add_generation_prompt": True, "enable_thinking": True}),
    ("system and turns: earlier reasoning dropped", TURNS, {"add_generation_prompt": True}),
    ("turns, thinking off", TURNS, {"add_generation_prompt": True, "enable_thinking": False}),
    ("ends on the assistant's answer", LAST_ASSISTANT, {"add_generation_prompt": False}),
    ("no generation prompt", HELLO, {"add_generation_prompt": False}),
]


def main():
    with open(TEMPLATE) as f:
        template = f.read()
    cases = []
    for name, messages, kwargs in CASES:
        rendered, _ = render_jinja_template(
            conversations=[messages], chat_template=template, **kwargs)
        cases.append({"name": name, "messages": messages, "kwargs": kwargs,
                      "rendered": rendered[0]})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"transformers_version": transformers.__version__,
                   "template": TEMPLATE, "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for c in cases:
        print(repr(c["rendered"]))


if __name__ == "__main__":
    main()
