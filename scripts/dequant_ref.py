#!/usr/bin/env python3
"""Reference dequantization of every tensor of a GGUF file with the `gguf` package (gguf-py).

Used by `cargo xtask check-dequant` to cross-check ggml-core's dequantization.

  dequant_ref.py hashes FILE          one JSON line per tensor:
                                      {"name", "type", "n_elements", "sha256"}  (sha256 of the little-endian
                                      float32 bytes, ggml element order), or {"name", "type", "n_elements",
                                      "skipped": reason} when gguf-py cannot dequantize that type
  dequant_ref.py dump FILE NAME OUT   writes tensor NAME dequantized as raw little-endian float32 to OUT
"""

import hashlib
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def as_f32(tensor) -> np.ndarray:
    """The tensor dequantized to a flat, contiguous little-endian float32 array (ggml order: ne0 fastest)."""
    values = dequantize(tensor.data, tensor.tensor_type)
    return np.ascontiguousarray(values, dtype="<f4").reshape(-1)


def cmd_hashes(path: str) -> int:
    reader = GGUFReader(path, "r")
    for tensor in reader.tensors:
        record = {
            "name": tensor.name,
            "type": tensor.tensor_type.name,
            "n_elements": int(tensor.n_elements),
        }
        try:
            values = as_f32(tensor)
        except NotImplementedError as err:
            record["skipped"] = str(err)
        else:
            if values.size != tensor.n_elements:
                print(f"{tensor.name}: dequantized {values.size} elements, expected {tensor.n_elements}",
                      file=sys.stderr)
                return 1
            record["sha256"] = hashlib.sha256(values.data).hexdigest()
        print(json.dumps(record), flush=True)
    return 0


def cmd_dump(path: str, name: str, out: str) -> int:
    reader = GGUFReader(path, "r")
    for tensor in reader.tensors:
        if tensor.name == name:
            as_f32(tensor).tofile(out)
            return 0
    print(f"no tensor named {name!r} in {path}", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "hashes":
        return cmd_hashes(argv[2])
    if len(argv) == 5 and argv[1] == "dump":
        return cmd_dump(argv[2], argv[3], argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
