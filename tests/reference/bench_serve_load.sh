#!/usr/bin/env bash
# Serving under load, same run: `backpack serve --parallel N` against llama.cpp's
# `llama-server -np N` (continuous batching on) on the same random-weight GGUF files, with the
# same streamed requests from tests/reference/load_client.py at each client count.
#
#   tests/reference/bench_serve_load.sh [--shapes smollm2-1.7b,llama-3.1-8b] [--format q4_k]
#       [--clients 1,4,16,64] [--gen 128] [--prompt-words 100] [--system-words 0] [--rounds 2]
#       [--json OUT.jsonl]
#
# Run from the repository root on the GPU machine, after what tests/reference/device_setup.sh
# needs is staged (.gl/ Vulkan loader packages, .bench/backpack.xz, the gguf wheel and SmolLM2's
# tokenizer) and .bench/llama-server.tar.xz (bench_llamacpp.sh --stage). At each client count
# C both servers start afresh with C slots (`llama-server -np C -c C·ctx`, `backpack serve
# --parallel C --context ctx`, ctx = 128 + 2·words + gen tokens a slot) and answer C·rounds
# requests (at least 8) after an unmeasured round of C. With --system-words N every prompt opens
# with the same N words (the unmeasured round uses other words, so the measured round's shared
# prefix is new to both servers). Rows: total generated tok/s, p50/p99 time to first token, and
# the throughput ratio Backpack / llama.cpp.
set -uo pipefail
shapes=smollm2-1.7b,llama-3.1-8b
format=q4_k
clients=1,4,16,64
gen=128
words=100
system=0
rounds=2
json_out=/tmp/serve_load.jsonl
while [ $# -gt 0 ]; do
    case $1 in
        --shapes) shapes=$2; shift 2 ;;
        --format) format=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --prompt-words) words=$2; shift 2 ;;
        --system-words) system=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --json) json_out=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
source tests/reference/device_setup.sh
here=tests/reference
ctx=$((128 + 2 * (words + system) + gen))
mkdir -p /tmp/llama && tar -xJf .bench/llama-server.tar.xz -C /tmp/llama
llama=/tmp/llama/llama-server/llama-server
export LD_LIBRARY_PATH=/tmp/llama/llama-server${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$llama" --version 2>&1 | grep -m1 '^version'
: >"$json_out"
port=18080

wait_ready() {
    local pid=$1
    for _ in $(seq 1 600); do
        kill -0 "$pid" 2>/dev/null || return 1
        python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/v1/models', timeout=2)" \
            2>/dev/null && return 0
        sleep 0.5
    done
    return 1
}

measure() {
    local engine=$1 shape=$2 c=$3
    # An unmeasured round first, at the same concurrency: both servers compile kernels for new
    # batch shapes on first use (llama.cpp's first batched prompts took seconds).
    python3 $here/load_client.py --url "http://127.0.0.1:$port" --clients "$c" --requests "$c" \
        --max-tokens "$gen" --prompt-words "$words" --system-words "$system" --seed 99 >/dev/null
    local n=$((c * rounds))
    [ $n -lt 8 ] && n=8
    python3 $here/load_client.py --url "http://127.0.0.1:$port" --clients "$c" --requests "$n" \
        --max-tokens "$gen" --prompt-words "$words" --system-words "$system" \
        --label "$engine $shape $format" --json "$json_out"
}

# serve ENGINE SHAPE FILE C: starts the server with C slots, measures C clients, stops it.
serve() {
    local engine=$1 shape=$2 file=$3 c=$4
    if [ "$engine" = llama.cpp ]; then
        "$llama" -m "$file" -ngl 999 -c $((c * ctx)) -np "$c" --host 127.0.0.1 --port $port \
            >/tmp/$engine-$shape-$c.log 2>&1 &
    else
        .bench/backpack serve --model "$file" --parallel "$c" --context "$ctx" --queue 1024 \
            --port $port >/tmp/$engine-$shape-$c.log 2>&1 &
    fi
    local pid=$!
    if wait_ready $pid; then
        measure "$engine" "$shape" "$c"
    else
        echo "$engine did not start:"; tail -5 /tmp/$engine-$shape-$c.log
    fi
    kill $pid; wait $pid 2>/dev/null
}

for shape in ${shapes//,/ }; do
    file=/tmp/$shape-$format.gguf
    python3 $here/make_bench_gguf.py model --config "$here/configs/$shape.json" --format "$format" \
        --tokenizer /tmp/tok.json --out "$file" || exit 1
    for c in ${clients//,/ }; do
        serve llama.cpp "$shape" "$file" "$c"
        serve backpack "$shape" "$file" "$c"
    done
    rm -f "$file"
done
python3 - "$json_out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    engine, shape, fmt = r["label"].split()
    by.setdefault((shape, fmt, r["clients"]), {})[engine] = r
print("| shape | clients | llama.cpp tok/s | Backpack tok/s | ratio | llama.cpp TTFT p50 / p99 ms | Backpack TTFT p50 / p99 ms | failures |")
print("|---|---:|---:|---:|---:|---|---|---:|")
for (shape, fmt, c), e in sorted(by.items()):
    l, b = e.get("llama.cpp"), e.get("backpack")
    if not l or not b:
        continue
    ratio = b["tok_per_s"] / l["tok_per_s"] if l["tok_per_s"] else 0
    print(f"| {shape} {fmt} | {c} | {l['tok_per_s']:,.0f} | {b['tok_per_s']:,.0f} | {ratio:.2f} | "
          f"{l['ttft_p50_ms']} / {l['ttft_p99_ms']} | {b['ttft_p50_ms']} / {b['ttft_p99_ms']} | "
          f"{l['failures']} / {b['failures']} |")
EOF
