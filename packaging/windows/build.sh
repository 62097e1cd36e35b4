#!/usr/bin/env bash
# Builds Backpack for Windows from Linux: the per-user installer and the portable zip.
#   packaging/windows/build.sh
#   → target/windows/backpack-<version>-setup.exe and backpack-<version>-windows-x64.zip
#     (under $CARGO_TARGET_DIR when that is set)
# Cross-compiles backpack.exe for x86_64-pc-windows-gnu with rustup's target and Debian's
# MinGW-w64 (installed here when missing and run as root, with nsis and zip), then packs it with
# makensis (packaging/windows/backpack.nsi) and zip.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
target=x86_64-pc-windows-gnu

missing=()
command -v x86_64-w64-mingw32-gcc-posix >/dev/null || missing+=(gcc-mingw-w64-x86-64-posix g++-mingw-w64-x86-64-posix)
command -v makensis >/dev/null || missing+=(nsis)
command -v zip >/dev/null || missing+=(zip)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "missing: ${missing[*]} (apt-get install them, or run as root)" >&2
        exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
rustup target list --installed | grep -qx "$target" || rustup target add "$target"

cargo build --release --locked --target "$target" -p backpack
meta=$(cargo metadata --format-version 1 --no-deps)
target_dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")
version=$(python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "backpack"))' <<<"$meta")
out=$target_dir/windows
mkdir -p "$out"
x86_64-w64-mingw32-strip -o "$out/backpack.exe" "$target_dir/$target/release/backpack.exe"
makensis -V2 -DVERSION="$version" -DEXE="$out/backpack.exe" \
    -DOUT="$out/backpack-$version-setup.exe" packaging/windows/backpack.nsi
rm -f "$out/backpack-$version-windows-x64.zip"
zip -j -q "$out/backpack-$version-windows-x64.zip" "$out/backpack.exe" LICENSE
ls -l "$out/backpack.exe" "$out/backpack-$version-setup.exe" "$out/backpack-$version-windows-x64.zip"
