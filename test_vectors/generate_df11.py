#!/usr/bin/env python3
"""DF11 test vectors written by the official DFloat11 compressor (pip ``dfloat11==0.5.0``,
``dahuffman==0.4.2``), CPU only.

Writes under ``goldens/df11/``:

- ``tiny-b-transformer/``: ``models/tiny-b/transformer`` (already bf16; read from its two
  shards) compressed by the official ``compress_model`` with the FLUX.2-klein diffusers
  pattern_dict (``save_single_file=True``, ``check_correctness=False``): an official DF11
  folder, ``config.json`` (only ``dfloat11_config``) + ``model.safetensors``. tiny-b rather
  than tiny-a because tiny-a's would take ~600 KB of the test-vector budget (~300 KB here).
- ``synthetic.safetensors``: small groups made by the official encoder functions
  (``get_codec``/``get_32bit_codec``/``get_luts``/``encode_weights``, exactly as
  ``compress_model`` chains them). For each case ``<case>.<field>`` holds the six DF11
  fields, ``<case>.weights`` the original bf16 words (the concatenated linears) and
  ``<case>.counts`` (I64 [256]) the exponent histogram the code book was built from.

The official package loads a CUDA module when imported; ``cupy`` is replaced by a stub
first, which is enough because compression itself is pure Python/NumPy.

Run after ``generate.py`` (which deletes and rewrites ``goldens/``):

    python3 test_vectors/generate_df11.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import types
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def install_cupy_stub() -> None:
    """``dfloat11.dfloat11`` runs ``cp.RawModule(path=...).get_function('decode')`` at import
    time and touches ``cp.cuda.Device`` only when it decodes, which this script never does."""

    class RawModule:
        def __init__(self, *args, **kwargs):
            pass

        def get_function(self, name):
            def unavailable(*args, **kwargs):
                raise RuntimeError(f"cupy stub: the CUDA kernel {name!r} is not available")

            return unavailable

    cupy = types.ModuleType("cupy")
    cupy.RawModule = RawModule
    cupy.cuda = types.SimpleNamespace(Device=None)
    sys.modules["cupy"] = cupy


install_cupy_stub()
warnings.filterwarnings("ignore", category=UserWarning)  # pkg_resources deprecation
warnings.filterwarnings("ignore", category=DeprecationWarning)

from diffusers import Flux2Transformer2DModel  # noqa: E402
from diffusers.utils import logging as diffusers_logging  # noqa: E402
from dfloat11 import compress_model  # noqa: E402
from dfloat11.dfloat11_utils import encode_weights, get_32bit_codec, get_codec, get_luts  # noqa: E402

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "goldens" / "df11"
MODEL = "tiny-b"
MODEL_DIR = ROOT / "models" / MODEL / "transformer"
BYTES_PER_THREAD, THREADS_PER_BLOCK = 8, 512

# FLUX.2-klein (diffusers Flux2Transformer2DModel) as in the community klein DF11 checkpoints
# (spec/df11.md §4): 12 linears per double block, 2 per single block, five lone linears.
PATTERN_DICT = {
    r"transformer_blocks\.\d+": [
        "attn.to_q",
        "attn.to_k",
        "attn.to_v",
        "attn.to_out.0",
        "attn.add_q_proj",
        "attn.add_k_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
        "ff.linear_in",
        "ff.linear_out",
        "ff_context.linear_in",
        "ff_context.linear_out",
    ],
    r"single_transformer_blocks\.\d+": ["attn.to_qkv_mlp_proj", "attn.to_out"],
    r"double_stream_modulation_img\.linear": [],
    r"double_stream_modulation_txt\.linear": [],
    r"single_stream_modulation\.linear": [],
    r"context_embedder": [],
    r"norm_out\.linear": [],
}

FIELDS = ("luts", "encoded_exponent", "sign_mantissa", "output_positions", "gaps", "split_positions")


@contextlib.contextmanager
def quiet():
    """The official encoder prints every code table and LUT dict and a tqdm bar per group.
    dahuffman's ``print_code_table`` binds ``sys.stdout`` as a default argument at import, so
    only a file-descriptor level redirect silences it."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        os.dup2(devnull.fileno(), 2)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def exponent(words: torch.Tensor) -> torch.Tensor:
    return (words.view(torch.int16).to(torch.int32) >> 7) & 0xFF


