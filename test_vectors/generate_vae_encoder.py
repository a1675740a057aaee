"""Goldens of the VAE encoder, from diffusers in float32.

For each tiny model, an image in [-1, 1] (a smooth pattern plus seeded noise,
as the pipeline's image processor would hand it over) goes through
`AutoencoderKLFlux2.encode`; the goldens are the posterior mean (the latent
the pipeline takes with sample_mode="argmax") and the reference tokens
`Flux2KleinPipeline._encode_vae_image` then `_pack_latents` make of it
(patchified, BatchNorm-normalised, packed `[tokens, 4·latent_channels]`).
Written to goldens/<model>/vae-encode/{case.json, goldens.safetensors}.
"""

import json
from pathlib import Path

import torch
from diffusers import AutoencoderKLFlux2, Flux2KleinPipeline
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent

# (model, image height, image width): not square, not a power of two.
CASES = [("tiny-a", 24, 40), ("tiny-b", 32, 48)]


def test_image(height: int, width: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    y = torch.linspace(-1, 1, height).view(1, height, 1)
    x = torch.linspace(-1, 1, width).view(1, 1, width)
    phase = torch.tensor([0.0, 2.1, 4.2]).view(3, 1, 1)
    smooth = 0.6 * torch.sin(3 * x + 2 * y + phase) * torch.cos(2 * x - y)
    noise = 0.3 * torch.randn((3, height, width), generator=gen)
    return (smooth + noise).clamp(-1, 1)


def main() -> None:
    torch.manual_seed(0)
    for model, height, width in CASES:
        vae = AutoencoderKLFlux2.from_pretrained(ROOT / "models" / model / "vae", torch_dtype=torch.float32).eval()
        image = test_image(height, width, seed=7)
        with torch.no_grad():
            posterior = vae.encode(image.unsqueeze(0)).latent_dist
            mean = posterior.mean
            # What the pipeline makes of the same image (self is unused by these helpers but vae).
            pipe = Flux2KleinPipeline.__new__(Flux2KleinPipeline)
            object.__setattr__(pipe, "vae", vae)
            tokens = Flux2KleinPipeline._encode_vae_image(pipe, image.unsqueeze(0), generator=None)
            packed = Flux2KleinPipeline._pack_latents(tokens).squeeze(0)
        out = ROOT / "goldens" / model / "vae-encode"
        out.mkdir(parents=True, exist_ok=True)
        save_file(
            {
                "image": image.contiguous(),
                "posterior_mean": mean.squeeze(0).contiguous(),
                "image_latents": packed.contiguous(),
            },
            out / "goldens.safetensors",
        )
        case = {"model": model, "height": height, "width": width, "image_seed": 7,
                "latent_shape": list(mean.shape[1:]), "tokens": list(packed.shape)}
        (out / "case.json").write_text(json.dumps(case, indent=2) + "\n")
        print(f"{model}: image {height}x{width} -> mean {tuple(mean.shape[1:])}, "
              f"|mean| {mean.abs().mean():.4f}, tokens {tuple(packed.shape)}")


if __name__ == "__main__":
    main()
