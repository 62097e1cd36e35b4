#!/usr/bin/env python3
"""Build reference fixtures for the CPU dequantizers (and legacy quantizers) of GGML/GGUF types.

What it makes:

    tests/fixtures/quant/blocks.json

with two lists, both computed by the `gguf` Python package (gguf-py, the numpy
implementation that ships with llama.cpp), which is independent of the engine's Rust code:

  "dequantize": one record per (type, case) for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
      Q5_1, Q4_K, Q5_K, Q6_K:
        {"type": "Q4_K", "ggml_type_id": 12, "block_elems": 256, "block_bytes": 144,
         "case": "random", "n_blocks": 3, "bytes_hex": "...", "values": [...]}
      `values` is gguf.quants.dequantize(bytes) as float32, each written as the repr of
      the exact double value of that float32 (parse as f64, cast to f32: exact).
      Cases for the block types: "random" (3 blocks of random payload bytes),
      "payload_00" and "payload_ff" (1 block whose non-f16 bytes are all 0x00 / 0xFF),
      "subnormal_scales" (1 block whose f16 scale fields are f16 subnormals).
      The f16 scale fields (d, dmin, m) are always finite, so every value is finite.
      Cases for F32/F16/BF16 (block_elems 1): "random" (96 random finite bit patterns)
      and "special" (zeros, signed zero, subnormals, extreme normals, ...).

  "quantize": for the types gguf-py can quantize (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1;
      it has no quantizer for Q4_K/Q5_K/Q6_K, listed under "quantize_unsupported"):
        {"type": "Q4_0", ..., "case": "random", "input": [...], "bytes_hex": "...",
         "values": [...dequantize(bytes_hex)...]}
      so a Rust quantizer can be checked for identical bytes, or at least for
      dequantize(quantize(x)) == values.

Run from anywhere (CPU only, no network; needs numpy and `pip install gguf`):

    python3 tests/reference/make_quant_blocks.py            # write the fixture
    python3 tests/reference/make_quant_blocks.py --check    # only verify the file is current

Running it again regenerates a byte-identical file (fixed numpy seed, no timestamps).
Before writing, a self-check re-derives every dequantized value with plain scalar code
written from ggml's C reference (dequantize_row_* in ggml-quants.c) and the legacy
quantizers likewise, and asserts bit-for-bit agreement with gguf-py; the scalar code is
also the most direct description of each layout for the Rust implementation.
"""

import argparse
import json
import math
import os
import struct
import sys
from importlib import metadata

import numpy as np

import gguf
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_PATH = os.path.join(REPO_ROOT, "tests", "fixtures", "quant", "blocks.json")
GENERATOR = "tests/reference/make_quant_blocks.py"
SEED = 20240611

DEQUANT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
                 "MXFP4"]
QUANT_TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
QUANT_UNSUPPORTED = ["Q4_K", "Q5_K", "Q6_K"]

# Byte offsets of the f16 scale fields inside one block, per gguf-py's quants.py
# (block_q4_0 etc. in ggml-common.h). Every other byte of a block is "payload".
# Q6_K stores its f16 d at the END of the block, after ql[128], qh[64], scales[16].
F16_FIELDS = {
    "Q8_0": [0],          # d | qs[32] int8
    "Q4_0": [0],          # d | qs[16]
    "Q4_1": [0, 2],       # d, m | qs[16]
    "Q5_0": [0],          # d | qh[4] | qs[16]
    "Q5_1": [0, 2],       # d, m | qh[4] | qs[16]
    "Q4_K": [0, 2],       # d, dmin | scales[12] | qs[128]
    "Q5_K": [0, 2],       # d, dmin | scales[12] | qh[32] | qs[128]
    "Q6_K": [208],        # ql[128] | qh[64] | scales[16] int8 | d
    "MXFP4": [],          # e8m0 exponent byte | qs[16] (no f16 field)
}


def qtype(name):
    return GGMLQuantizationType[name]


def f32_repr_list(arr):
    """float32 array -> list of Python floats (exact double value of each float32).

    json writes a Python float with repr, the shortest string that reads back as the same
    double; since that double is exactly the float32, parsing it as f64 and casting to
    f32 is exact."""
    arr = np.asarray(arr, dtype=np.float32)
    assert np.all(np.isfinite(arr)), "fixture values must be finite (JSON has no NaN/Inf)"
    return [float(v) for v in arr]


# ---------------------------------------------------------------------------
# Building raw blocks
# ---------------------------------------------------------------------------