def bf16_words(sign: torch.Tensor, exp: torch.Tensor, mantissa: torch.Tensor) -> torch.Tensor:
    w = (sign.to(torch.int32) << 15) | (exp.to(torch.int32) << 7) | mantissa.to(torch.int32)
    return w.to(torch.int16).view(torch.bfloat16)


def random_words(exp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    n = exp.numel()
    sign = torch.randint(0, 2, (n,), generator=gen)
    mantissa = torch.randint(0, 128, (n,), generator=gen)
    return bf16_words(sign, exp, mantissa)


def official_group(weights: list[torch.Tensor], counter: dict[int, int] | None = None) -> dict[str, torch.Tensor]:
    """The six fields as ``compress_model`` computes them. ``counter`` overrides the data's own
    histogram (the code book is then built from it; the data must use only its symbols)."""
    with quiet():
        if counter is None:
            _, counter = get_codec(torch.cat(weights))
        codec, _, table = get_32bit_codec(counter)
        luts = get_luts(table)
        encoded, sign_mantissa, positions, gaps, split = encode_weights(
            weights, codec, BYTES_PER_THREAD, THREADS_PER_BLOCK
        )
    group = dict(
        luts=luts,
        encoded_exponent=encoded,
        sign_mantissa=sign_mantissa,
        output_positions=positions.view(torch.uint8),
        gaps=gaps,
        split_positions=split,
    )
    group["max_code_len"] = max(bits for bits, _ in table.values())
    return group


def counts_tensor(counter: dict[int, int]) -> torch.Tensor:
    counts = torch.zeros(256, dtype=torch.int64)
    for symbol, count in counter.items():
        counts[int(symbol)] = int(count)
    return counts


def data_counter(weights: list[torch.Tensor]) -> dict[int, int]:
    vals, freqs = torch.unique(exponent(torch.cat(weights)), return_counts=True)
    return {int(v): int(f) for v, f in zip(vals.tolist(), freqs.tolist())}


def near_uniform(gen: torch.Generator) -> tuple[list[torch.Tensor], dict | None]:
    """Every valid exponent 0..239, each 8..12 times: ~8-bit codes, the flattest code book."""
    reps = torch.randint(8, 13, (240,), generator=gen)
    exp = torch.repeat_interleave(torch.arange(240), reps)
    exp = exp[torch.randperm(exp.numel(), generator=gen)]
    return [random_words(exp, gen)], None


def long_codes(gen: torch.Generator) -> tuple[list[torch.Tensor], dict | None]:
    """A Fibonacci histogram over 36 exponents: plain Huffman gives a 36-deep chain, so the
    official 32-bit heuristic kicks in (k = 2..7 smallest set to 1) and ends at exactly 32 bits,
    which needs all four LUT levels. The histogram is only a code book (its sum is ~39M); the
    stored data is a few thousand draws that favour the rare (long-code) exponents, so the
    bitstream still spans several 4 KiB blocks while staying small."""
    fib = [1, 1]
    while len(fib) < 36:
        fib.append(fib[-1] + fib[-2])
    symbols = list(range(100, 136))
    counter = {s: f for s, f in zip(symbols, fib)}
    # Every symbol at least twice, then draws weighted towards the long codes.
    base = torch.tensor(symbols).repeat(2)
    weights = torch.tensor([1.0 / (1 + i) for i in range(36)])
    draws = torch.tensor(symbols)[torch.multinomial(weights, 2500, replacement=True, generator=gen)]
    exp = torch.cat([base, draws])
    exp = exp[torch.randperm(exp.numel(), generator=gen)]
    return [random_words(exp, gen)], counter


def many_blocks(gen: torch.Generator) -> tuple[list[torch.Tensor], dict | None]:
    """A rounded normal around exponent 127 (σ = 25): 2..14-bit codes over 3 blocks of 4 KiB,
    and 16 sub-tables, the most a LUT can point to (the official encoder does not check this:
    σ = 32 gives 23 sub-tables, whose pointers 239..233 read back as exponents)."""
    exp = (127 + 25 * torch.randn(12000, generator=gen)).round().clamp(1, 239).to(torch.int64)
    return [random_words(exp, gen)], None


def multi_linear(gen: torch.Generator) -> tuple[list[torch.Tensor], dict | None]:
    """Three linears with different scales (one code book, split_positions [1536, 2304])."""
    shapes_scales = [((32, 48), 0.05), ((16, 48), 1.0), ((24, 20), 300.0)]
    weights = []
    for (rows, cols), scale in shapes_scales:
        w = (scale * torch.randn(rows, cols, generator=gen)).to(torch.bfloat16)
        weights.append(w.flatten())
    return weights, None


CASES = {
    "near_uniform": near_uniform,
    "long_codes": long_codes,
    "many_blocks": many_blocks,
    "multi_linear": multi_linear,
}


def synthetic() -> None:
    tensors: dict[str, torch.Tensor] = {}
    for i, (name, make) in enumerate(CASES.items()):
        gen = torch.Generator().manual_seed(1000 + i)
        weights, counter = make(gen)
        if counter is None:
            counter = data_counter(weights)
        group = official_group(weights, counter)
        max_len = group.pop("max_code_len")
        for field in FIELDS:
            tensors[f"{name}.{field}"] = group[field].contiguous()
        tensors[f"{name}.weights"] = torch.cat(weights).contiguous()
        tensors[f"{name}.counts"] = counts_tensor(counter)
        n = tensors[f"{name}.weights"].numel()
        n_bytes = group["encoded_exponent"].numel()
        size = sum(group[f].numel() * group[f].element_size() for f in FIELDS)
        print(
            f"{name}: {n} elements, {n_bytes} code bytes ({-(-n_bytes // 4096)} blocks), "
            f"{group['luts'].shape[0]} LUT rows, longest code {max_len} bits, "
            f"{size} bytes = {100 * size / (2 * n):.1f}% of bf16"
        )
        # Sanity checks of the generator itself (the decoder lives in Rust).
        assert exponent(tensors[f"{name}.weights"]).max() < 240
        assert group["luts"].shape[0] <= 18, f"{name}: more than 16 sub-tables is not a valid DF11 group"
        assert max_len <= 32
    assert tensors["long_codes.luts"].shape[0] == 5, "long_codes should reach the fourth LUT level"
    assert tensors["many_blocks.luts"].shape[0] == 18, "many_blocks should use all 16 sub-tables"
    save_file(tensors, OUT / "synthetic.safetensors", metadata={"generator": "dfloat11 0.5.0 / dahuffman 0.4.2"})


def tiny_transformer() -> None:
    out = OUT / f"{MODEL}-transformer"
    model = Flux2Transformer2DModel.from_pretrained(MODEL_DIR, torch_dtype=torch.bfloat16)
    dtypes = {p.dtype for p in model.parameters()}
    # compress_model asserts bf16; the stored weights are bf16 already (no conversion).
    stored = {}
    for shard in sorted(MODEL_DIR.glob("*.safetensors")):
        stored.update(load_file(shard))
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}, f"{MODEL} transformer weights are not bf16"
    assert all(torch.equal(p.view(torch.int16), stored[n].view(torch.int16)) for n, p in model.named_parameters())
    assert dtypes == {torch.bfloat16}, dtypes
    with quiet():
        compress_model(model, PATTERN_DICT, str(out), save_single_file=True, check_correctness=False)
    written = load_file(out / "model.safetensors")
    groups = sorted(k[: -len(".luts")] for k in written if k.endswith(".luts"))
    size = sum(written[f"{g}.{f}"].numel() * written[f"{g}.{f}"].element_size() for g in groups for f in FIELDS)
    elements = sum(written[f"{g}.sign_mantissa"].numel() for g in groups)
    print(
        f"{MODEL}-transformer: {len(groups)} groups, {elements} elements, DF11 fields {size} bytes "
        f"= {100 * size / (2 * elements):.1f}% of bf16; file {(out / 'model.safetensors').stat().st_size} bytes"
    )
    config = json.loads((out / "config.json").read_text())
    assert config["dfloat11_config"]["version"] == "0.5.0", config


def main() -> None:
    diffusers_logging.disable_progress_bar()
    diffusers_logging.set_verbosity_error()
    torch.manual_seed(0)
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    tiny_transformer()
    synthetic()


if __name__ == "__main__":
    main()
