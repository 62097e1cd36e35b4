#!/usr/bin/env bash
# UI frame times while a model streams: runs the app under Xvfb, types three prompts with
# xdotool, quits with Ctrl+Q and prints the app's frame statistics (BACKPACK_FRAME_STATS) and
# the last answer's speed. Needs Xvfb and xdotool.
#   tests/reference/ui_frame_times.sh target/release/backpack tests/fixtures/models/tiny-qwen2
set -euo pipefail
bin=$1
model=$2
data=$(mktemp -d)
log=$data/stderr
# Xvfb picks a free display itself and writes its number to stdout (-displayfd 1).
Xvfb -displayfd 1 -screen 0 1280x800x24 -nolisten tcp >"$data/display" 2>/dev/null &
xvfb=$!
trap 'kill $xvfb 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do
    [ -s "$data/display" ] && break
    sleep 0.1
done
[ -s "$data/display" ] || { echo "Xvfb did not start" >&2; exit 1; }
export DISPLAY=":$(tr -d '[:space:]' <"$data/display")"
BACKPACK_FRAME_STATS=1 "$bin" --model "$model" --data-dir "$data" 2>"$log" &
app=$!
window=""
for _ in $(seq 100); do
    window=$(xdotool search --name '^Backpack$' 2>/dev/null | head -1 || true)
    [ -n "$window" ] && break
    sleep 0.2
done
[ -n "$window" ] || { echo "no window" >&2; cat "$log" >&2; exit 1; }
sleep 3
xdotool windowfocus --sync "$window"
for prompt in "Tell me a story about a fox" "And then what happened" "Write more please"; do
    xdotool type --delay 10 "$prompt"
    xdotool key Return
    sleep 4
done
xdotool key --clearmodifiers ctrl+q
wait $app
grep "frame stats" "$log"
python3 - "$data/conversations.json" <<'PY'
import json, sys
for m in json.load(open(sys.argv[1]))[-1]["messages"]:
    s = m.get("stats")
    if s:
        print(f'{s["tokens"]} tokens at {s["tokens_per_s"]:.1f} tokens/s ({s["stop"]})')
PY
