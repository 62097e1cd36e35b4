#!/usr/bin/env bash
# Soak test of `backpack serve --parallel`: tests/reference/soak_client.py against a
# random-weight GGUF (SmolLM2-135M's shape by default) served with --batch-invariant, so that an
# answer computes the same sums alone and in a batch (see docs/server.md, "Queueing and
# limits"); --no-batch-invariant serves without it.
#
#   tests/reference/bench_soak.sh [--shape smollm2-135m] [--format q8_0] [--dtype f16]
#       [--parallel 32] [--clients 48] [--requests 10000] [--no-batch-invariant]
#       [--json OUT.jsonl]
#
# Run from the repository root on the GPU machine, after what tests/reference/device_setup.sh
# needs is staged. Prints the soak's JSON line and the server's last log lines.
set -uo pipefail
shape=smollm2-135m
format=q8_0
dtype=f16
invariant=--batch-invariant
parallel=32
clients=48
requests=10000
json_out=/tmp/soak.jsonl
while [ $# -gt 0 ]; do
    case $1 in
        --shape) shape=$2; shift 2 ;;
        --format) format=$2; shift 2 ;;
        --dtype) dtype=$2; shift 2 ;;
        --parallel) parallel=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --no-batch-invariant) invariant=""; shift ;;
        --json) json_out=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
source tests/reference/device_setup.sh
here=tests/reference
file=/tmp/$shape-$format.gguf
python3 $here/make_bench_gguf.py model --config "$here/configs/$shape.json" --format "$format" \
    --tokenizer /tmp/tok.json --out "$file" || exit 1
port=18090
.bench/backpack serve --model "$file" --parallel "$parallel" --context 256 --dtype "$dtype" \
    $invariant --queue 4096 --port $port >/tmp/soak-server.log 2>&1 &
pid=$!
for _ in $(seq 1 600); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/v1/models', timeout=2)" \
        2>/dev/null && break
    sleep 0.5
done
python3 $here/soak_client.py --url "http://127.0.0.1:$port" --pid $pid --requests "$requests" \
    --clients "$clients" --json "$json_out"
kill $pid; wait $pid 2>/dev/null
grep -v "^request " /tmp/soak-server.log | tail -5
grep -c "client went away" /tmp/soak-server.log
