#!/usr/bin/env bash
# Batched decode steps under each choice of products, same run: `backpack bench --parallel` on
# random-weight GGUF files, once per setting of BACKPACK_BATCH_PRODUCTS (auto: the default
# choice; int8: the int8 few-row products at any number of rows; float: the float few-row
# products up to 8 rows, then the tiles; tiles) and of BACKPACK_FEW_ROWS_INT8 (the int8
# products' lanes and rows a workgroup, for the int8 runs).
#
#   tests/reference/bench_batch_products.sh [--shapes smollm2-1.7b,llama-3.1-8b]
#       [--formats q4_k,q8_0] [--parallel 1,4,8,16,64] [--int8-shapes "lanes=64,rows=8 ..."]
#       [--baselines auto,float,tiles]
#
# Run from the repository root on the GPU machine after what tests/reference/device_setup.sh
# needs is staged. Prints each run's `bench --json` line, labelled.
set -uo pipefail
shapes=smollm2-1.7b,llama-3.1-8b
formats=q4_k
parallel=1,4,8,16,64
int8_shapes="lanes=64,rows=8"
baselines=auto,float
while [ $# -gt 0 ]; do
    case $1 in
        --shapes) shapes=$2; shift 2 ;;
        --formats) formats=$2; shift 2 ;;
        --parallel) parallel=$2; shift 2 ;;
        --int8-shapes) int8_shapes=$2; shift 2 ;;
        --baselines) baselines=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
source tests/reference/device_setup.sh
here=tests/reference
run() {
    local label=$1 file=$2
    shift 2
    local line
    line=$(env "$@" .bench/backpack bench --model "$file" --prompt-len 128 --gen 48 \
        --parallel "$parallel" --json 2>/tmp/bench-batch.err | tail -1)
    if [ -z "$line" ]; then
        echo "$label: failed"; tail -3 /tmp/bench-batch.err
    else
        echo "$label $line"
    fi
}
for shape in ${shapes//,/ }; do
    for format in ${formats//,/ }; do
        file=/tmp/$shape-$format.gguf
        python3 $here/make_bench_gguf.py model --config "$here/configs/$shape.json" \
            --format "$format" --tokenizer /tmp/tok.json --out "$file" || exit 1
        for s in $int8_shapes; do
            run "$shape $format int8 $s" "$file" BACKPACK_BATCH_PRODUCTS=int8 BACKPACK_FEW_ROWS_INT8="$s"
        done
        for b in ${baselines//,/ }; do
            run "$shape $format $b" "$file" BACKPACK_BATCH_PRODUCTS="$b"
        done
        rm -f "$file"
    done
done
