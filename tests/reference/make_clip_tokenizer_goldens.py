"""Builds a tiny but real CLIP BPE tokenizer and the ids transformers gives for awkward prompts.

Writes
  tests/fixtures/tokenizers/clip-tiny/           SD 1.x layout: pad "<|endoftext|>"
  tests/fixtures/tokenizers/clip-tiny-pad-bang/  SDXL tokenizer_2 layout: pad "!"
  tests/fixtures/goldens/clip_tokenizer.json

Each folder holds what Stable Diffusion repositories ship (vocab.json, merges.txt,
tokenizer_config.json, special_tokens_map.json, no tokenizer.json). The vocabulary is laid out like
OpenAI's: the 256 byte characters, their "</w>" forms, one entry per merge, then
<|startoftext|> and <|endoftext|>; the merges are learned from the paragraph below.

Three references are recorded per prompt, all padded as diffusers' pipelines ask
(padding="max_length", max_length=77, truncation=True):
  fast       CLIPTokenizerFast (the `tokenizers` pipeline; what `CLIPTokenizer` is in transformers 5)
  slow       the Python CLIPTokenizer of transformers 4.x as installed with diffusers (no ftfy:
             BERT's BasicTokenizer cleans the text)
  slow_ftfy  the same with ftfy installed (OpenAI's original text cleaning), when available
`ids` is the expected answer (fast); `overflow` counts the prompt tokens truncation dropped.

The slow tokenizer only exists in transformers 4.x, so run this with one on the path:
  pip install --target /tmp/tf4 --no-deps transformers==4.57.6 tokenizers==0.22.1 \
      'huggingface_hub<1.0' ftfy wcwidth
  PYTHONPATH=/tmp/tf4 python3 tests/reference/make_clip_tokenizer_goldens.py
Under transformers 5, `--check` verifies that its `CLIPTokenizer` reproduces `ids`; it differs on
"<|ENDOFTEXT|>" only: transformers 5 makes special tokens unnormalized (case-sensitive), while
4.x (slow and fast alike) honours the configs' "normalized": true and reads it as EOS.
"""

import collections
import json
import os
import sys

import regex

from clip_bpe import bytes_to_unicode

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOKENIZERS = os.path.join(ROOT, "fixtures", "tokenizers")
GOLDENS = os.path.join(ROOT, "fixtures", "goldens", "clip_tokenizer.json")
MAX_LENGTH = 77
MERGES = 400

PARAGRAPH = """
A photograph of an astronaut riding a horse on the moon, highly detailed, digital painting,
trending on artstation, concept art, smooth, sharp focus, illustration, cinematic lighting.
A portrait of a beautiful woman in a red dress standing in the rain at night, neon lights,
reflections on the wet street, photorealistic, 8k, ultra detailed, masterpiece, best quality.
A cute cat sitting on a windowsill watching the birds in the garden, soft morning light,
watercolor painting, pastel colors. An ancient castle on a hill above a misty forest, fantasy
landscape, dramatic clouds, golden hour, oil painting by a famous painter. The quick brown fox
jumps over the lazy dog while the children are playing in the park and the sun is shining.
Don't stop believing; it's what we're doing, they've said I'm sure you'll see what he'd done.
"""

SPECIAL_BOS = "<|startoftext|>"
SPECIAL_EOS = "<|endoftext|>"
PATTERN = regex.compile(
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
)


def learn_merges(text, count):
    """Plain BPE training over byte-level words, the last symbol of a word carrying "</w>"."""
    byte_encoder = bytes_to_unicode()
    words = collections.Counter()
    for piece in PATTERN.findall(" ".join(text.split()).lower()):
        symbols = [byte_encoder[b] for b in piece.encode("utf-8")]
        symbols[-1] += "</w>"
        words[tuple(symbols)] += 1
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += freq
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        merged = collections.Counter()
        for word, freq in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += freq
        words = merged
    return merges


def added_token(content):
    return {
        "__type": "AddedToken",
        "content": content,
        "lstrip": False,
        "normalized": True,
        "rstrip": False,
        "single_word": False,
    }


