#!/usr/bin/env python3
"""Build tiny random Hugging Face models and record reference outputs for Backpack.

What it makes (default, no arguments):

    tests/fixtures/models/tiny-llama/   LlamaForCausalLM  (GQA, llama3 RoPE scaling, untied head, bfloat16)
    tests/fixtures/models/tiny-qwen2/   Qwen2ForCausalLM  (q/k/v biases, tied head, float16)
    tests/fixtures/models/tiny-gpt2/    GPT2LMHeadModel   (LayerNorm + biases, gelu_new, tied head, float32)
    tests/fixtures/models/tiny-phi3/    Phi3ForCausalLM   (fused qkv and gate/up, half the head rotary,
                                                           longrope switching at 24 positions, untied
                                                           head, bfloat16)
    tests/fixtures/models/tiny-qwen3/   Qwen3ForCausalLM  (q/k RMSNorm per head, head_dim 16 with hidden 48 /
                                                           4 heads, untied head, bfloat16)
    tests/fixtures/models/tiny-gemma3/  Gemma3ForCausalLM (sliding window of 5 on three of four layers,
                                                           separate local/global RoPE with linear scaling,
                                                           query_pre_attn_scalar, head_dim 24, tied head,
                                                           Gemma's specials and chat template, bfloat16)
    tests/fixtures/goldens/<model>.json prompt logits, greedy tokens, per-step logits and
                                        tokenization cases produced by transformers

Each model folder holds config.json, generation_config.json, model.safetensors,
tokenizer.json and tokenizer_config.json, i.e. what a real checkpoint directory has.
All of them share one byte-level BPE tokenizer trained here on an embedded corpus;
the Llama copy adds a `<|begin_of_text|>` BOS through a post-processor, like Llama 3,
and the Gemma copy adds Gemma's specials with a `<bos>` prepended the same way.

Run from anywhere (CPU only, no network; needs torch, transformers, tokenizers,
safetensors):

    python3 tests/reference/make_tiny_models.py

Running it again regenerates byte-identical files. Seeds are pinned in SPECS; they
were chosen with `--search-seeds 1000`, which keeps the seed whose greedy decoding has
the largest minimum gap between the top two logits, so that small numerical
differences in the engine cannot flip a greedy choice.

A single model of any shape (for a model the tests never saw) can be written with:

    python3 tests/reference/make_tiny_models.py --arch llama --out /tmp/m \\
        --hidden 96 --layers 3 --heads 6 --kv-heads 2 --intermediate 256 \\
        --no-tie --seed 7 --dtype float16

which writes the model files and golden.json into the --out folder.
"""

import argparse
import inspect
import json
import math
import os
import shutil

import torch
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import tiny_qwen35

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GENERATOR = "tests/reference/make_tiny_models.py"

# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------

# Training corpus. Frequent accented letters / kana / hanzi end up as whole tokens
# (their UTF-8 bytes get merged), rare ones (most emoji, some CJK) stay split into
# byte-level pieces, so the engine's tokenizer sees both situations.
CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog was not amused, but the fox
did not care at all. It ran into the forest, where the trees were tall and the
light was green and soft. Every morning the fox came back to the same river to drink.

A language model reads a sequence of tokens and predicts the next one. It does this
again and again, one token at a time, until it reaches the end of the text or a
special stop token. The model keeps a cache of keys and values so that each new
token only needs a small amount of work. Small models are fast; large models know more.

Once upon a time there was a little engine that lived in a backpack. It carried
its own weights, its own tokenizer and its own kernels, and it ran on any machine
that had a graphics card. People asked it questions and it answered them politely.

fn main() {
    let tokens: Vec<u32> = vec![1, 2, 3];
    for (i, t) in tokens.iter().enumerate() {
        println!("token {} = {}", i, t);
    }
}

def forward(self, x):
    h = self.norm(x)
    return x + self.mlp(h)

for i in range(10):
    print(i * i, end=" ")

{"role": "user", "content": "Hello, how are you?"}
{"role": "assistant", "content": "I am fine, thank you."}