def sane_f16(rng, n):
    """Random finite f16 scales with magnitude in [0.001, 0.1] and random sign, so that
    dequantized values stay small and finite whatever the payload bytes are."""
    mag = rng.uniform(0.001, 0.1, size=n)
    sign = np.where(rng.integers(0, 2, size=n) == 1, -1.0, 1.0)
    return (mag * sign).astype(np.float16)


def block_bytes(rng, name, n_blocks, fill=None, scales=None):
    """Raw bytes of n_blocks blocks of a block type: payload random (or all `fill`),
    f16 scale fields set from `scales` (an f16 array per field) or sane random values."""
    _, type_size = GGML_QUANT_SIZES[qtype(name)]
    if fill is None:
        raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    else:
        raw = np.full((n_blocks, type_size), fill, dtype=np.uint8)
    for k, off in enumerate(F16_FIELDS[name]):
        vals = sane_f16(rng, n_blocks) if scales is None else scales[k]
        raw[:, off:off + 2] = np.asarray(vals, dtype=np.float16).reshape(n_blocks, 1).view(np.uint8)
    return raw.tobytes()


def float_bytes(rng, name, n):
    """Random finite bit patterns for F32/F16/BF16 (all exponents but the all-ones one,
    so normals, subnormals and zeros of both signs can all appear)."""
    if name == "F32":
        bits = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
        exp = (bits >> 23) & 0xFF
        bits = np.where(exp == 0xFF, bits & np.uint32(0xBFFFFFFF), bits)  # clear an exponent bit
        return bits.astype("<u4").tobytes()
    bits = rng.integers(0, 2**16, size=n, dtype=np.uint32).astype(np.uint16)
    if name == "F16":
        exp = (bits >> 10) & 0x1F
        bits = np.where(exp == 0x1F, bits & np.uint16(0xBFFF), bits)
    else:  # BF16: same exponent layout as f32
        exp = (bits >> 7) & 0xFF
        bits = np.where(exp == 0xFF, bits & np.uint16(0xBFFF), bits)
    return bits.astype("<u2").tobytes()


# Bit patterns that stress a half/bfloat16 -> f32 conversion: +-0, smallest and largest
# subnormal, smallest normal, 1.0, -2.0, largest finite (both signs), a value just below 1.
SPECIAL_BITS = {
    "F16": [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x3C00, 0xC000, 0x7BFF, 0xFBFF, 0x3BFF],
    "BF16": [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x3F80, 0xC000, 0x7F7F, 0xFF7F, 0x3F7F],
    "F32": [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000,
            0x3F800000, 0xC0000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F7FFFFF],
}


def mxfp4_cases(rng):
    """MXFP4 blocks: random (exponents near 127), every one of the 16 codes at every position
    parity (the bytes 0x10·i + j run through all pairs), and the exponent extremes 0, 1
    (ggml's subnormal halves), 2, 127 and 252, the largest whose ±12 stays finite in f32
    (above it the largest codes overflow; JSON cannot hold the infinities)."""
    random = bytearray(rng.integers(0, 256, size=3 * 17, dtype=np.uint8).tobytes())
    for blk in range(3):
        random[17 * blk] = 120 + int(rng.integers(0, 15))
    every_code = bytearray()
    for first in range(0, 256, 16):
        every_code += bytes([127]) + bytes((first + j) & 0xFF for j in range(16))
    extremes = bytearray()
    for e in (0, 1, 2, 127, 252):
        extremes += bytes([e]) + bytes(range(0x0F, 0x100, 0x10))
    return [("random", bytes(random)), ("every_code", bytes(every_code)),
            ("exponent_extremes", bytes(extremes))]


def dequant_records(rng):
    records = []
    for name in DEQUANT_TYPES:
        qt = qtype(name)
        block_elems, type_size = GGML_QUANT_SIZES[qt]
        if name == "MXFP4":
            cases = mxfp4_cases(rng)
        elif name in SPECIAL_BITS:
            cases = [("random", float_bytes(rng, name, 96))]
            fmt = "<u4" if name == "F32" else "<u2"
            cases.append(("special", np.array(SPECIAL_BITS[name], dtype=fmt).tobytes()))
        else:
            n_f16 = len(F16_FIELDS[name])
            # f16 subnormals: d the largest subnormal-ish, dmin/m the smallest; real K-quant
            # files do carry subnormal dmin values.
            sub = [np.array([0x03A7], dtype=np.uint16).view(np.float16),
                   np.array([0x8005], dtype=np.uint16).view(np.float16)][:n_f16]
            cases = [
                ("random", block_bytes(rng, name, 3)),
                ("payload_00", block_bytes(rng, name, 1, fill=0x00)),
                ("payload_ff", block_bytes(rng, name, 1, fill=0xFF)),
                ("subnormal_scales", block_bytes(rng, name, 1, scales=sub)),
            ]
        for case, raw in cases:
            assert len(raw) % type_size == 0
            values = gguf.quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qt)
            values = np.asarray(values, dtype=np.float32).reshape(-1)
            assert values.size == len(raw) // type_size * block_elems
            records.append({
                "type": name,
                "ggml_type_id": int(qt),
                "block_elems": block_elems,
                "block_bytes": type_size,
                "case": case,
                "n_blocks": len(raw) // type_size,
                "bytes_hex": raw.hex(),
                "values": f32_repr_list(values),
            })
    return records


