#!/usr/bin/env bash
# Tests the Windows build as a user would, under Wine, headless (Xvfb):
#   packaging/windows/test-wine.sh [OUT_DIR]   (default: target/windows from build.sh)
# In a fresh Wine prefix: the installer installs silently (/S) into the user's programs
# folder with its Start-menu entry; `backpack.exe --version`; `--self-test` (Wine's Vulkan
# reaches the host's driver, lavapipe here); `generate --json` on the tiny model gives the same
# tokens as the Linux binary, and `image` the same PNG; the window opens and is captured
# (screenshot.png); a silent uninstall removes the program and keeps the user's data;
# /REMOVEDATA removes it too.
# Needs Wine (Debian's wine and wine64), Xvfb and xwd; run as root it installs them when missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
meta=$(cargo metadata --format-version 1 --no-deps)
target_dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")
version=$(python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "backpack"))' <<<"$meta")
out=${1:-$target_dir/windows}
installer=$out/backpack-$version-setup.exe
linux_bin=${LINUX_BIN:-$target_dir/release/backpack}
[ -f "$installer" ] || { echo "no installer at $installer: run packaging/windows/build.sh" >&2; exit 1; }
if ! command -v wine >/dev/null || ! command -v Xvfb >/dev/null || ! command -v xwd >/dev/null; then
    [ "$(id -u)" -eq 0 ] || { echo "needs wine, wine64, xvfb and x11-apps" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q wine wine64 xvfb x11-apps
fi

failures=0
wine=${WINE:-wine}
check() { # what, command...
    local what=$1; shift
    if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}

work=$(mktemp -d)
export WINEPREFIX=$work/prefix WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
Xvfb -displayfd 1 -screen 0 1280x800x24 -nolisten tcp >"$work/display" 2>/dev/null &
xvfb=$!
trap 'wineserver -k 2>/dev/null; kill $xvfb 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/display" ] && break; sleep 0.1; done
export DISPLAY=":$(tr -d '[:space:]' <"$work/display")"
wineboot --init >/dev/null 2>&1
wineserver -w
# Rust's standard library draws random numbers through bcryptprimitives.dll's ProcessPrng,
# which Windows 10 and 11 have and Wine before 9.0 lacks: for such a Wine, a stand-in built
# here goes into the prefix's system32 (the test's prefix only; nothing shipped carries it).
system32=$WINEPREFIX/drive_c/windows/system32
if [ ! -e "$system32/bcryptprimitives.dll" ]; then
    cat >"$work/prng.c" <<'C'
#include <windows.h>
/* RtlGenRandom, as advapi32 exports it. */
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);
BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length) {
    while (length > 0) {
        ULONG n = length > 0x10000000 ? 0x10000000 : (ULONG)length;
        if (!SystemFunction036(data, n)) return FALSE;
        data += n;
        length -= n;
    }
    return TRUE;
}
C
    printf 'LIBRARY bcryptprimitives\nEXPORTS\n    ProcessPrng\n' >"$work/prng.def"
    x86_64-w64-mingw32-gcc -O2 -shared -o "$system32/bcryptprimitives.dll" "$work/prng.c" \
        "$work/prng.def" -ladvapi32 || echo "could not build the ProcessPrng stand-in" >&2
fi

# Wine offers its D3D12 translation of the host's Vulkan driver as a made-up GPU, and the host's
# Vulkan driver itself (lavapipe here) through winevulkan: the test asks for the latter.
export BACKPACK_ADAPTER=${BACKPACK_ADAPTER:-llvmpipe}