Le café est très chaud. Où est la bibliothèque ? C'est déjà l'été, et les élèves
préfèrent la plage. Ça va très bien, merci. Le garçon a mangé une crêpe à côté de l'hôtel.
Die Straße ist lang und die Brücke ist schön. Über den Fluss fährt ein großes Schiff.
Wir müssen früh aufstehen, weil der Zug um sieben Uhr fährt. Grüße aus München!
日本語の文章です。東京はとても大きな町です。今日は天気がいいです。私は本を読みます。
東京の駅で友達に会いました。日本語を勉強しています。
这是一个中文句子。我们今天去北京。中文很有意思。我喜欢学习中文。北京是中国的首都。
Emoji time 😀 😀 🎉 🚀 👍 ❤️ and again 😀 🎉!
"""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_TOKEN = "<|begin_of_text|>"
VOCAB_SIZE = 448  # trained size: 256 byte symbols + merges (specials are appended after)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer():
    """Byte-level BPE; specials are appended after training so their ids sit at the end
    of the vocabulary, as in Qwen2 / Llama 3."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def tokenizer_variant(base, arch):
    """Returns (tokenizer.json text, tokenizer_config dict) for one architecture."""
    tok = Tokenizer.from_str(base.to_str())
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        # transformers would otherwise strip spaces before punctuation when decoding.
        "clean_up_tokenization_spaces": False,
        "model_max_length": 256,
        "chat_template": CHATML_TEMPLATE,
    }
    if arch == "gemma3":
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIALS])
        bos_id = tok.token_to_id("<bos>")
        # Gemma's tokenizer prepends <bos> to every encoded text.
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<bos>:0 $A:0",
                pair="<bos>:0 $A:0 <bos>:1 $B:1",
                special_tokens=[("<bos>", bos_id)],
            ),
        ])
        cfg.update(bos_token="<bos>", eos_token="<eos>", chat_template=GEMMA_TEMPLATE)
    elif arch == "gpt_oss":
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY_SPECIALS])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        cfg.update(eos_token="<|return|>", chat_template=HARMONY_TEMPLATE)
    elif arch == "llama":
        tok.add_special_tokens([AddedToken(BOS_TOKEN, special=True, normalized=False)])
        bos_id = tok.token_to_id(BOS_TOKEN)
        # Same shape as Llama 3's tokenizer.json: Sequence[ByteLevel, TemplateProcessing].
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN}:0 $A:0",
                pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ])
        cfg["bos_token"] = BOS_TOKEN
        # Llama 3 templates render the BOS themselves; apply_chat_template then encodes
        # with add_special_tokens=False, so it appears exactly once.
        cfg["chat_template"] = "{{ bos_token }}" + CHATML_TEMPLATE
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if arch == "gpt2":
        cfg["eos_token"] = "<|endoftext|>"
    text = tok.to_str(pretty=True)
    if arch not in ("llama", "gemma3"):
        text = legacy_merges(text)
    return text, cfg


