#!/usr/bin/env bash
# Speculative decoding's speed against its acceptance rate: for each shape, plain greedy decode
# of 128 tokens after a 504-token prompt, then the same answer decoded speculatively with K
# drafts a round, each draft being the model's own next token with chance A (`backpack bench
# --speculate K,... --acceptance A,...`), so the rate is exact and drafting costs nothing. The
# gain a real drafter gets is this curve read at its acceptance rate, less its own time.
#
# Run from the repository root on the GPU machine with the NVIDIA Vulkan driver, after staging
# what tests/reference/bench_llamacpp.sh --stage writes (gguf wheel, SmolLM2 tokenizer) into
# .bench/ and a stripped release binary as .bench/backpack.xz; .gl/ holds the Vulkan loader's
# Debian packages (docs/performance.md says how).
source tests/reference/device_setup.sh
# SHAPES: "config:format" pairs (tests/reference/configs/CONFIG.json).
SHAPES=${SHAPES:-"llama-3.1-8b:q4_k llama-3.1-8b:q8_0 llama-3.1-8b:f16 smollm2-1.7b:q4_k"}
DRAFTS=${DRAFTS:-"3,7"}
RATES=${RATES:-"1,0.8"}
for pair in $SHAPES; do
    config=${pair%%:*} format=${pair##*:}
    model="/tmp/$config-$format.gguf"
    python3 tests/reference/make_bench_gguf.py model --config "tests/reference/configs/$config.json" \
        --format "$format" --tokenizer /tmp/tok.json --out "$model" || continue
    echo "== $config $format"
    .bench/backpack bench --model "$model" --prompt-len 504 --gen 128 --repeat 2 \
        --speculate "$DRAFTS" --acceptance "$RATES" --json 2>/dev/null | tail -1 | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print(f'plain decode {d[\"decode_tok_s\"]:.1f} tok/s, prefill {d[\"prefill_tok_s\"]:.0f} tok/s')
for s in d['speculative']:
    print(f'K {s[\"drafts_per_round\"]:2d} A {s[\"acceptance\"]:.2f}: {s[\"speculative_tok_s\"]:7.1f} tok/s '
          f'({s[\"speedup\"]:.2f}x of {s[\"plain_tok_s\"]:.1f}), {s[\"tokens_per_round\"]:.2f} tokens a round, '
          f'verify {s[\"verify_ms\"]:.2f} ms, {s[\"differing_tokens\"]} tokens differ')
"
    rm -f "$model"
done
