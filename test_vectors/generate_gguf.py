#!/usr/bin/env python3
"""GGML blocks and gguf-py's expansion of them, for the device kernel's test.

Writes test_vectors/gguf/blocks.gguf (gguf-py's GGUFWriter: one tensor per
quantized type, 6 rows of 512 elements, every byte random except the f16
scales, which are random finite halves, subnormals and zeros among them) and
test_vectors/gguf/expanded.safetensors (gguf-py's `dequantize` of each, f32).
Run from anywhere: python3 test_vectors/generate_gguf.py
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFWriter, quants
from safetensors.numpy import save_file

OUT = Path(__file__).resolve().parent / "gguf"
ROWS, WIDTH = 6, 512

# Byte offsets of each block's f16 fields (d, and m or dmin), by type.
HALVES = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def random_halves(rng, n):
    """Finite f16 bit patterns: mostly normal values of every exponent, some subnormals and zeros."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exponent = (bits >> 10) & 0x1F
    # Inf and NaN become normal values of the largest finite exponent.
    bits = np.where(exponent == 0x1F, bits & ~np.uint16(1 << 10), bits).astype(np.uint16)
    bits[rng.random(n) < 0.05] &= np.uint16(0x83FF)  # subnormal
    bits[rng.random(n) < 0.02] &= np.uint16(0x8000)  # zero
    return bits


def blocks_for(rng, qtype):
    block_elems, block_bytes = quants.GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * WIDTH // block_elems
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint32).astype(np.uint8)
    for at in HALVES[qtype]:
        raw[:, at : at + 2] = random_halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(ROWS, WIDTH // block_elems * block_bytes)


def main():
    OUT.mkdir(exist_ok=True)
    rng = np.random.default_rng(20261127)
    path = OUT / "blocks.gguf"
    writer = GGUFWriter(str(path), "flux")
    for qtype in HALVES:
        writer.add_tensor(qtype.name.lower(), blocks_for(rng, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    expanded = {}
    for t in GGUFReader(str(path)).tensors:
        values = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        assert values.shape == (ROWS, WIDTH), (t.name, values.shape)
        assert np.isfinite(values).all(), t.name
        expanded[t.name] = values
    save_file(expanded, str(OUT / "expanded.safetensors"))
    print(f"wrote {path} and expanded.safetensors: {', '.join(sorted(expanded))}")


if __name__ == "__main__":
    main()