def legacy_merges(text):
    """tokenizers >= 0.20 writes merges as ["a", "b"] pairs; most published checkpoints
    (Qwen2.5, Llama 3, SmolLM2) still carry the older "a b" strings. The Qwen2 and GPT-2
    fixtures use the old form so that both are covered (Llama keeps the new one)."""
    d = json.loads(text)
    merges = d["model"]["merges"]
    # Byte-level symbols never contain a space, so joining with one is unambiguous.
    assert all(" " not in a and " " not in b for a, b in merges)
    d["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    return json.dumps(d, indent=2, ensure_ascii=False)


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Default fixtures. `seed` values come from `--search-seeds 1000` (min top-2 margins in logits:
# tiny-llama 0.1035, tiny-qwen2 0.0859, tiny-gpt2 0.1165, tiny-phi3 0.0954, tiny-gemma3
# 0.1040; tiny-qwen3 from 300 seeds, 0.0862).
SPECS = {
    "tiny-llama": dict(arch="llama", hidden=64, intermediate=176, layers=2, heads=4, kv_heads=2,
                       tie=False, dtype="bfloat16", seed=269),
    "tiny-qwen2": dict(arch="qwen2", hidden=48, intermediate=136, layers=2, heads=6, kv_heads=2,
                       tie=True, dtype="float16", seed=21),
    "tiny-gpt2": dict(arch="gpt2", hidden=64, intermediate=None, layers=2, heads=4, kv_heads=4,
                      tie=True, dtype="float32", seed=623),
    "tiny-phi3": dict(arch="phi3", hidden=64, intermediate=160, layers=2, heads=4, kv_heads=2,
                      partial_rotary=0.5, tie=False, dtype="bfloat16", seed=639),
    "tiny-qwen3": dict(arch="qwen3", hidden=48, intermediate=128, layers=2, heads=4, kv_heads=2,
                       head_dim=16, tie=False, dtype="bfloat16", seed=97),
    "tiny-gemma3": dict(arch="gemma3", hidden=64, intermediate=160, layers=4, heads=4, kv_heads=2,
                        head_dim=24, tie=True, dtype="bfloat16", seed=747),
    # Eight experts, two a token, renormalized; the middle layer dense (mlp_only_layers).
    "tiny-qwen3-moe": dict(arch="qwen3_moe", hidden=48, intermediate=96, layers=3, heads=4, kv_heads=2,
                           head_dim=16, experts=8, top_k=2, expert_intermediate=32, dense_layers=[1],
                           norm_topk=True, tie=False, dtype="bfloat16", seed=290),
    # Four experts, two a token; sliding (window 4, shorter than every prompt) and full layers;
    # YaRN stretching 32 positions by 4; a SwiGLU limit low enough to clamp.
    "tiny-gpt-oss": dict(arch="gpt_oss", hidden=64, intermediate=64, layers=2, heads=4, kv_heads=2,
                         head_dim=16, experts=4, top_k=2, swiglu_limit=1.5, tie=False,
                         dtype="bfloat16", seed=72),
    # The same shapes with the experts in MXFP4 blocks, as the published checkpoints hold them.
    "tiny-gpt-oss-mxfp4": dict(arch="gpt_oss", hidden=64, intermediate=64, layers=2, heads=4,
                               kv_heads=2, head_dim=16, experts=4, top_k=2, swiglu_limit=1.5,
                               tie=False, dtype="bfloat16", seed=306, mxfp4=True),
    # Three Gated DeltaNet layers to one gated full-attention layer, twice; value heads in
    # pairs on each key head, key and value heads of different sizes; 32-wide attention heads
    # rotating 8 dims. Written as the published checkpoints are (tiny_qwen35.py).
    "tiny-qwen3-5": dict(arch="qwen3_5", hidden=64, intermediate=96, layers=8, heads=4, kv_heads=2,
                         head_dim=32, key_heads=2, value_heads=4, key_dim=16, value_dim=12,
                         tie=True, dtype="bfloat16", seed=45),
    # The MoE form: eight experts, two a token, and the gated shared expert, on every layer.
    "tiny-qwen3-5-moe": dict(arch="qwen3_5_moe", hidden=64, intermediate=None, layers=4, heads=4,
                             kv_heads=2, head_dim=32, key_heads=2, value_heads=4, key_dim=16,
                             value_dim=12, experts=8, top_k=2, expert_intermediate=32,
                             shared_intermediate=48, tie=False, dtype="bfloat16", seed=24),
}

# Gemma 3's chat template (google/gemma-3-1b-it, newlines written as `\n` escapes inside the
# Jinja strings as there): a system message is folded into the first user turn, the assistant
# is "model", and the BOS comes from the template.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}"
    "{%- set role = \"model\" -%}"
    "{%- else -%}"
    "{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}"
    "{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    "{{ raise_exception(\"Invalid content type\") }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{'<start_of_turn>model\\n'}}"
    "{%- endif -%}"
)
GEMMA_SPECIALS = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]

# GPT-OSS's harmony format (as OpenAI's cookbook describes it): messages are
# `<|start|>{role}<|message|>{content}<|end|>`, assistant messages name their channel, the
# system message states the reasoning effort and the system or developer message of the
# conversation becomes the developer's instructions. The published template also writes the
# current date (strftime_now), which would make the fixture's prompt change every day.
HARMONY_SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                    "<|constrain|>"]
HARMONY_TEMPLATE = (
    "{%- if reasoning_effort is not defined %}{%- set reasoning_effort = 'medium' %}{%- endif -%}"
    "<|start|>system<|message|>You are a tiny test model.\n"
    "Reasoning: {{ reasoning_effort }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "<|end|>"
    "{%- if messages and messages[0].role in ['system', 'developer'] -%}"
    "<|start|>developer<|message|># Instructions\n\n{{ messages[0].content }}<|end|>"
    "{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'assistant' -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- else -%}"
    "<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)

# Phi-3 fixtures' longrope switch length (original_max_position_embeddings).
LONGROPE_ORIGINAL = 24

# Std of the random weight matrices; much larger than the usual 0.02 so the logits are
# spread out (a few units) and greedy choices are not near-ties.
INIT_STD = 0.25
BIAS_STD = 0.2
NORM_STD = 0.1  # norm weights are 1 + NORM_STD * randn, norm biases NORM_STD * randn
# Gemma scales its embeddings by sqrt(hidden) and reads logits through the same (tied) matrix,
# so at INIT_STD the embedding of the token just read dominates the residual stream and its
# own logit: greedy decoding then repeats one token, and the windowed layers attend over
# identical values. Small embeddings avoid that; the final norm's larger scale brings the
# logits back to the spread of the other fixtures (row std about 2).
GEMMA_EMBED_STD = INIT_STD / 8
GEMMA_FINAL_NORM = 8.0  # the final norm's (1 + w), give or take NORM_STD


def _accepts(fn, name):
    return name in inspect.signature(fn).parameters


def make_config(spec, vocab_size, special_ids):
    arch = spec["arch"]
    hidden, heads = spec["hidden"], spec["heads"]
    if hidden % heads and not spec.get("head_dim"):
        raise SystemExit(f"hidden {hidden} is not divisible by heads {heads}")
    if arch == "gpt2":
        if spec["kv_heads"] not in (None, heads):
            raise SystemExit("gpt2 has no grouped-query attention: --kv-heads must equal --heads")
        return transformers.GPT2Config(
            vocab_size=vocab_size, n_positions=128, n_embd=hidden, n_layer=spec["layers"],
            n_head=heads, n_inner=spec["intermediate"], activation_function="gelu_new",
            layer_norm_epsilon=1e-5, initializer_range=INIT_STD,
            bos_token_id=special_ids["<|endoftext|>"], eos_token_id=special_ids["<|endoftext|>"],
            tie_word_embeddings=spec["tie"],
        )
    if arch in tiny_qwen35.ARCHS:
        return tiny_qwen35.config(spec, vocab_size, special_ids, INIT_STD)
    kv = spec["kv_heads"] or heads
    if heads % kv:
        raise SystemExit(f"heads {heads} is not a multiple of kv-heads {kv}")
    common = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"], num_attention_heads=heads, num_key_value_heads=kv,
        max_position_embeddings=256, hidden_act="silu", initializer_range=INIT_STD,
        tie_word_embeddings=spec["tie"],
    )
    if arch == "llama":
        cls = transformers.LlamaConfig
        theta, eps = 10000.0, 1e-5
        # original_max_position_embeddings=32 puts the llama3 wavelength thresholds at 8
        # and 32, so with head_dim 16 the high-frequency, smoothed and low-frequency
        # branches of the formula each cover real dims.
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        common.update(head_dim=hidden // heads, attention_bias=False, mlp_bias=False,
                      rms_norm_eps=eps, bos_token_id=special_ids[BOS_TOKEN],
                      eos_token_id=special_ids["<|endoftext|>"])
    elif arch == "qwen2":
        cls = transformers.Qwen2Config
        theta, eps, scaling = 1000000.0, 1e-6, None
        common.update(rms_norm_eps=eps, use_sliding_window=False,
                      bos_token_id=special_ids["<|endoftext|>"],
                      eos_token_id=special_ids["<|endoftext|>"])
    elif arch == "phi3":
        cls = transformers.Phi3Config
        theta, eps = 10000.0, 1e-5
        # Longrope as Phi-3.5 / Phi-4-mini have it, switching at 24 positions: the shortest
        # golden prompt (21 tokens) starts on the short factors and switches while decoding,
        # the longer ones run on the long factors from the start.
        common.update(rms_norm_eps=eps, original_max_position_embeddings=LONGROPE_ORIGINAL,
                      bos_token_id=special_ids["<|endoftext|>"],
                      eos_token_id=special_ids["<|endoftext|>"],
                      pad_token_id=special_ids["<|endoftext|>"])
        head_dim = hidden // heads
        partial = spec.get("partial_rotary", 1.0)
        pairs = int(head_dim * partial) // 2
        scaling = {"rope_type": "longrope",
                   "short_factor": [round(1.0 + 0.05 * i, 4) for i in range(pairs)],
                   "long_factor": [round(1.0 + 1.5 * i, 4) for i in range(pairs)]}
        if _accepts(cls.__init__, "rope_parameters"):
            scaling["partial_rotary_factor"] = partial
        else:
            common["partial_rotary_factor"] = partial
    elif arch == "gemma3":
        # Every third layer global (Gemma 3 itself has every sixth), the others attend through
        # a window of 5, shorter than every golden prompt; each kind has its own RoPE. Both
        # layer_types and the older sliding_window_pattern go in config.json, as on the Hub,
        # so that neither reader falls back to the default pattern of 6.
        pattern = 3
        layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                       for i in range(spec["layers"])]
        return transformers.Gemma3TextConfig(
            vocab_size=vocab_size, hidden_size=hidden, intermediate_size=spec["intermediate"],
            num_hidden_layers=spec["layers"], num_attention_heads=heads,
            num_key_value_heads=spec["kv_heads"] or heads,
            head_dim=spec.get("head_dim") or hidden // heads, query_pre_attn_scalar=32,
            sliding_window=5, layer_types=layer_types, sliding_window_pattern=pattern,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
            max_position_embeddings=256, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
            initializer_range=INIT_STD, tie_word_embeddings=spec["tie"],
            bos_token_id=special_ids["<bos>"], eos_token_id=special_ids["<eos>"],
            pad_token_id=special_ids["<|endoftext|>"],
        )
    elif arch == "qwen3":
        cls = transformers.Qwen3Config
        theta, eps, scaling = 1000000.0, 1e-6, None
        common.update(head_dim=spec.get("head_dim") or hidden // heads, attention_bias=False,
                      rms_norm_eps=eps, use_sliding_window=False,
                      bos_token_id=special_ids["<|endoftext|>"],
                      eos_token_id=special_ids["<|endoftext|>"])
    elif arch == "qwen3_moe":
        cls = transformers.Qwen3MoeConfig
        theta, eps, scaling = 1000000.0, 1e-6, None
        common.update(head_dim=spec.get("head_dim") or hidden // heads, attention_bias=False,
                      rms_norm_eps=eps, use_sliding_window=False,
                      num_experts=spec["experts"], num_experts_per_tok=spec["top_k"],
                      moe_intermediate_size=spec["expert_intermediate"],
                      norm_topk_prob=spec["norm_topk"], decoder_sparse_step=1,
                      mlp_only_layers=spec["dense_layers"],
                      bos_token_id=special_ids["<|endoftext|>"],
                      eos_token_id=special_ids["<|endoftext|>"])
    elif arch == "gpt_oss":
        cls = transformers.GptOssConfig
        theta, eps = 150000.0, 1e-5
        scaling = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                   "truncate": False, "original_max_position_embeddings": 32}
        layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention"
                       for i in range(spec["layers"])]
        common.update(head_dim=spec.get("head_dim") or hidden // heads, attention_bias=True,
                      rms_norm_eps=eps, num_local_experts=spec["experts"],
                      num_experts_per_tok=spec["top_k"], sliding_window=4, layer_types=layer_types,
                      swiglu_limit=spec["swiglu_limit"],
                      bos_token_id=special_ids["<|endoftext|>"],
                      eos_token_id=special_ids["<|endoftext|>"],
                      pad_token_id=special_ids["<|endoftext|>"])
    else:
        raise SystemExit(f"unknown arch {arch}")
    # transformers 5 moved rope settings into `rope_parameters`; 4.x uses rope_theta/rope_scaling.
    if _accepts(cls.__init__, "rope_parameters"):
        rp = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            rp.update(scaling)
            rp["rope_theta"] = theta
        common["rope_parameters"] = rp
    else:
        common["rope_theta"] = theta
        common["rope_scaling"] = scaling
    return cls(**common)