def quant_records(rng):
    records = []
    for name in QUANT_TYPES:
        qt = qtype(name)
        block_elems, type_size = GGML_QUANT_SIZES[qt]
        n = 64  # two 32-element blocks (64 elements for the per-element float types too)
        random = (rng.standard_normal(n) * rng.uniform(0.01, 2.0)).astype(np.float32)
        # Edge block pair: an all-zero block (scale 0 -> the "id = 0" branch), then a
        # block whose largest magnitude appears as -M before +M (Q4_0/Q5_0 take the
        # FIRST element of largest |x| as the signed max) and with a constant run.
        edge = np.zeros(n, dtype=np.float32)
        tail = (rng.standard_normal(32) * 0.5).astype(np.float32)
        tail[3], tail[20] = -1.75, 1.75
        tail[24:28] = 0.25
        edge[32:] = tail
        for case, x in [("random", random), ("zero_and_tie", edge)]:
            q = gguf.quants.quantize(x, qt)
            raw = np.ascontiguousarray(q).view(np.uint8).tobytes()
            assert len(raw) == n // block_elems * type_size
            values = np.asarray(gguf.quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qt), dtype=np.float32)
            records.append({
                "type": name,
                "ggml_type_id": int(qt),
                "block_elems": block_elems,
                "block_bytes": type_size,
                "case": case,
                "input": f32_repr_list(x),
                "bytes_hex": raw.hex(),
                "values": f32_repr_list(values.reshape(-1)),
            })
    return records


# ---------------------------------------------------------------------------
# Self-check: scalar code following ggml-quants.c, compared bit for bit with gguf-py.
# Arithmetic uses np.float32 scalars in ggml's operation order (no fused multiply-add),
# which is what a plain Rust f32 implementation computes.
# ---------------------------------------------------------------------------

F = np.float32


def h(b, off):
    """Little-endian IEEE half at b[off:off+2] -> float32 (via struct, not numpy)."""
    return F(struct.unpack_from("<e", b, off)[0])