def write_folder(name, vocab, merges, pad):
    folder = os.path.join(TOKENIZERS, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    special = {
        "bos_token": added_token(SPECIAL_BOS),
        "eos_token": added_token(SPECIAL_EOS),
        "pad_token": pad,
        "unk_token": added_token(SPECIAL_EOS),
    }
    config = dict(special)
    config.update(
        {
            "add_prefix_space": False,
            "do_lower_case": True,
            "errors": "replace",
            "model_max_length": MAX_LENGTH,
            "tokenizer_class": "CLIPTokenizer",
        }
    )
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(folder, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2, ensure_ascii=False)
    return folder


def prompts():
    long_words = (PARAGRAPH.split() * 3)[:300]
    return [
        "a photograph of an astronaut riding a horse",
        "",
        "   ",
        "A PHOTO OF A CAT",
        "Hello, World!!!",
        "hello! wow!! !",
        "don't stop, it's mine; we're, they've, I'm, you'll, he'd",
        "DON'T SHOUT, IT'S LOUD",
        "it's 's 't 're",
        "1234 5678 and 3.14159",
        "café crème brûlée naïve",
        "cafe\u0301 with a decomposed accent",
        "日本語のテキスト",
        "中文 prompt 混合",
        "한국어 텍스트",
        "Русский текст",
        "العربية",
        "हिन्दी",
        "ΟΔΟΣ Σίσυφος",
        "İstanbul ǅ ß ﬁ",
        "ｆｕｌｌｗｉｄｔｈ ＡＢＣ",
        "emoji 🐱🚀✨ party 👩‍👩‍👧",
        "tabs\tand\nnewlines\r\n  and   spaces",
        "  leading and trailing   ",
        "punctuation runs ...!!!??? --- ((()))",
        "masterpiece, best quality, (ultra-detailed:1.2), [background]",
        "a,b.c;d:e",
        "email@example.com https://example.com/path?x=1",
        "$100 + 50% = ¥ €",
        "zxqv qwxz unknownwords",
        "x" * 100,
        "zero\u200bwidth space",
        "control\x00chars\x07here",
        "non\u00a0breaking\u3000ideographic space",
        "line\u2028separator",
        "<|endoftext|> in the middle",
        "<|startoftext|>",
        "<|ENDOFTEXT|>",
        " ".join(["cat"] * 75),
        " ".join(["cat"] * 76),
        " ".join(long_words[:90]),
        " ".join(long_words),
    ]


def padded(tokenizer, text):
    return tokenizer(
        text, padding="max_length", max_length=MAX_LENGTH, truncation=True
    ).input_ids


def overflow(tokenizer, text):
    return max(0, len(tokenizer(text).input_ids) - MAX_LENGTH)


def build():
    import transformers
    from transformers import CLIPTokenizer, CLIPTokenizerFast

    if int(transformers.__version__.split(".")[0]) >= 5:
        sys.exit("needs transformers 4.x for the slow tokenizer (see the docstring)")
    byte_encoder = bytes_to_unicode()
    chars = list(byte_encoder.values())
    merges = learn_merges(PARAGRAPH, MERGES)
    tokens = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges]
    tokens += [SPECIAL_BOS, SPECIAL_EOS]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "merge results must be new tokens"

    try:
        import ftfy  # noqa: F401

        have_ftfy = True
    except ImportError:
        have_ftfy = False

    goldens = {
        "transformers": transformers.__version__,
        "max_length": MAX_LENGTH,
        "folders": {},
    }
    for name, pad in [("clip-tiny", SPECIAL_EOS), ("clip-tiny-pad-bang", "!")]:
        folder = write_folder(name, vocab, merges, pad)
        fast = CLIPTokenizerFast.from_pretrained(folder)
        slow_ftfy = CLIPTokenizer.from_pretrained(folder) if have_ftfy else None
        slow = CLIPTokenizer.from_pretrained(folder)
        # The slow tokenizer picks its cleaner at construction; this is the ftfy-less branch.
        slow.nlp = transformers.models.clip.tokenization_clip.BasicTokenizer(
            strip_accents=False, do_split_on_punc=False
        )
        slow.fix_text = None
        cases = []
        for text in prompts():
            case = {
                "prompt": text,
                "ids": padded(fast, text),
                "overflow": overflow(fast, text),
                "slow": padded(slow, text),
            }
            if slow_ftfy is not None:
                case["slow_ftfy"] = padded(slow_ftfy, text)
            cases.append(case)
        differ = [c["prompt"] for c in cases if c["slow"] != c["ids"]]
        print(f"{name}: {len(cases)} prompts; slow (no ftfy) differs on {differ!r}")
        if slow_ftfy is not None:
            differ = [c["prompt"] for c in cases if c["slow_ftfy"] != c["ids"]]
            print(f"{name}: slow with ftfy differs on {differ!r}")
        goldens["folders"][name] = {
            "pad_id": fast.pad_token_id,
            "bos_id": fast.bos_token_id,
            "eos_id": fast.eos_token_id,
            "cases": cases,
        }
    # One case per line: compact, and a changed prompt is a one-line diff.
    text = json.dumps(goldens, ensure_ascii=False, separators=(",", ":"))
    text = text.replace('},{"prompt"', '},\n{"prompt"').replace('[{"prompt"', '[\n{"prompt"')
    with open(GOLDENS, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(f"wrote {GOLDENS}")


def check():
    from transformers import CLIPTokenizer

    with open(GOLDENS, encoding="utf-8") as f:
        goldens = json.load(f)
    bad = 0
    for name, folder in goldens["folders"].items():
        tokenizer = CLIPTokenizer.from_pretrained(os.path.join(TOKENIZERS, name))
        for case in folder["cases"]:
            got = padded(tokenizer, case["prompt"])
            if got != case["ids"] or overflow(tokenizer, case["prompt"]) != case["overflow"]:
                bad += 1
                print(f"{name}: {case['prompt']!r}: {got} != {case['ids']}")
    print("all match" if bad == 0 else f"{bad} mismatches")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    check() if "--check" in sys.argv else build()
