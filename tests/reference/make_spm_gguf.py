#!/usr/bin/env python3
"""Build a tiny llama GGUF with a SentencePiece vocabulary and record what transformers does with it.

Writes:

    tests/fixtures/models/tiny-llama-spm.gguf   llama architecture, 2 layers, 64 wide, 4 heads / 2 KV
                                               heads, untied F16 head, Q8_0/Q4_0/Q4_1 matrices,
                                               `tokenizer.ggml.model = llama` (SentencePiece BPE with
                                               byte fallback, scores, token types), Llama-2 chat template
    tests/fixtures/goldens/tiny-llama-spm.json  tokenization cases, chat prompt ids and greedy tokens
                                               from transformers loading that GGUF

The vocabulary is trained here with the `sentencepiece` library (BPE, byte fallback, identity
normalization, dummy prefix: the settings of Llama 1/2 and Mistral) on the corpus of
make_tiny_models.py, so rare characters fall back to `<0xNN>` byte pieces. The tokenization cases are
also run through sentencepiece itself, and whether it agrees is recorded (it splits on whitespace
before merging, which transformers and llama.cpp do not, so runs of spaces can differ).

Weights are random (seeded) and stored in GGUF's layout: Q and K rows in the interleaved rotary
order that llama.cpp's converter produces, which transformers undoes on load.

Run from anywhere (CPU only, no network; needs torch, transformers, gguf, sentencepiece, numpy):

    python3 tests/reference/make_spm_gguf.py

The seed was chosen with `--search-seeds 200` (largest minimum top-2 logit margin over all greedy
steps), so that small numerical differences cannot flip a greedy choice.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import sentencepiece as spm
import torch
import transformers
import gguf
from gguf import GGMLQuantizationType as QT
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_models import CORPUS  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GENERATOR = "tests/reference/make_spm_gguf.py"
MODEL_PATH = os.path.join(REPO_ROOT, "tests", "fixtures", "models", "tiny-llama-spm.gguf")
GOLDEN_PATH = os.path.join(REPO_ROOT, "tests", "fixtures", "goldens", "tiny-llama-spm.json")

SEED = 19
VOCAB_SIZE = 512
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 64, 2, 4, 2, 160, 256

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}"
    "{% set messages = messages[1:] %}"
    "{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'] + ' ' + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
)

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world",
    " leading space and  two  spaces",
    "line one\nline two\n\n  indented",
    "Numbers 1234567 and 3.14159",
    "Le café est très chaud. Où est la bibliothèque ?",
    "日本語の文章です。東京",
    "Unseen: Ω≈ç√∫ and emoji 🦀🎉",
    "tabs\tand\r\nwindows line ends",
    "",
    "   ",
    "<s>[INST] special tokens in text </s>",
    "fn main() { println!(\"hi\"); }",
]

CHATS = [
    [{"role": "user", "content": "What is a fox?"}],
    [{"role": "system", "content": "You are brief."},
     {"role": "user", "content": "Name a river."},
     {"role": "assistant", "content": "The Rhine."},
     {"role": "user", "content": "Another one?"}],
]

PROMPTS = ["The fox", "Once upon a time", "Le café"]
NEW_TOKENS = 12


def train_vocab():
    """SentencePiece BPE model proto, trained on the shared corpus."""
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(CORPUS)
        prefix = os.path.join(tmp, "spm")
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=prefix, vocab_size=VOCAB_SIZE, model_type="bpe",
            byte_fallback=True, character_coverage=0.995, normalization_rule_name="identity",
            add_dummy_prefix=True, remove_extra_whitespaces=False, split_digits=True,
            allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            num_threads=1, minloglevel=2,
        )
        return spm.SentencePieceProcessor(model_file=prefix + ".model")


def token_type(sp, i):
    if sp.is_unknown(i):
        return gguf.TokenType.UNKNOWN
    if sp.is_control(i):
        return gguf.TokenType.CONTROL
    if sp.is_byte(i):
        return gguf.TokenType.BYTE
    if sp.is_unused(i):
        return gguf.TokenType.UNUSED
    return gguf.TokenType.NORMAL


def quantize(w, qtype):
    return gguf.quants.quantize(w.astype(np.float32), qtype), qtype


def write_gguf(sp, seed, path):
    rng = np.random.default_rng(seed)
    vocab = sp.get_piece_size()
    head_dim = HIDDEN // HEADS

    def mat(rows, cols, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama-spm")
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([sp.id_to_piece(i).encode("utf-8") for i in range(vocab)])
    w.add_token_scores([sp.get_score(i) for i in range(vocab)])
    w.add_token_types([token_type(sp, i) for i in range(vocab)])
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(LLAMA2_TEMPLATE)

    tensors = [("token_embd.weight", *quantize(mat(vocab, HIDDEN, 1.0), QT.Q8_0))]
    for layer in range(LAYERS):
        p = f"blk.{layer}."
        tensors += [
            (p + "attn_norm.weight", (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), None),
            (p + "attn_q.weight", *quantize(mat(HIDDEN, HIDDEN), QT.Q8_0)),
            (p + "attn_k.weight", *quantize(mat(KV_HEADS * head_dim, HIDDEN), QT.Q4_1)),
            (p + "attn_v.weight", *quantize(mat(KV_HEADS * head_dim, HIDDEN), QT.Q8_0)),
            (p + "attn_output.weight", *quantize(mat(HIDDEN, HIDDEN), QT.Q4_0)),
            (p + "ffn_norm.weight", (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), None),
            (p + "ffn_gate.weight", *quantize(mat(FFN, HIDDEN), QT.Q4_1)),
            (p + "ffn_up.weight", *quantize(mat(FFN, HIDDEN), QT.Q8_0)),
            (p + "ffn_down.weight", *quantize(mat(HIDDEN, FFN), QT.Q4_0)),
        ]
    tensors += [
        ("output_norm.weight", (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), None),
        ("output.weight", mat(vocab, HIDDEN, 2.0 / np.sqrt(HIDDEN)).astype(np.float16), None),
    ]
    for name, data, qtype in tensors:
        if qtype is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load(path):
    folder, name = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    return tok, model


def greedy(model, ids, eos):
    """Greedy continuation (stopping after EOS, as the engine does) and its top-2 margins."""
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                             do_sample=False, top_k=None, top_p=None, temperature=None,
                             repetition_penalty=1.0, eos_token_id=eos, pad_token_id=0)
        new = out[0, len(ids):].tolist()
        logits = model(out).logits[0, len(ids) - 1:len(ids) - 1 + len(new)]
    top2 = torch.topk(logits, 2, dim=-1).values
    return new, (top2[:, 0] - top2[:, 1]).tolist()


def chat_ids(tok, messages):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def golden(sp, tok, model, seed):
    tokenization = []
    for text in TEXTS:
        plain = tok(text, add_special_tokens=False)["input_ids"]
        with_bos = tok(text)["input_ids"]
        # For information: the sentencepiece library splits on whitespace before merging,
        # transformers and llama.cpp do not, so runs of spaces may come out differently.
        tokenization.append({"text": text, "ids": plain, "ids_with_special": with_bos,
                             "decoded": tok.decode(plain),
                             "sentencepiece_agrees": plain == sp.encode(text)})
    chats = [{"messages": m, "prompt_ids": chat_ids(tok, m),
              "prompt_text": tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)}
             for m in CHATS]
    cases = []
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        new, margins = greedy(model, ids, tok.eos_token_id)
        cases.append({"prompt": prompt, "prompt_ids": ids, "greedy_tokens": new,
                      "top2_margins": [round(m, 5) for m in margins]})
    return {
        "model": "tests/fixtures/models/tiny-llama-spm.gguf",
        "generator": GENERATOR,
        "seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "sentencepiece_version": spm.__version__,
        "min_top2_margin": round(min(m for c in cases for m in c["top2_margins"]), 5),
        "tokenization": tokenization,
        "chats": chats,
        "cases": cases,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--search-seeds", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    sp = train_vocab()
    seed = SEED
    if args.search_seeds:
        best = None
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "m.gguf")
            for s in range(args.search_seeds):
                write_gguf(sp, s, path)
                tok, model = load(path)
                runs = [greedy(model, tok(p)["input_ids"], tok.eos_token_id) for p in PROMPTS]
                # A case that stops early compares too few tokens.
                margin = min(min(m) if len(t) == NEW_TOKENS else -1.0 for t, m in runs)
                if best is None or margin > best[1]:
                    best = (s, margin)
        seed = best[0]
        print(f"best seed {seed} (min top-2 margin {best[1]:.4f})")
    write_gguf(sp, seed, MODEL_PATH)
    tok, model = load(MODEL_PATH)
    result = golden(sp, tok, model, seed)
    with open(GOLDEN_PATH, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {MODEL_PATH} ({os.path.getsize(MODEL_PATH)} bytes), min top-2 margin "
          f"{result['min_top2_margin']}")


if __name__ == "__main__":
    main()