user_dir=$(ls -d "$WINEPREFIX"/drive_c/users/* | grep -v Public | head -1)
program=$user_dir/AppData/Local/Programs/Backpack
start_menu=$user_dir/AppData/Roaming/Microsoft/Windows/Start\ Menu/Programs
data=$user_dir/AppData/Roaming/backpack

"$wine" "$installer" /S
wineserver -w
check "installed: backpack.exe, icon and uninstaller" test -f "$program/backpack.exe" -a -f "$program/uninstall.exe" -a -f "$program/backpack.ico"
check "Start-menu entry" test -f "$start_menu/Backpack.lnk"
exe=$program/backpack.exe

"$wine" "$exe" --version >"$work/version" 2>&1
check "backpack.exe --version: $(tr -d '\r' <"$work/version")" grep -q "backpack $version" "$work/version"

"$wine" "$exe" --self-test >"$work/self-test" 2>&1
self_test=$?
tr -d '\r' <"$work/self-test" | tail -15
check "backpack.exe --self-test" test $self_test -eq 0

model=tests/fixtures/models/tiny-qwen2
args=(generate --model "$model" --prompt "Once upon a time" --max-tokens 12 --temperature 0 --json)
"$wine" "$exe" "${args[@]}" 2>"$work/generate.err" | tr -d '\r' >"$work/windows.json"
"$linux_bin" "${args[@]}" 2>/dev/null >"$work/linux.json"
python3 - "$work/windows.json" "$work/linux.json" <<'PY' || failures=$((failures + 1))
import json, sys
def tokens(path):
    lines = [l for l in open(path) if l.strip().startswith("{")]
    return json.loads(lines[-1])["tokens"] if lines else None
w, l = tokens(sys.argv[1]), tokens(sys.argv[2])
print(("ok" if w == l and w else "FAILED") + f": generate --json tokens, Windows {w} vs Linux {l}")
sys.exit(0 if w == l and w else 1)
PY
[ -s "$work/windows.json" ] || tail -5 "$work/generate.err"

# An image: the tiny FLUX.2 pipeline, same seed, the same PNG as the Linux binary writes.
image_args=(image --model tests/fixtures/models/tiny-flux2 --prompt "a red fox" --steps 2 --seed 7
    --width 32 --height 32 --dtype f32)
"$wine" "$exe" "${image_args[@]}" --out "Z:$work/windows.png" >/dev/null 2>"$work/image.err"
"$linux_bin" "${image_args[@]}" --out "$work/linux.png" >/dev/null 2>&1
check "image: the same PNG as the Linux binary's" cmp -s "$work/windows.png" "$work/linux.png"
[ -s "$work/windows.png" ] || tail -5 "$work/image.err"

# The window: opened by the Start-menu target, captured after it has drawn.
BACKPACK_DATA_DIR= "$wine" "$exe" >"$work/window.log" 2>&1 &
app=$!
sleep 20
xwd -root -silent >"$work/screen.xwd"
python3 - "$work/screen.xwd" "$out/screenshot.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
header = struct.unpack(">25I", data[:100])
size, w, h, bpl, ncolors = header[0], header[4], header[5], header[12], header[19]
pixels = data[size + ncolors * 12:]
rows = []
for y in range(h):
    row = pixels[y * bpl:y * bpl + w * 4]
    rows.append(b"\0" + bytes(b for i in range(0, len(row), 4) for b in (row[i + 2], row[i + 1], row[i])))
def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
png += chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b"")
open(sys.argv[2], "wb").write(png)
lit = sum(1 for r in rows for b in r[1:] if b > 16)
print(f"screenshot {w}x{h}, {lit} bright bytes -> {sys.argv[2]}")
PY
check "the window stays up" kill -0 $app
kill $app 2>/dev/null
wineserver -k 2>/dev/null; wineserver -w 2>/dev/null

# The user's data survives a silent uninstall; /REMOVEDATA removes it.
mkdir -p "$data/data" && echo keep >"$data/data/marker.txt"
"$wine" "$program/uninstall.exe" /S
wineserver -w; sleep 2
check "uninstalled: the program and its Start-menu entry are gone" test ! -e "$program/backpack.exe" -a ! -e "$start_menu/Backpack.lnk"
check "uninstalled: the user's data is kept" test -f "$data/data/marker.txt"
"$wine" "$installer" /S; wineserver -w
"$wine" "$program/uninstall.exe" /S /REMOVEDATA
wineserver -w; sleep 2
check "uninstall /REMOVEDATA removes the data too" test ! -e "$data"

ls -l "$installer" "$out/backpack-$version-windows-x64.zip" "$out/backpack.exe" 2>/dev/null
echo "$failures failure(s)"
exit $((failures > 0))