def build_model(spec, vocab_size, special_ids):
    config = make_config(spec, vocab_size, special_ids)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.to(torch.float32)
    # Our own init, independent of transformers' _init_weights, so a seed means the
    # same weights across transformers versions.
    gen = torch.Generator().manual_seed(spec["seed"])
    seen = set()
    for mname, module in model.named_modules():
        is_norm = "norm" in type(module).__name__.lower()
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:  # tied weights
                continue
            seen.add(id(p))
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            with torch.no_grad():
                if spec["arch"] in tiny_qwen35.ARCHS and tiny_qwen35.init(mname, pname, p, noise, NORM_STD):
                    continue
                if is_norm:
                    # Gemma's norms scale by (1 + w), so their w centre on 0 (the final norm's
                    # on GEMMA_FINAL_NORM - 1); the others' on 1.
                    one = 1.0
                    if spec["arch"] == "gemma3":
                        one = GEMMA_FINAL_NORM - 1.0 if mname == "model.norm" else 0.0
                    p.copy_((one + NORM_STD * noise) if pname == "weight" else NORM_STD * noise)
                elif pname == "bias":
                    p.copy_(BIAS_STD * noise)
                elif spec["arch"] == "gemma3" and isinstance(module, torch.nn.Embedding):
                    p.copy_(GEMMA_EMBED_STD * noise)
                else:
                    p.copy_(INIT_STD * noise)
    # Round through the storage dtype so the goldens use exactly the stored weights.
    dt = DTYPES[spec["dtype"]]
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dt).to(torch.float32))
    model.eval()
    return model


