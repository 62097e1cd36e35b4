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
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked "$@"
# The kernels again with naga's runtime bounds checks on (they run trusted above). Cargo unifies
# features over the packages whose targets are built, so one quick app test (no GPU) rides along:
# without it the app's dependencies drop out, features change, and half the tree compiles again.
BACKPACK_SHADER_CHECKS=1 cargo test --workspace --locked \
  --test kernels --test kernels_speech --test kernels_diffusion --test remote "$@"
# The package check reuses the test build (dev profile) rather than compiling everything again
# in release.
BACKPACK_DEB_PROFILE=dev tests/package.sh
