#!/usr/bin/env bash
# What a grammar costs per token (free text, a JSON schema, a permissive GBNF
# grammar, each with the decode pipeline on or off) and what the prompt cache saves on a
# 2,000-token shared prefix, on random GGUFs of SmolLM2-135M (Q8_0) and SmolLM2-1.7B (Q4_K)
# shapes with SmolLM2's real tokenizer.
#
# Run from the repository root on the GPU machine with the NVIDIA Vulkan driver, after staging
# what tests/reference/bench_llamacpp.sh --stage writes (gguf wheel, SmolLM2 tokenizer) into
# .bench/ and a stripped release binary as .bench/backpack.xz; .gl/ holds the Vulkan loader's
# Debian packages (docs/performance.md says how).
source tests/reference/device_setup.sh
# SHAPES: "config:format" pairs (tests/reference/configs/CONFIG.json); the last one is served for
# the prompt-cache measurement.
SHAPES=${SHAPES:-"smollm2-135m:q8_0 smollm2-1.7b:q4_k"}
models=()
for pair in $SHAPES; do
    config=${pair%%:*} format=${pair##*:}
    python3 tests/reference/make_bench_gguf.py model --config "tests/reference/configs/$config.json" \
        --format "$format" --tokenizer /tmp/tok.json --out "/tmp/$config-$format.gguf"
    models+=("/tmp/$config-$format.gguf")
done
served=${models[-1]}
B=.bench/backpack
cat > /tmp/schema.json <<'J'
{"type": "array", "minItems": 60, "items": {"type": "object", "properties": {
  "id": {"type": "integer", "minimum": 0, "maximum": 99999},
  "name": {"type": "string", "maxLength": 12},
  "ok": {"type": "boolean"}}, "required": ["id", "name", "ok"], "additionalProperties": false}}
J
PROMPT="List the records of the inventory as JSON, one object per record with its id, name and status."
run() {
    local label=$1 model=$2; shift 2
    for rep in 1 2; do
        $B generate --model "$model" --raw --prompt "$PROMPT" --max-tokens 256 --temperature 0 --json "$@" \
            2>/tmp/err.txt | tail -1 | python3 -c "
import json,sys
d=json.loads(sys.stdin.read())
print(f'$label rep $rep: {len(d[\"tokens\"])} tokens, {d[\"tokens_per_s\"]:.1f} tok/s, ttft {d[\"ttft_ms\"]:.1f} ms')
" || tail -3 /tmp/err.txt
    done
}
for model in "${models[@]}"; do
    echo "== $model"
    run "free" "$model"
    run "any text (masked path)" "$model" --grammar 'root ::= [^\x00]*'
    run "json-schema" "$model" --json-schema @/tmp/schema.json
    run "gbnf words" "$model" --grammar 'root ::= ([a-z]+ " ")*'
done
echo "== decode pipeline on / off (bench, $served)"
$B bench --model "$served" --prompt-len 64 --gen 256 --json 2>/dev/null | tail -1 | cut -c1-400
$B bench --model "$served" --prompt-len 64 --gen 256 --sync --json 2>/dev/null | tail -1 | cut -c1-400
echo "== prompt cache, serve $served"
$B serve --model "$served" --port 18180 --context 4096 2>/tmp/serve.txt &
for i in $(seq 60); do grep -q serving /tmp/serve.txt && break; sleep 1; done
python3 - <<'PY'
import json, time, urllib.request
words = " ".join(f"rule{i} applies to item{i % 37} when status{i % 11} is set." for i in range(260))
def ask(user):
    body = {"prompt": words + "\nQ: " + user + "\nA:", "max_tokens": 1, "temperature": 0}
    req = urllib.request.Request("http://127.0.0.1:18180/v1/completions",
        data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.perf_counter()
    answer = json.load(urllib.request.urlopen(req))
    return (time.perf_counter() - t) * 1e3, answer["usage"]
for user in ["warm-up", "First question about the rules?", "Second, different question?", "Third one, longer: which items are affected by status4?"]:
    ms, usage = ask(user)
    print(f"{user!r}: {ms:.1f} ms for the request, prompt {usage['prompt_tokens']}, cached {usage['prompt_tokens_details']['cached_tokens']}")
PY
kill %1