# ---------------------------------------------------------------------------
# Goldens
# ---------------------------------------------------------------------------

MAX_NEW_TOKENS = 16
MIN_SEARCH_STEPS = 8
MIN_SEARCH_DISTINCT = 6

CASES = [
    {"name": "raw-english", "mode": "raw",
     "prompt": "The little engine in the backpack ran to the river and"},
    {"name": "raw-multibyte-special", "mode": "raw",
     "prompt": "Café ou thé? 東京 🚀 <|im_start|>user\nGrüße 😀"},
    {"name": "chat-system-user", "mode": "chat",
     "messages": [{"role": "system", "content": "You are a tiny test model."},
                  {"role": "user", "content": "Say hi to München and 北京 🎉"}]},
]

TOKENIZATION_TEXTS = [
    "",
    "Hello, world! The fox ran.",
    "   leading,  double  and trailing spaces   \t\ttabs ",
    "line one\nline two\n\n\nline five\r\n",
    "emoji: 😀🎉 👍🏽 🇫🇷 ❤️",
    "日本語の文章と中文句子。東京・北京",
    "Specials inline: <|im_start|>user\nhi<|im_end|><|endoftext|> <|begin_of_text|>x",
    "Donaudampfschifffahrtsgesellschaftskapitänswitwe",
    "Ça va? Übermäßig naïve café — «déjà vu»; fn f(x: u32) -> u32 { x+1 }",
]


def ids_of(encoded):
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True).
    if isinstance(encoded, (list, tuple)):
        return list(encoded)
    return list(encoded["input_ids"])


def prompt_ids(tokenizer, case):
    if case["mode"] == "raw":
        return tokenizer(case["prompt"]).input_ids
    return ids_of(tokenizer.apply_chat_template(case["messages"], add_generation_prompt=True,
                                                tokenize=True))


def greedy(model, ids):
    """Greedy decode with transformers' generate; returns new ids and the raw logits
    each was chosen from."""
    inp = torch.tensor([ids], dtype=torch.long)
    out = model.generate(
        inp, attention_mask=torch.ones_like(inp), do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
        repetition_penalty=1.0, top_k=None, top_p=None, temperature=None,
        output_logits=True, return_dict_in_generate=True,
    )
    new = out.sequences[0, len(ids):].tolist()
    logits = [l[0].float() for l in out.logits]
    assert len(logits) == len(new)
    for tok, lg in zip(new, logits):
        assert int(lg.argmax()) == tok, "generate did not pick the argmax"
    return new, logits


def top2_margin(logits):
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def r6(x):
    """6 significant digits keeps the goldens small; the engine's tolerance is far coarser."""
    return float(f"{x:.6g}")


