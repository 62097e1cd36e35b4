#!/usr/bin/env bash
# The whole test suite, from a fresh Debian/Ubuntu machine: installs what is missing (as root),
# then checks formatting and lints and runs every test. GPU tests run on whatever Vulkan device
# exists, lavapipe (Mesa's software driver) when there is no GPU. Then the .deb is built from
# the same build, installed, run and removed (tests/package.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/setup.sh
backpack_setup --tests

cargo fmt --all -- --check
# Lints ride on the test build: clippy-driver compiles the workspace's own crates (what `cargo
# clippy -- -D warnings` would lint: libraries, binaries, tests, examples) while dependencies
# build with plain rustc, so the dependency tree compiles once rather than a second time for
# clippy's check pass (8.5 minutes of a cold run on 2 cores). Exported, so the runs below and
# the package build reuse this build.
if ! clippy_driver=$(command -v clippy-driver); then
    echo "error: clippy-driver not found (rustup component add clippy)" >&2
    exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
# clippy-driver's own encoding of `cargo clippy -- -D warnings`.
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
cargo test --workspace --locked "$@"
# The kernels again with naga's runtime bounds checks on (they run trusted above). Cargo unifies
# features over the packages whose targets are built, so one quick app test (no GPU) rides along:
# without it the app's dependencies drop out, features change, and half the tree compiles again.
BACKPACK_SHADER_CHECKS=1 cargo test --workspace --locked \
  --test kernels --test kernels_speech --test kernels_diffusion --test kernels_dit --test remote "$@"
# The package check reuses the test build (dev profile) rather than compiling everything again
# in release.
BACKPACK_DEB_PROFILE=dev tests/package.sh
