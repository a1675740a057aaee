#!/usr/bin/env python3
"""Tiny preview decoders and what they decode, by their own reference code.

Two small decoders with random weights, each for tiny-a's VAE (4 latent
channels, scale factor 2), and one decode each:

- `diffusers.safetensors`: diffusers' `AutoencoderTiny` (latent_channels=4,
  decoder widths (16, 16), blocks (2, 1)), its whole state dict as
  diffusers names it (`decoder.layers.N.*`, `encoder.layers.N.*`).
- `taesd.safetensors`: a decoder in TAESD's own layout built from
  `taesd.py`'s modules (`Clamp`, `conv`, `Block`, TAEF2's global-norm
  `Block(use_midblock_gn=True)` in the first level), in the order
  `taesd.Decoder` stacks them, at width 16 with one upsampling; its state
  dict as `taesd.py` saves one (`N.*`). The GroupNorms' affine weights are
  drawn at random so they count.

For each, seeded packed latents `[tokens, 16]` on a 3×5 token grid are
de-normalised with tiny-a's VAE BatchNorm statistics and unpatchified
exactly as Flux2KleinPipeline does before its VAE decode, then decoded:
diffusers' `AutoencoderTiny.decode` (which returns `2·x − 1`), and for
TAESD `decoder(x)·2 − 1` (the same convention, so both compare with the
VAE's output). goldens/tiny_decoder/cases.safetensors holds the latents
and each decoded image `[3, H, W]`.

    TAESD_PY=/path/to/taesd/taesd.py python3 test_vectors/generate_tiny_decoder.py

(`taesd.py` from github.com/madebyollin/taesd, whose decoders are published
as TAESD, TAEF1 and TAEF2.)
"""

import importlib.util
import os

import numpy as np
import torch
from diffusers import AutoencoderKLFlux2, AutoencoderTiny
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "goldens", "tiny_decoder")
GRID = (3, 5)


def taesd_module():
    path = os.environ.get("TAESD_PY")
    if not path:
        raise SystemExit("set TAESD_PY to taesd.py from github.com/madebyollin/taesd")
    spec = importlib.util.spec_from_file_location("taesd", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unpatchify(packed_nchw):
    """(B, 4C, h, w) -> (B, C, 2h, 2w), as Flux2KleinPipeline._unpatchify_latents."""
    b, c4, h, w = packed_nchw.shape
    x = packed_nchw.reshape(b, c4 // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(b, c4 // 4, 2 * h, 2 * w)


def vae_input(vae, packed_tokens):
    """Packed tokens [h·w, 4C] to the VAE decoder's input, as the pipeline de-normalises and unpatchifies."""
    gh, gw = GRID
    nchw = packed_tokens.reshape(gh, gw, -1).permute(2, 0, 1)[None]
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    return unpatchify(nchw * std + mean)


def diffusers_decoder():
    torch.manual_seed(11)
    return AutoencoderTiny(
        latent_channels=4,
        encoder_block_out_channels=(16, 16),
        decoder_block_out_channels=(16, 16),
        num_encoder_blocks=(1, 2),
        num_decoder_blocks=(2, 1),
    ).eval()


def taesd_decoder(taesd):
    torch.manual_seed(12)
    conv, Block = taesd.conv, taesd.Block
    decoder = torch.nn.Sequential(
        taesd.Clamp(), conv(4, 16), torch.nn.ReLU(),
        Block(16, 16, use_midblock_gn=True), Block(16, 16, use_midblock_gn=True),
        torch.nn.Upsample(scale_factor=2), conv(16, 16, bias=False),
        Block(16, 16), conv(16, 3),
    ).eval()
    with torch.no_grad():
        for name, p in decoder.named_parameters():
            if ".pool.1." in name:
                p.copy_(torch.randn(p.shape) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    return decoder


def main():
    os.makedirs(OUT, exist_ok=True)
    vae = AutoencoderKLFlux2.from_pretrained(os.path.join(HERE, "models", "tiny-a", "vae"), torch_dtype=torch.float32).eval()
    rng = np.random.default_rng(5)
    packed = torch.from_numpy(rng.standard_normal((GRID[0] * GRID[1], 16)).astype(np.float32) * 1.5)
    cases = {"latents": packed.contiguous(), "grid": torch.tensor(GRID, dtype=torch.int64)}
    with torch.no_grad():
        x = vae_input(vae, packed)
        tiny = diffusers_decoder()
        save_file({k: v.contiguous() for k, v in tiny.state_dict().items()}, os.path.join(OUT, "diffusers.safetensors"))
        cases["diffusers"] = tiny.decode(x, return_dict=False)[0][0].contiguous()
        decoder = taesd_decoder(taesd_module())
        save_file({k: v.contiguous() for k, v in decoder.state_dict().items()}, os.path.join(OUT, "taesd.safetensors"))
        cases["taesd"] = (decoder(x) * 2 - 1)[0].contiguous()
    save_file(cases, os.path.join(OUT, "cases.safetensors"))
    for k in ("diffusers", "taesd"):
        v = cases[k]
        print(f"{k}: {tuple(v.shape)}, range [{v.min():.3f}, {v.max():.3f}], std {v.std():.3f}")


if __name__ == "__main__":
    main()