def rows(t):
    return [[r6(v) for v in row] for row in t.tolist()]


@torch.no_grad()
def routing_margins(model, ids):
    """Per position of `ids`, the smallest gap over the sparse layers between the last router
    logit a token is routed by and the next (None for dense models): where it is small, a
    rounding difference may route the token to another expert."""
    top_k = getattr(model.config.get_text_config(), "num_experts_per_tok", None)
    if top_k is None:
        return None
    out = model(torch.tensor([ids]), output_router_logits=True)
    gaps = None
    for layer in out.router_logits:
        top = torch.topk(layer.float(), top_k + 1, dim=-1).values
        gap = top[:, top_k - 1] - top[:, top_k]
        gaps = gap if gaps is None else torch.minimum(gaps, gap)
    return [r6(g) for g in gaps.tolist()]


@torch.no_grad()
def search_score(model, prompts):
    """Min top-2 margin over all greedy steps (and, for mixture-of-experts models, min routing
    margin over the whole sequence), or -inf when a case stops (EOS) before MIN_SEARCH_STEPS
    tokens or settles on repeating fewer than MIN_SEARCH_DISTINCT tokens: either would
    trivially win the search, and a repeated token gives the decode steps little to check
    (windowed layers would attend over identical values)."""
    m = math.inf
    for ids in prompts:
        new, logits = greedy(model, ids)
        if len(new) < MIN_SEARCH_STEPS or len(set(new)) < MIN_SEARCH_DISTINCT:
            return -math.inf
        m = min([m] + [top2_margin(l) for l in logits])
        routing = routing_margins(model, ids + new[:-1])
        if routing is not None:
            m = min([m] + routing)
    return m


@torch.no_grad()
def make_golden(name, spec, model, tokenizer):
    cases = []
    for case in CASES:
        ids = prompt_ids(tokenizer, case)
        full = model(torch.tensor([ids])).logits[0].float()
        new, step_logits = greedy(model, ids)
        # Cross-check the cached decode against plain forwards without a cache. Where longrope
        # switches tables while decoding, one forward over the whole sequence would rotate the
        # steps before the switch by the long factors too; transformers' decode instead
        # re-encodes the sequence once it first passes the switch, so there each step is
        # checked against a forward over the sequence up to that step.
        original = getattr(model.config, "original_max_position_embeddings", None)
        rope_type = (getattr(model.config, "rope_parameters", None) or {}).get("rope_type")
        switches = rope_type == "longrope" and len(ids) <= original < len(ids) + len(new) - 1
        if new:
            if switches:
                ref = torch.stack([model(torch.tensor([ids + new[:k]])).logits[0, -1].float()
                                   for k in range(len(new))])
            else:
                ref = model(torch.tensor([ids + new[:-1]])).logits[0, len(ids) - 1:].float()
            err = (ref - torch.stack(step_logits)).abs().max().item()
            assert err < 1e-3, f"{name}/{case['name']}: cached vs uncached logits differ by {err}"
        c = {k: case[k] for k in ("name", "mode") if k in case}
        if case["mode"] == "raw":
            c["prompt"] = case["prompt"]
        else:
            c["messages"] = case["messages"]
            c["rendered"] = tokenizer.apply_chat_template(case["messages"], add_generation_prompt=True,
                                                          tokenize=False)
        c["prompt_ids"] = ids
        routing = routing_margins(model, ids + new[:-1])
        if routing is not None:
            # Position p's margin; step i's logits are those of position len(ids) - 1 + i.
            c["routing_margins"] = routing
        c["greedy_tokens"] = new
        c["greedy_text"] = tokenizer.decode(new, skip_special_tokens=False)
        c["top2_margins"] = [r6(top2_margin(l)) for l in step_logits]
        c["prompt_logits"] = rows(full)
        c["step_logits"] = rows(torch.stack(step_logits)) if step_logits else []
        cases.append(c)
    margins = [m for c in cases for m in c["top2_margins"]]
    toks = []
    for text in TOKENIZATION_TEXTS:
        ids = tokenizer(text).input_ids
        toks.append({"text": text, "ids": ids, "decoded": tokenizer.decode(ids, skip_special_tokens=True)})
    return {
        "model": name,
        "seed": spec["seed"],
        "generator": GENERATOR,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "dtype": spec["dtype"],
        "vocab_size": model.config.get_text_config().vocab_size,
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_token_ids": eos_ids(spec["arch"], tokenizer),
        "min_top2_margin": min(margins) if margins else None,
        "cases": cases,
        "tokenization": toks,
    }


