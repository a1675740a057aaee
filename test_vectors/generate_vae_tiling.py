#!/usr/bin/env python3
"""Goldens for flux-lite's tiled VAE decode: diffusers' own ``tiled_decode``.

Writes ``goldens/tiny-a/tiled-decode/goldens.safetensors`` (all float32):

- ``latents`` [S, 16]: packed latents of a 64×96 (W×H) image as the
  transformer leaves them (token = y·16 + x), drawn with
  ``torch.randn(S·16, generator=torch.Generator().manual_seed(5))``.
- ``decoded`` [3, 96, 64]: ``vae.decode`` of the unpacked, BN de-normalised,
  unpatchified latent, untiled.
- ``decoded_tiled`` [3, 96, 64]: the same with ``vae.enable_tiling()`` and
  32-pixel tiles (``tile_sample_min_size = 32``, ``tile_latent_min_size = 16``,
  overlap factor 0.25: 16-cell tiles every 12 cells, 8-pixel blends, 24 kept).

The metadata holds ``width``, ``height`` and ``tile_px``. The tiny random VAE
sees each tile alone, so its GroupNorm statistics and mid-block attention
differ from the whole image's: diffusers' tiled output differs from its
untiled one by tens of 8-bit levels here (printed), far more than on the real
VAE with 1024-pixel tiles.

Run after ``generate.py`` (which deletes and rewrites ``goldens/``):

    python3 test_vectors/generate_vae_tiling.py
"""

from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKLFlux2, Flux2KleinPipeline
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "goldens" / "tiny-a" / "tiled-decode"
WIDTH, HEIGHT, TILE_PX, SEED = 64, 96, 32, 5


def levels(image: torch.Tensor) -> np.ndarray:
    return ((image * 0.5 + 0.5).clamp(0, 1).numpy() * 255).round().astype(np.int32)


@torch.no_grad()
def main() -> None:
    vae = AutoencoderKLFlux2.from_pretrained(ROOT / "models" / "tiny-a" / "vae", torch_dtype=torch.float32)
    scale = 2 ** (len(vae.config.block_out_channels) - 1)
    h, w = HEIGHT // (2 * scale), WIDTH // (2 * scale)
    channels = 4 * vae.config.latent_channels
    packed = torch.randn(h * w * channels, generator=torch.Generator().manual_seed(SEED)).reshape(h * w, channels)

    # As Flux2KleinPipeline decodes: unpack (token = y·w + x), BN de-normalise, unpatchify.
    z = packed.T.reshape(1, channels, h, w)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    z = Flux2KleinPipeline._unpatchify_latents(z * std + mean)

    decoded = vae.decode(z).sample[0]
    vae.enable_tiling()
    vae.tile_sample_min_size = TILE_PX
    vae.tile_latent_min_size = TILE_PX // scale
    tiled = vae.decode(z).sample[0]

    gap = np.abs(levels(tiled) - levels(decoded))
    print(f"tiled vs untiled (8-bit levels): max {gap.max()}, mean {gap.mean():.3f}")
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(
        {"latents": packed.contiguous(), "decoded": decoded.contiguous(), "decoded_tiled": tiled.contiguous()},
        OUT / "goldens.safetensors",
        metadata={"width": str(WIDTH), "height": str(HEIGHT), "tile_px": str(TILE_PX)},
    )


if __name__ == "__main__":
    main()
