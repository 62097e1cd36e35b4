#!/usr/bin/env bash
# The Debian package end to end: build it (cargo-deb), install it with its dependencies, run the
# installed binary (--version, --self-test on whatever GPU exists, lavapipe in CI), launch the
# installed app under Xvfb (tests/gui_smoke.rs pointed at /usr/bin/backpack), remove it, and
# check that none of its files are left. Installing needs root; run by tests/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/setup.sh
backpack_setup --tests

if [ "$(id -u)" != 0 ]; then
    echo "package check needs root (dpkg -i); skipped" >&2
    exit 0
fi
if ! cargo deb --version >/dev/null 2>&1; then
    cargo install cargo-deb --version 3.8.0 --locked
fi

out="$CARGO_TARGET_DIR/debian"
rm -rf "$out"
# BACKPACK_DEB_PROFILE=dev (tests/run.sh) packages the binary the tests already built, so the
# suite compiles the dependency tree once; a release package is the default.
cargo deb -p backpack --locked --profile "${BACKPACK_DEB_PROFILE:-release}" --strip --output "$out/"
deb=$(ls "$out"/backpack_*.deb)
echo "built $deb"
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
dpkg-deb --contents "$deb"

# apt resolves the Depends line (Vulkan loader, X11/Wayland client libraries, ALSA).
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$deb" >/dev/null
files=$(dpkg -L backpack)
for f in /usr/bin/backpack /usr/share/applications/backpack.desktop \
    /usr/share/metainfo/io.backpack.Backpack.metainfo.xml \
    /usr/share/icons/hicolor/scalable/apps/backpack.svg \
    /usr/share/icons/hicolor/256x256/apps/backpack.png; do
    [ -f "$f" ] || { echo "missing after install: $f" >&2; exit 1; }
done
if file /usr/bin/backpack | grep -q "not stripped"; then
    echo "/usr/bin/backpack is not stripped" >&2
    exit 1
fi

version=$(/usr/bin/backpack --version)
[ "$version" = "backpack $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)" ] ||
    { echo "unexpected --version: $version" >&2; exit 1; }
/usr/bin/backpack --self-test
BACKPACK_BIN=/usr/bin/backpack cargo test -p backpack --locked --test gui_smoke

dpkg -r backpack >/dev/null
left=0
for f in $files; do
    if [ -f "$f" ] || [ -L "$f" ]; then
        echo "left behind: $f" >&2
        left=1
    fi
done
[ $left = 0 ] || exit 1
echo "package installed, ran, and removed cleanly"
