#!/usr/bin/env python3
"""Generate the quantization test vectors in ggml-core/tests/data/quant/.

The expected values come from the `gguf` PyPI package (gguf-py, the reference numpy
implementation shipped with llama.cpp; version 0.19 was used), so that
ggml-core's `quant::dequantize_row` / `quant::quantize_row` are checked against an
independent implementation, bit for bit, by ggml-core/tests/quant_vectors.rs.

Regenerate (from the repository root):

    python3 -m venv /tmp/qvenv && /tmp/qvenv/bin/pip install "gguf==0.19.*" numpy
    /tmp/qvenv/bin/python scripts/gen_quant_vectors.py

The output is deterministic for a given seed (`--seed`, default 20240531) and
gguf/numpy version.

Files (all integers and floats little-endian):

  <type>.dequant.bin   b"GQDQ", u32 gguf type id, u32 n_blocks,
                       n_blocks * type_size bytes of blocks,
                       n_blocks * block_size f32 expected values
                       (gguf.quants.dequantize; gguf-py has no Q8_1 / Q8_K
                       dequantizer, for those the expected values are computed
                       here with numpy as ggml does: f32(d) * f32(q)).
  <type>.quant.bin     b"GQQT", u32 gguf type id, u32 n_elements,
                       n_elements f32 inputs, then the expected encoded bytes
                       (gguf.quants.quantize, only for the types gguf-py can
                       quantize: F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4).

Blocks are random bytes whose scale fields are overwritten with finite, sane
values (f16 scales from about 1e-5 to 60, zeros, negatives and a few subnormals;
never NaN or Inf). The float-type fixtures use fully random bit patterns,
including NaN and Inf, since the conversions are defined for them.
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf import quants

OUT = Path(__file__).resolve().parent.parent / "ggml-core" / "tests" / "data" / "quant"

# name used for the files -> (type, number of blocks, byte offsets of f16 scale fields)
DEQUANT_TYPES = {
    "q4_0": (T.Q4_0, 256, [0]),
    "q4_1": (T.Q4_1, 256, [0, 2]),
    "q5_0": (T.Q5_0, 256, [0]),
    "q5_1": (T.Q5_1, 256, [0, 2]),
    "q8_0": (T.Q8_0, 256, [0]),
    "q8_1": (T.Q8_1, 256, [0, 2]),
    "q4_K": (T.Q4_K, 96, [0, 2]),
    "q5_K": (T.Q5_K, 96, [0, 2]),
    "q6_K": (T.Q6_K, 96, [208]),
    "q8_K": (T.Q8_K, 96, []),  # f32 scale at 0, handled below
    "mxfp4": (T.MXFP4, 256, []),  # E8M0 byte at 0: every value is finite
}

QUANT_TYPES = {
    "f16": T.F16,
    "bf16": T.BF16,
    "q4_0": T.Q4_0,
    "q4_1": T.Q4_1,
    "q5_0": T.Q5_0,
    "q5_1": T.Q5_1,
    "q8_0": T.Q8_0,
    "mxfp4": T.MXFP4,
}


def sizes(qtype: T) -> tuple[int, int]:
    """(block_size, type_size). gguf-py's table still says 40 bytes for Q8_1 (the old f32 d and s);
    ggml and ggml-core use 36 (f16 d, f16 s), which is what the fixtures use."""
    if qtype == T.Q8_1:
        return (32, 2 + 2 + 32)
    return GGML_QUANT_SIZES[qtype]


def sane_scales(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    """Finite scales over many magnitudes, with zeros, negatives and a few tiny values."""
    mag = 10.0 ** rng.uniform(-5, 1.8, n)
    v = rng.standard_normal(n) * mag
    v[rng.random(n) < 0.03] = 0.0
    v[rng.random(n) < 0.02] = 3e-7 * rng.standard_normal()  # f16 subnormal range
    return v.astype(dtype)


def dequant_expected(qtype: T, blocks: np.ndarray) -> np.ndarray:
    if qtype == T.Q8_1:
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (d * blocks[:, 4:].copy().view(np.int8).astype(np.float32)).ravel()
    if qtype == T.Q8_K:
        d = blocks[:, 0:4].copy().view(np.float32)
        return (d * blocks[:, 4:260].copy().view(np.int8).astype(np.float32)).ravel()
    return quants.dequantize(blocks.ravel(), qtype).astype(np.float32, copy=False).ravel()


def make_blocks(rng: np.random.Generator, qtype: T, n: int, offsets: list[int]) -> np.ndarray:
    block_size, type_size = sizes(qtype)
    blocks = rng.integers(0, 256, size=(n, type_size), dtype=np.uint8)
    for off in offsets:
        blocks[:, off : off + 2] = sane_scales(rng, n, np.float16).view(np.uint8).reshape(n, 2)
    if qtype == T.Q8_K:
        blocks[:, 0:4] = sane_scales(rng, n, np.float32).view(np.uint8).reshape(n, 4)
    # Edge blocks: all-zero bytes, and the largest finite scales with all-ones quant bits.
    blocks[0, :] = 0
    blocks[1, :] = 0xFF
    for off in offsets:
        blocks[1, off : off + 2] = np.array([65504.0], dtype=np.float16).view(np.uint8)
    if qtype == T.Q8_K:
        blocks[1, 0:4] = np.array([1e30], dtype=np.float32).view(np.uint8)
    return blocks


def write_dequant(rng: np.random.Generator, name: str, qtype: T, n: int, offsets: list[int]) -> int:
    blocks = make_blocks(rng, qtype, n, offsets)
    expected = dequant_expected(qtype, blocks)
    block_size, _ = sizes(qtype)
    assert expected.dtype == np.float32 and expected.size == n * block_size, (name, expected.dtype, expected.shape)
    data = b"GQDQ" + struct.pack("<II", int(qtype), n) + blocks.tobytes() + expected.astype("<f4").tobytes()
    (OUT / f"{name}.dequant.bin").write_bytes(data)
    return len(data)


def write_float_dequant(rng: np.random.Generator, name: str, qtype: T, n: int) -> int:
    """Random bit patterns, NaN and Inf included, for F32 / F16 / BF16 rows."""
    width = 4 if qtype == T.F32 else 2
    raw = rng.integers(0, 256, size=n * width, dtype=np.uint8)
    if qtype == T.BF16:
        expected = quants.dequantize(raw, qtype)
    elif qtype == T.F16:
        expected = raw.view(np.float16).astype(np.float32)
    else:
        expected = raw.view(np.float32)
    data = b"GQDQ" + struct.pack("<II", int(qtype), n) + raw.tobytes() + np.asarray(expected, dtype="<f4").tobytes()
    (OUT / f"{name}.dequant.bin").write_bytes(data)
    return len(data)


def quant_inputs(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """Rows of 32-element blocks with per-block magnitudes, plus odd blocks."""
    x = rng.standard_normal((n_blocks, 32)) * (10.0 ** rng.uniform(-3, 2, (n_blocks, 1)))
    x[0] = 0.0  # all zeros
    x[1] = 1.25  # constant
    x[2] = -3.0  # negative constant
    x[3, :] = rng.standard_normal(32) * 1e-3
    x[3, 7] = 500.0  # one outlier
    x[4] = np.linspace(-1.0, 1.0, 32)  # exact ties for some formats
    x[5] = rng.uniform(0.5, 2.0, 32)  # all positive (min > 0)
    return x.astype(np.float32).ravel()


def write_quant(rng: np.random.Generator, name: str, qtype: T, n_blocks: int) -> int:
    x = quant_inputs(rng, n_blocks)
    if qtype == T.F16:
        expected = x.astype(np.float16).view(np.uint8)
    else:
        expected = quants.quantize(x, qtype).view(np.uint8)
    data = b"GQQT" + struct.pack("<II", int(qtype), x.size) + x.astype("<f4").tobytes() + expected.tobytes()
    (OUT / f"{name}.quant.bin").write_bytes(data)
    return len(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20240531)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    np.seterr(over="ignore")  # the edge blocks overflow to inf on purpose (largest scales)
    OUT.mkdir(parents=True, exist_ok=True)
    total = 0
    for name, (qtype, n, offsets) in DEQUANT_TYPES.items():
        total += write_dequant(rng, name, qtype, n, offsets)
    for name, qtype in (("f32", T.F32), ("f16", T.F16), ("bf16", T.BF16)):
        total += write_float_dequant(rng, name, qtype, 2048)
    for name, qtype in QUANT_TYPES.items():
        total += write_quant(rng, name, qtype, 64)
    print(f"wrote {total} bytes to {OUT}")


if __name__ == "__main__":
    main()