def eos_ids(arch, tokenizer):
    if arch == "gpt_oss":
        # GPT-OSS's generation config stops at <|return|> and <|call|> (and <|endoftext|>).
        return [tokenizer.convert_tokens_to_ids(t) for t in ("<|return|>", "<|endoftext|>", "<|call|>")]
    if arch == "gemma3":
        # Gemma 3's generation config stops at <eos> and <end_of_turn>.
        return [tokenizer.convert_tokens_to_ids(t) for t in ("<eos>", "<end_of_turn>")]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if arch == "gpt2":
        return [im_end, tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    return im_end


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

def to_json(obj, level=0):
    """JSON with nested containers indented but flat lists (ids, logit rows) on one line."""
    pad = "  " * level
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}  {json.dumps(k, ensure_ascii=False)}: {to_json(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        if all(not isinstance(x, (dict, list)) for x in obj):
            return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        items = [pad + "  " + to_json(x, level + 1) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def write_text(path, text):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
        if not text.endswith("\n"):
            f.write("\n")


def write_tokenizer(out_dir, tok_json, tok_cfg):
    write_text(os.path.join(out_dir, "tokenizer.json"), tok_json)
    write_text(os.path.join(out_dir, "tokenizer_config.json"), json.dumps(tok_cfg, indent=2, ensure_ascii=False))


# ---------------------------------------------------------------------------
# MXFP4 (GPT-OSS's published expert format)
# ---------------------------------------------------------------------------

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_quantize(w):
    """`w` [..., rows, k] (k a multiple of 32) as MXFP4: (blocks [..., rows, k/32, 16] u8 with
    element 2i in the low and 2i+1 in the high nibble of byte i, scales [..., rows, k/32] u8
    e8m0 exponents, and the values those decode to)."""
    *lead, rows, k = w.shape
    blocks = w.reshape(*lead, rows, k // 32, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    exp = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.full_like(amax, -127.0))
    exp = exp.clamp(-127, 127)
    scaled = blocks / torch.exp2(exp)
    mags = torch.tensor(FP4_VALUES[:8])
    idx = (scaled.abs().unsqueeze(-1) - mags).abs().argmin(dim=-1)
    codes = idx + 8 * ((scaled < 0) & (idx > 0)).long()
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    values = torch.tensor(FP4_VALUES)[codes] * torch.exp2(exp)
    return packed, (exp.squeeze(-1) + 127).to(torch.uint8), values.reshape(w.shape)


def to_mxfp4_experts(model):
    """Rounds every expert matrix to MXFP4 in place; returns the checkpoint tensors that hold
    them as published (`*_blocks`, `*_scales`), by name."""
    packed = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                continue
            # Stored [experts][in][out]; blocks run along `in` of each output row.
            blocks, scales, values = mxfp4_quantize(p.transpose(1, 2).float())
            p.copy_(values.transpose(1, 2))
            packed[name + "_blocks"] = blocks.contiguous()
            packed[name + "_scales"] = scales.contiguous()
    return packed


def write_mxfp4_folder(out_dir, packed):
    """Replaces the saved expert matrices with their MXFP4 blocks and marks the config."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    for name in list(tensors):
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            del tensors[name]
    tensors.update(packed)
    save_file(dict(sorted(tensors.items())), path, metadata={"format": "pt"})
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    write_text(cfg_path, json.dumps(cfg, indent=2, sort_keys=True))


def load_mxfp4_folder(out_dir):
    """The folder as transformers reads it: MXFP4 experts dequantized (on CPU), in float32."""
    model = AutoModelForCausalLM.from_pretrained(
        out_dir, quantization_config=transformers.Mxfp4Config(dequantize=True),
        attn_implementation="eager")
    return model.to(torch.float32).eval()


def generate_one(name, spec, base_tok, out_dir, golden_path, search, clean=False):
    if clean and os.path.isdir(out_dir):
        shutil.rmtree(out_dir)  # only for the fixture folders this script owns
    os.makedirs(out_dir, exist_ok=True)
    tok_json, tok_cfg = tokenizer_variant(base_tok, spec["arch"])
    # Goldens come from the tokenizer as transformers loads it from the model folder.
    write_tokenizer(out_dir, tok_json, tok_cfg)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    vocab = len(tokenizer)
    specials = SPECIAL_TOKENS + {"gemma3": GEMMA_SPECIALS, "gpt_oss": HARMONY_SPECIALS}.get(
        spec["arch"], [BOS_TOKEN])
    special = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}

    def set_generation_config(model):
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=eos_ids(spec["arch"], tokenizer),
            pad_token_id=special["<|endoftext|>"],
            do_sample=False,
        )

    if search:
        prompts = [prompt_ids(tokenizer, c) for c in CASES]
        best = None
        for seed in range(search):
            s = dict(spec, seed=seed)
            model = build_model(s, vocab, special)
            set_generation_config(model)
            if s.get("mxfp4"):
                to_mxfp4_experts(model)
            m = search_score(model, prompts)
            if best is None or m > best[1]:
                best = (seed, m)
        print(f"{name}: searched seeds 0..{search - 1}, best seed {best[0]} (min top-2 margin {best[1]:.4f})")
        spec = dict(spec, seed=best[0])

    model = build_model(spec, vocab, special)
    set_generation_config(model)
    packed = to_mxfp4_experts(model) if spec.get("mxfp4") else None
    golden = make_golden(name, spec, model, tokenizer)

    # Save in the storage dtype; values are unchanged since they were already rounded.
    model = model.to(DTYPES[spec["dtype"]])
    kwargs = {"safe_serialization": True} if _accepts(model.save_pretrained, "safe_serialization") else {}
    model.save_pretrained(out_dir, **kwargs)
    write_tokenizer(out_dir, tok_json, tok_cfg)  # save_pretrained must not have touched them
    if packed is not None:
        # The goldens come from transformers reading the MXFP4 folder; they must agree with the
        # model the experts were rounded in.
        write_mxfp4_folder(out_dir, packed)
        reread = load_mxfp4_folder(out_dir)
        reread.generation_config = model.generation_config
        from_folder = make_golden(name, spec, reread, tokenizer)
        for a, b in zip(golden["cases"], from_folder["cases"]):
            assert a["greedy_tokens"] == b["greedy_tokens"], f"{name}: MXFP4 folder decodes differently"
        golden = from_folder
    if spec["arch"] in tiny_qwen35.ARCHS:
        # The goldens come from transformers reading the folder as published.
        tiny_qwen35.write_published_layout(out_dir, spec["seed"])
        reread = tiny_qwen35.load_published_layout(out_dir)
        reread.generation_config = model.generation_config
        from_folder = make_golden(name, spec, reread, tokenizer)
        for a, b in zip(golden["cases"], from_folder["cases"]):
            assert a["greedy_tokens"] == b["greedy_tokens"], f"{name}: the published layout decodes differently"
        golden = from_folder
    os.makedirs(os.path.dirname(golden_path) or ".", exist_ok=True)
    write_text(golden_path, to_json(golden))
    print(f"{name}: seed {spec['seed']}, vocab {vocab}, min top-2 margin {golden['min_top2_margin']:.4f}, "
          f"greedy lengths {[len(c['greedy_tokens']) for c in golden['cases']]} -> {out_dir}")
    return golden


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default=os.path.join(REPO_ROOT, "tests", "fixtures"),
                    help="root for the default set (models/ and goldens/ under it)")
    ap.add_argument("--search-seeds", type=int, default=0, metavar="N",
                    help="try seeds 0..N-1 and keep the one with the largest min top-2 margin")
    g = ap.add_argument_group("single custom model (selected by --arch)")
    ap.add_argument("--only", metavar="NAME", help="regenerate only this default fixture (e.g. tiny-qwen3)")
    g.add_argument("--arch", choices=["llama", "qwen2", "gpt2", "qwen3", "phi3", "gemma3", "qwen3_moe",
                                      "gpt_oss", "qwen3_5", "qwen3_5_moe"])
    g.add_argument("--out", help="model folder to write; golden.json goes inside it")
    g.add_argument("--hidden", type=int)
    g.add_argument("--layers", type=int)
    g.add_argument("--heads", type=int)
    g.add_argument("--kv-heads", type=int)
    g.add_argument("--intermediate", type=int)
    g.add_argument("--head-dim", type=int, help="qwen3, gemma3: head size independent of hidden / heads")
    g.add_argument("--tie", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--seed", type=int)
    g.add_argument("--dtype", choices=list(DTYPES))
    g.add_argument("--experts", type=int, help="qwen3_moe, gpt_oss: experts per sparse layer")
    g.add_argument("--top-k", type=int, help="qwen3_moe, gpt_oss: experts per token")
    g.add_argument("--expert-intermediate", type=int, help="qwen3_moe: width of one expert")
    g.add_argument("--dense-layers", type=int, nargs="*", help="qwen3_moe: mlp_only_layers")
    g.add_argument("--mxfp4", action="store_true",
                   help="gpt_oss: experts written as MXFP4 blocks, as published checkpoints are")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # thread count can change float reduction order
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    base_tok = train_tokenizer()

    if args.arch:
        if not args.out:
            ap.error("--arch needs --out")
        name = f"tiny-{args.arch.replace('_', '-')}"
        spec = dict(SPECS[name])
        for key in ("hidden", "layers", "heads", "kv_heads", "intermediate", "head_dim", "tie", "seed",
                    "dtype", "experts", "top_k", "expert_intermediate", "dense_layers", "mxfp4"):
            v = getattr(args, key)
            if v is not None:
                spec[key] = v
        if args.seed is None and not args.search_seeds:
            spec["seed"] = 0
        if args.arch == "gpt2" and args.kv_heads is None:
            spec["kv_heads"] = spec["heads"]
        if args.arch not in ("gpt2", "gpt_oss") and args.intermediate is None and args.hidden is not None:
            spec["intermediate"] = 8 * ((8 * spec["hidden"] // 3 + 7) // 8)
        out = os.path.abspath(args.out)
        generate_one(os.path.basename(out), spec, base_tok, out, os.path.join(out, "golden.json"),
                     args.search_seeds)
        return

    for name, spec in SPECS.items():
        if args.only and name != args.only:
            continue
        generate_one(name, spec, base_tok,
                     os.path.join(args.fixtures, "models", name),
                     os.path.join(args.fixtures, "goldens", f"{name}.json"),
                     args.search_seeds, clean=True)


if __name__ == "__main__":
    main()
