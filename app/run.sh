#!/usr/bin/env bash
# Builds and runs Backpack from a fresh Debian/Ubuntu machine, installing what is missing (as
# root). Arguments go to the `backpack` binary, e.g.:
#   app/run.sh generate --model ~/models/SmolLM2-360M-Instruct --prompt "Hello"
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/setup.sh
backpack_setup
exec cargo run --release --locked -p backpack -- "$@"