def deq_scalar(name, b):
    """Scalar dequantizer for one block `b` (bytes) of a block type, or whole buffer for
    F32/F16/BF16."""
    y = []
    if name == "MXFP4":
        # ggml_e8m0_to_fp32_half: 2^(e - 128) from its bits; doubled e2m1 values.
        e = b[0]
        bits_ = (0x00200000 << e) if e < 2 else ((e - 1) << 23)
        d = F(struct.unpack("<f", struct.pack("<I", bits_))[0])
        kvalues = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
        qs = b[1:17]
        return [F(kvalues[q & 0x0F]) * d for q in qs] + [F(kvalues[q >> 4]) * d for q in qs]
    if name == "F32":
        return [F(v) for v in struct.unpack("<%df" % (len(b) // 4), b)]
    if name == "F16":
        return [h(b, i) for i in range(0, len(b), 2)]
    if name == "BF16":
        return [F(struct.unpack("<f", struct.pack("<I", struct.unpack_from("<H", b, i)[0] << 16))[0])
                for i in range(0, len(b), 2)]
    if name == "Q8_0":
        d = h(b, 0)
        return [F(struct.unpack_from("<b", b, 2 + j)[0]) * d for j in range(32)]
    if name in ("Q4_0", "Q4_1"):
        # element j (0..15) = low nibble of qs[j], element j+16 = high nibble of qs[j]
        d = h(b, 0)
        m = h(b, 2) if name == "Q4_1" else None
        qs = b[4:] if name == "Q4_1" else b[2:]
        lo = [qs[j] & 0x0F for j in range(16)]
        hi = [qs[j] >> 4 for j in range(16)]
        if name == "Q4_0":
            return [F(q - 8) * d for q in lo + hi]
        return [F(q) * d + m for q in lo + hi]
    if name in ("Q5_0", "Q5_1"):
        # 5th bit of element j (0..31) = bit j of the little-endian u32 qh
        d = h(b, 0)
        if name == "Q5_1":
            m = h(b, 2)
            qh, qs = struct.unpack_from("<I", b, 4)[0], b[8:]
        else:
            qh, qs = struct.unpack_from("<I", b, 2)[0], b[6:]
        out = [0] * 32
        for j in range(16):
            out[j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4)
            out[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)
        if name == "Q5_0":
            return [F(q - 16) * d for q in out]
        return [F(q) * d + m for q in out]
    if name in ("Q4_K", "Q5_K"):
        d, dmin = h(b, 0), h(b, 2)
        sc12 = b[4:16]

        def scale_min(j):  # get_scale_min_k4
            if j < 4:
                return sc12[j] & 63, sc12[j + 4] & 63
            return ((sc12[j + 4] & 0x0F) | ((sc12[j - 4] >> 6) << 4),
                    (sc12[j + 4] >> 4) | ((sc12[j] >> 6) << 4))

        if name == "Q4_K":
            qh, qs = None, b[16:144]
        else:
            qh, qs = b[16:48], b[48:176]
        # 4 chunks of 64 elements; chunk c uses qs[32c .. 32c+32]: low nibbles are
        # sub-block 2c, high nibbles sub-block 2c+1. Q5_K: 5th bit of sub-block s,
        # position l is bit s of qh[l].
        for c in range(4):
            for half in range(2):
                s = 2 * c + half
                sc, mn = scale_min(s)
                d1, m1 = d * F(sc), dmin * F(mn)
                for l in range(32):
                    q = (qs[32 * c + l] >> (4 * half)) & 0x0F
                    if qh is not None:
                        q |= ((qh[l] >> s) & 1) << 4
                    y.append(d1 * F(q) - m1)
        return y
    if name == "Q6_K":
        ql, qh, sc = b[0:128], b[128:192], struct.unpack_from("<16b", b, 192)
        d = h(b, 208)
        y = [None] * 256
        # two halves of 128 elements; half n uses ql[64n..64n+64], qh[32n..32n+32],
        # scales[8n..8n+8]; each scale covers 16 consecutive elements.
        for n in range(2):
            QL, QH, S = ql[64 * n:64 * n + 64], qh[32 * n:32 * n + 32], sc[8 * n:8 * n + 8]
            for l in range(32):
                i = l // 16
                q1 = ((QL[l] & 0xF) | (((QH[l] >> 0) & 3) << 4)) - 32
                q2 = ((QL[l + 32] & 0xF) | (((QH[l] >> 2) & 3) << 4)) - 32
                q3 = ((QL[l] >> 4) | (((QH[l] >> 4) & 3) << 4)) - 32
                q4 = ((QL[l + 32] >> 4) | (((QH[l] >> 6) & 3) << 4)) - 32
                base = 128 * n
                y[base + l] = d * F(S[i]) * F(q1)
                y[base + l + 32] = d * F(S[i + 2]) * F(q2)
                y[base + l + 64] = d * F(S[i + 4]) * F(q3)
                y[base + l + 96] = d * F(S[i + 6]) * F(q4)
        return y
    raise ValueError(name)


def roundf(x):
    """C roundf: halves away from zero. x is a float32 value, so |x| + 0.5 is exact in f64."""
    return math.copysign(math.floor(abs(float(x)) + 0.5), float(x))


def quant_scalar(name, x):
    """Scalar legacy quantizers following quantize_row_*_ref in ggml-quants.c; returns bytes."""
    out = bytearray()
    f16 = lambda v: struct.pack("<e", float(F(v)))  # noqa: E731  (round to nearest even)
    for blk in range(len(x) // 32):
        v = [F(t) for t in x[32 * blk:32 * blk + 32]]
        if name == "Q8_0":
            amax = max(abs(t) for t in v)
            d = amax / F(127)
            idv = F(1) / d if d != 0 else F(0)
            out += f16(d) + bytes(int(roundf(float(t * idv))) & 0xFF for t in v)
        elif name in ("Q4_0", "Q5_0"):
            amax, mx = F(0), F(0)
            for t in v:  # first element of largest |x|, sign kept
                if amax < abs(t):
                    amax, mx = abs(t), t
            top = 8 if name == "Q4_0" else 16
            d = mx / F(-top)
            idv = F(1) / d if d != 0 else F(0)
            q = [min(2 * top - 1, int(t * idv + F(top + 0.5))) for t in v]
            qs = bytes((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4) for j in range(16))
            if name == "Q4_0":
                out += f16(d) + qs
            else:
                qh = sum(((q[j] >> 4) & 1) << j for j in range(32))
                out += f16(d) + struct.pack("<I", qh) + qs
        elif name in ("Q4_1", "Q5_1"):
            lo, hi = min(v), max(v)
            top = 15 if name == "Q4_1" else 31
            d = (hi - lo) / F(top)
            idv = F(1) / d if d != 0 else F(0)
            q = [min(top, int((t - lo) * idv + F(0.5))) for t in v]
            qs = bytes((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4) for j in range(16))
            if name == "Q4_1":
                out += f16(d) + f16(lo) + qs
            else:
                qh = sum(((q[j] >> 4) & 1) << j for j in range(32))
                out += f16(d) + f16(lo) + struct.pack("<I", qh) + qs
        else:
            raise ValueError(name)
    return bytes(out)


def bits(vals):
    return np.asarray(vals, dtype=np.float32).view(np.uint32)


def self_check(doc):
    n_checked = 0
    for r in doc["dequantize"]:
        raw = bytes.fromhex(r["bytes_hex"])
        if r["block_elems"] == 1:
            ours = deq_scalar(r["type"], raw)
        else:
            ours = []
            for i in range(0, len(raw), r["block_bytes"]):
                ours += deq_scalar(r["type"], raw[i:i + r["block_bytes"]])
        ref = np.array(r["values"], dtype=np.float64).astype(np.float32)
        # exact float32 agreement, compared as bits (-0.0 vs 0.0 included)
        assert np.array_equal(bits(ours), bits(ref)), f"scalar dequant disagrees: {r['type']} {r['case']}"
        assert np.array_equal(np.float64(ref), np.array(r["values"])), "values not exact float32"
        n_checked += len(ours)
    for r in doc["quantize"]:
        x = np.array(r["input"], dtype=np.float64).astype(np.float32)
        if r["type"] in ("F16", "BF16"):
            continue  # element-wise round-to-nearest-even, covered by the byte check below
        ours = quant_scalar(r["type"], x)
        assert ours.hex() == r["bytes_hex"], f"scalar quant disagrees: {r['type']} {r['case']}"
    # F16/BF16 quantization: round to nearest even, independently of gguf-py.
    for r in doc["quantize"]:
        x = np.array(r["input"], dtype=np.float32)
        if r["type"] == "F16":
            assert b"".join(struct.pack("<e", float(t)) for t in x).hex() == r["bytes_hex"]
        elif r["type"] == "BF16":
            u = x.view(np.uint32).astype(np.uint64)
            rne = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
            assert rne.tobytes().hex() == r["bytes_hex"]
    return n_checked


# ---------------------------------------------------------------------------

def build():
    rng = np.random.default_rng(SEED)
    return {
        "generator": GENERATOR,
        "gguf_py_version": metadata.version("gguf"),
        "seed": SEED,
        "note": "values: float32 written as the exact double; parse as f64 then cast to f32",
        "quantize_unsupported": QUANT_UNSUPPORTED,
        "dequantize": dequant_records(rng),
        "quantize": quant_records(rng),
    }


def serialize(doc):
    """One record per line, so a regenerated file diffs readably."""
    lines = ["{"]
    scalars = [k for k in doc if k not in ("dequantize", "quantize")]
    for k in scalars:
        lines.append(f"  {json.dumps(k)}: {json.dumps(doc[k], allow_nan=False)},")
    for li, key in enumerate(("dequantize", "quantize")):
        lines.append(f"  {json.dumps(key)}: [")
        recs = doc[key]
        for i, r in enumerate(recs):
            sep = "," if i + 1 < len(recs) else ""
            lines.append("    " + json.dumps(r, allow_nan=False, separators=(",", ":")) + sep)
        lines.append("  ]" + ("," if li == 0 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="verify the committed file is current; write nothing")
    args = ap.parse_args()

    doc = build()
    text = serialize(doc)
    # the serialized form must round-trip to the same document
    assert json.loads(text) == doc
    n = self_check(json.loads(text))

    if args.check:
        with open(OUT_PATH, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{OUT_PATH} is out of date; rerun {GENERATOR}", file=sys.stderr)
                sys.exit(1)
        print(f"{OUT_PATH} is current ({n} dequantized values self-checked)")
        return

    os.makedirs(os.path.dirname(OUT_PATH), exist_ok=True)
    with open(OUT_PATH, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUT_PATH} ({len(text.encode())} bytes, {len(doc['dequantize'])} dequantize and "
          f"{len(doc['quantize'])} quantize records; {n} values self-checked against scalar code)")


if __name__ == "__main__":
    main()
