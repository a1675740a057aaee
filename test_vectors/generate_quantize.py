#!/usr/bin/env python3
"""What `flux-lite quantize` must write for tiny-a's transformer, by gguf-py's quantizers.

For each type `quantize` writes, tiny-a's transformer under BFL's names (q, k and v joined,
the final modulation's halves swapped back, as diffusers' converter reads them), each tensor in
the type ComfyUI-GGUF's rule gives it: 1-D tensors F32; img_in, txt_in, time_in and
final_layer.linear BF16; a 2-D tensor whose rows are not whole blocks of the type BF16; the rest
quantized by gguf-py's `quants.quantize`, or for the K-quants (which gguf-py cannot write) by
llama.cpp's reference quantizers, built as generate_kquants.py builds them (tiny-a's single
blocks' linear2, 256 wide, is its one tensor of whole K-quant blocks). Written as goldens/quantize/manifest.json: per type,
per tensor, its GGML type, shape (innermost first, as GGUF stores it), byte count and the CRC-32
of its bytes. Run from anywhere: python3 test_vectors/generate_quantize.py
"""

import json
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as T, quants
from safetensors.torch import load_file

import generate_kquants

ROOT = Path(__file__).resolve().parent
KEPT = ("img_in.", "txt_in.", "time_in.", "final_layer.linear.")
TYPES = [T.Q8_0, T.Q6_K, T.Q5_K, T.Q5_1, T.Q5_0, T.Q4_K, T.Q4_1, T.Q4_0, T.Q3_K, T.Q2_K, T.BF16, T.F16]


def to_bfl(sd, layers, singles):
    out = {}
    top = {"x_embedder": "img_in", "context_embedder": "txt_in",
           "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
           "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
           "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
           "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
           "single_stream_modulation.linear": "single_stream_modulation.lin", "proj_out": "final_layer.linear"}
    for k, v in top.items():
        out[f"{v}.weight"] = sd[f"{k}.weight"]
    shift, scale = sd["norm_out.linear.weight"].chunk(2, dim=0)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat([scale, shift], dim=0)
    for i in range(layers):
        p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        out[q + "img_attn.qkv.weight"] = torch.cat([sd[p + f"attn.to_{x}.weight"] for x in "qkv"])
        out[q + "txt_attn.qkv.weight"] = torch.cat([sd[p + f"attn.add_{x}_proj.weight"] for x in "qkv"])
        for a, b in {"attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj", "ff.linear_in": "img_mlp.0",
                     "ff.linear_out": "img_mlp.2", "ff_context.linear_in": "txt_mlp.0", "ff_context.linear_out": "txt_mlp.2"}.items():
            out[q + b + ".weight"] = sd[p + a + ".weight"]
        for a, b in {"norm_q": "img_attn.norm.query_norm", "norm_k": "img_attn.norm.key_norm",
                     "norm_added_q": "txt_attn.norm.query_norm", "norm_added_k": "txt_attn.norm.key_norm"}.items():
            out[q + b + ".scale"] = sd[p + f"attn.{a}.weight"]
    for i in range(singles):
        p, q = f"single_transformer_blocks.{i}.attn.", f"single_blocks.{i}."
        out[q + "linear1.weight"] = sd[p + "to_qkv_mlp_proj.weight"]
        out[q + "linear2.weight"] = sd[p + "to_out.weight"]
        out[q + "norm.query_norm.scale"] = sd[p + "norm_q.weight"]
        out[q + "norm.key_norm.scale"] = sd[p + "norm_k.weight"]
    return out


def main():
    folder = ROOT / "models" / "tiny-a" / "transformer"
    config = json.loads((folder / "config.json").read_text())
    sd = {}
    for f in sorted(folder.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    bfl = to_bfl(sd, config["num_layers"], config["num_single_layers"])
    manifest = {}
    work = tempfile.TemporaryDirectory()
    llama = generate_kquants.reference_library(Path(work.name))
    for qtype in TYPES:
        block = quants.GGML_QUANT_SIZES[qtype][0]
        entries = {}
        for name, t in bfl.items():
            x = t.to(torch.float32).numpy()
            if x.ndim < 2:
                kind, data = T.F32, x.astype(np.float32)
            elif name.startswith(KEPT) or x.shape[-1] % block != 0:
                kind, data = T.BF16, quants.quantize(x, T.BF16)
            else:
                kind = qtype
                data = (np.frombuffer(generate_kquants.reference_quantize(llama, x, qtype), dtype=np.uint8)
                        if qtype in generate_kquants.TYPES else quants.quantize(x, qtype))
            raw = np.ascontiguousarray(data).tobytes()
            entries[name] = {"type": kind.name, "ne": list(reversed(x.shape)), "bytes": len(raw), "crc32": zlib.crc32(raw)}
        manifest[qtype.name] = entries
    out = ROOT / "goldens" / "quantize" / "manifest.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {out}: {len(TYPES)} types x {len(bfl)} tensors")


if __name__ == "__main__":
    main()
