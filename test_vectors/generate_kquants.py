#!/usr/bin/env python3
"""What `flux-lite quantize` must write for the K-quants, by llama.cpp's reference quantizers.

gguf-py reads K-quants but has no quantizer for them; llama.cpp's `quantize_row_q{2..6}_K_ref`
(ggml/src/ggml-quants.c) are the reference every GGUF tool's K-quant files come from. This
script takes that file from the llama-cpp-python source package (which vendors llama.cpp),
compiles it as a shared library with `cc -O2 -DNDEBUG -ffp-contract=off` (as release builds
are, without their asserts; no multiply-add contraction: each float operation rounded as the C
source writes it, the arithmetic flux-lite's quantizers do), and quantizes seeded rows of 256-value blocks shaped like the cases a quantizer meets:
weight-like normals, outliers, one-signed blocks, a constant block, an all-zero block, values
near the smallest normal (whose fits degenerate: the Q4_K and Q5_K rounding then meets
infinities, which release builds round as their bit trick does), and large magnitudes. gguf-py's `dequantize` then reads every block
back, to check the bytes are the layout gguf-py expects.

Writes goldens/kquants/: input.bin (the f32 rows, little-endian) and Q2_K.bin … Q6_K.bin.

    python3 test_vectors/generate_kquants.py      (needs a C compiler; downloads the sdist)
"""

import ctypes
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T, quants

ROOT = Path(__file__).resolve().parent
SDIST = "llama-cpp-python==0.3.36"
OUT = ROOT / "goldens" / "kquants"
TYPES = {T.Q2_K: "q2_K", T.Q3_K: "q3_K", T.Q4_K: "q4_K", T.Q5_K: "q5_K", T.Q6_K: "q6_K"}
QK_K = 256

# ggml-quants.c names these for its other quantizers; the K-quant references never call them.
STUBS = """
#include <stddef.h>
#include <stdlib.h>
void ggml_abort(const char *file, int line, const char *fmt, ...) { (void)file; (void)line; (void)fmt; abort(); }
size_t ggml_row_size(int type, long long ne) { (void)type; (void)ne; abort(); }
const char *ggml_type_name(int type) { (void)type; abort(); }
size_t ggml_type_size(int type) { (void)type; abort(); }
"""


def reference_library(work: Path) -> ctypes.CDLL:
    subprocess.run([sys.executable, "-m", "pip", "download", SDIST, "--no-deps", "--no-binary", "llama-cpp-python", "-d", str(work)],
                   check=True, stdout=subprocess.DEVNULL)
    archive = next(work.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    ggml = next(work.glob("llama_cpp_python-*")) / "vendor" / "llama.cpp" / "ggml"
    stubs = work / "stubs.c"
    stubs.write_text(STUBS)
    lib = work / "libkquants.so"
    subprocess.run(["cc", "-O2", "-DNDEBUG", "-ffp-contract=off", "-fPIC", "-shared", f"-I{ggml / 'include'}", f"-I{ggml / 'src'}",
                    str(ggml / "src" / "ggml-quants.c"), str(stubs), "-lm", "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def reference_quantize(lib: ctypes.CDLL, x: np.ndarray, qtype: T) -> bytes:
    """`x` (f32, its last dimension whole 256-value blocks) in `qtype`, by llama.cpp's reference."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = ctypes.create_string_buffer(x.size // QK_K * quants.GGML_QUANT_SIZES[qtype][1])
    fn = getattr(lib, f"quantize_row_{TYPES[qtype]}_ref")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn(x.ctypes.data, out, x.size)
    return bytes(out)


def rows(rng: np.random.Generator) -> np.ndarray:
    """Blocks of 256 values, each a case (see the module's doc)."""
    blocks = []
    for scale in (0.02, 0.05, 1.0):
        for _ in range(8):
            blocks.append(rng.normal(0.0, scale, QK_K))
    for _ in range(6):
        b = rng.normal(0.0, 0.02, QK_K)
        b[rng.integers(0, QK_K, 3)] = rng.normal(0.0, 1.0, 3)
        blocks.append(b)
    blocks.append(np.abs(rng.normal(0.0, 0.1, QK_K)))
    blocks.append(-np.abs(rng.normal(0.0, 0.1, QK_K)))
    blocks.append(rng.uniform(0.5, 1.5, QK_K))
    blocks.append(np.full(QK_K, 0.375))
    blocks.append(np.zeros(QK_K))
    blocks.append(rng.normal(0.0, 1e-37, QK_K))
    blocks.append(rng.normal(0.0, 3e4, QK_K))
    b = np.zeros(QK_K)
    b[17] = -2.5
    blocks.append(b)
    return np.concatenate(blocks).astype(np.float32)


def main():
    rng = np.random.default_rng(20261127)
    x = rows(rng)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "input.bin").write_bytes(x.astype("<f4").tobytes())
    with tempfile.TemporaryDirectory() as tmp:
        lib = reference_library(Path(tmp))
        for qtype in TYPES:
            block_bytes = quants.GGML_QUANT_SIZES[qtype][1]
            raw = reference_quantize(lib, x, qtype)
            back = quants.dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(-1, block_bytes), qtype).reshape(-1)
            assert back.shape == x.shape and np.isfinite(back).all(), qtype.name
            (OUT / f"{qtype.name}.bin").write_bytes(raw)
            err = np.abs(back - x)[: 24 * QK_K].max()
            print(f"{qtype.name}: {len(raw)} bytes, largest error on the normal blocks {err:.3g}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
