"""Latent-to-RGB maps for the tiny models' VAEs, and a preview golden.

The real FLUX.2 VAE's map is published (flux_lite_core::preview::FLUX2); the
tiny models' random VAEs have none, so one is fitted here by least squares:
random normalised latents (as the transformer holds them) are decoded by
diffusers' AutoencoderKLFlux2 exactly as Flux2KleinPipeline decodes
(batch-norm de-normalisation, unpatchify, decode), each decoded image is
averaged down to the latent grid, and `rgb ≈ z·F + b` is solved over every
latent pixel, z being the normalised, unpatchified latent. The fit is
written to models/<name>/vae/latent_rgb.json.

goldens/previews.safetensors then holds, per model, seeded latents and the
preview NumPy draws from them with that map ((v + 1) / 2 in 8 bits,
each latent pixel repeated scale-factor times), which the engine's preview
must reproduce.

    python3 test_vectors/generate_previews.py
"""

import json
import os

import numpy as np
import torch
from diffusers import AutoencoderKLFlux2
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ["tiny-a", "tiny-b", "tiny-9b"]


def unpatchify(packed_nchw):
    """(B, 4C, h, w) -> (B, C, 2h, 2w), as Flux2KleinPipeline._unpatchify_latents."""
    b, c4, h, w = packed_nchw.shape
    x = packed_nchw.reshape(b, c4 // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(b, c4 // 4, 2 * h, 2 * w)


def fit(vae, grid=16, samples=8, seed=0):
    c4 = 4 * vae.config.latent_channels
    g = torch.Generator().manual_seed(seed)
    packed = torch.randn((samples, c4, grid, grid), generator=g, dtype=torch.float32)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    with torch.no_grad():
        image = vae.decode(unpatchify(packed * std + mean), return_dict=False)[0]
    scale = image.shape[-1] // (2 * grid)
    rgb = torch.nn.functional.avg_pool2d(image, scale)  # (B, 3, 2g, 2g)
    z = unpatchify(packed)  # (B, C, 2g, 2g), normalised
    x = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1]).double().numpy()
    y = rgb.permute(0, 2, 3, 1).reshape(-1, 3).double().numpy()
    a = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
    solution, *_ = np.linalg.lstsq(a, y, rcond=None)
    return solution[:-1], solution[-1], scale


def draw(packed_tokens, grid, factors, bias, enlarge):
    """The preview of packed latents [tokens, 4C], as flux_lite_core::preview::draw."""
    gh, gw = grid
    c = factors.shape[0]
    nchw = packed_tokens.reshape(gh, gw, 4 * c).transpose(2, 0, 1)[None]
    z = unpatchify(torch.from_numpy(nchw)).numpy()[0]  # (C, 2gh, 2gw)
    v = np.einsum("chw,ck->hwk", z.astype(np.float64), factors.astype(np.float32).astype(np.float64)) + bias.astype(np.float32)
    level = np.floor(np.clip((v + 1.0) * 0.5, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return level.repeat(enlarge, axis=0).repeat(enlarge, axis=1)


def main():
    goldens = {}
    for name in MODELS:
        folder = os.path.join(HERE, "models", name, "vae")
        vae = AutoencoderKLFlux2.from_pretrained(folder, torch_dtype=torch.float32).eval()
        factors, bias, scale = fit(vae)
        factors32, bias32 = factors.astype(np.float32), bias.astype(np.float32)
        with open(os.path.join(folder, "latent_rgb.json"), "w") as f:
            json.dump({"factors": factors32.tolist(), "bias": bias32.tolist()}, f, indent=1)
            f.write("\n")
        grid = (3, 5)
        rng = np.random.default_rng(7)
        packed = rng.standard_normal((grid[0] * grid[1], 4 * vae.config.latent_channels)).astype(np.float32)
        goldens[f"{name}.latents"] = packed
        goldens[f"{name}.grid"] = np.array(grid, dtype=np.int64)
        goldens[f"{name}.rgb"] = draw(packed, grid, factors32, bias32, scale)
        print(f"{name}: {vae.config.latent_channels} latent channels, scale {scale}, bias {bias32}")
    save_file(goldens, os.path.join(HERE, "goldens", "previews.safetensors"))


if __name__ == "__main__":
    main()
