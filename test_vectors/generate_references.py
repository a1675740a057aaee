"""Goldens of reference-image editing, and of the image handling in front of it.

1. Pipeline cases: `Flux2KleinPipeline(image=[...])` in float32 on the saved tiny
   models, from PNG reference files written here. Each case folder holds the
   reference PNGs, `case.json`, `goldens.safetensors` (the processed reference
   images in [-1, 1], the packed reference tokens and their position ids, the
   noise, each step's velocity and latents) and the pipeline's `image.png`.
2. `goldens/images/`: how PIL (as diffusers calls it) loads, converts and resizes
   reference files: PNGs of several modes and bit depths with the RGB bytes PIL
   gives for each, LANCZOS resizes (`Image.resize`, as `_resize_to_target_area`
   calls it) of RGB, L, RGBA and palette images, and the sizes
   `_resize_to_target_area` picks for images above 1024² pixels.
"""

import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import PIL.Image
import torch
from safetensors.torch import save_file

from diffusers import Flux2KleinKVPipeline

from tiny_models import MODEL_SPECS, load_float32_pipeline
from tiny_tokenizer import MAX_SEQ

ROOT = Path(__file__).resolve().parent
GOLDENS = ROOT / "goldens"


def pattern(width: int, height: int, channels: int, seed: int) -> np.ndarray:
    """Smooth colour waves plus seeded noise, as uint8 `[height, width, channels]`."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 1, height)[:, None, None]
    x = np.linspace(0, 1, width)[None, :, None]
    phase = np.arange(channels)[None, None, :] * 1.7 + seed
    waves = 0.5 + 0.35 * np.sin(6 * x + 4 * y * (1 + seed % 3) + phase) * np.cos(3 * x - 5 * y + phase / 2)
    noisy = waves + 0.08 * rng.standard_normal((height, width, channels))
    return np.clip(np.round(noisy * 255), 0, 255).astype(np.uint8)


def write_png(path: Path, pixels: np.ndarray, color_type: int, depth: int) -> None:
    """A plain PNG of any bit depth (PIL cannot write 16-bit colour)."""
    h, w = pixels.shape[:2]
    dtype = ">u2" if depth == 16 else "u1"
    raw = b"".join(b"\x00" + pixels[y].astype(dtype).tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


# --------------------------------------------------------------------------------------------
# Pipeline cases
# --------------------------------------------------------------------------------------------

# (model, case, prompt, seed, steps, guidance, width, height, references); width/height None:
# the pipeline takes the first reference's size. References: (file, mode, width, height, seed).
CASES = [
    ("tiny-a", "reference-one", "the same fox, in summer", 5, 2, 1.0, None, None,
     [("ref0.png", "RGB", 66, 90, 1)]),
    ("tiny-a", "reference-two", "two friends on a bench", 9, 2, 1.0, 32, 48,
     [("ref0.png", "RGBA", 64, 64, 2), ("ref1.png", "L", 80, 68, 3)]),
    ("tiny-b", "reference-cfg", "a bird in the style of the picture", 4, 2, 4.0, 32, 32,
     [("ref0.png", "RGB", 72, 64, 4)]),
    # Flux2KleinKVPipeline (tiny-9b's components): the references' keys and values cached after step 0.
    ("tiny-9b-kv", "reference-kv", "the same bird, at night", 6, 3, 1.0, 32, 48,
     [("ref0.png", "RGB", 64, 72, 5), ("ref1.png", "RGB", 80, 64, 7)]),
]


def kv_model() -> None:
    """models/tiny-9b-kv: tiny-9b's components (linked, not copied) under Flux2KleinKVPipeline."""
    out = ROOT / "models" / "tiny-9b-kv"
    out.mkdir(exist_ok=True)
    for component in ("scheduler", "text_encoder", "tokenizer", "transformer", "vae"):
        link = out / component
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path("..") / "tiny-9b" / component)
    index = json.loads((ROOT / "models" / "tiny-9b" / "model_index.json").read_text())
    index["_class_name"] = "Flux2KleinKVPipeline"
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")


def load_pipeline(model_dir: Path):
    """The model folder's pipeline in float32: Flux2KleinPipeline, or the KV one its model_index names."""
    if json.loads((model_dir / "model_index.json").read_text())["_class_name"] != "Flux2KleinKVPipeline":
        return load_float32_pipeline(model_dir)
    pipe = Flux2KleinKVPipeline.from_pretrained(model_dir, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    for comp in ("text_encoder", "transformer", "vae"):
        getattr(pipe, comp).eval()
    return pipe


def reference_file(path: Path, mode: str, width: int, height: int, seed: int) -> None:
    if mode == "RGB":
        PIL.Image.fromarray(pattern(width, height, 3, seed), "RGB").save(path)
    elif mode == "RGBA":
        px = pattern(width, height, 4, seed)
        px[..., 3] = np.linspace(0, 255, width).astype(np.uint8)[None, :]  # alpha from clear to opaque
        PIL.Image.fromarray(px, "RGBA").save(path)
    elif mode == "L":
        PIL.Image.fromarray(pattern(width, height, 1, seed)[..., 0], "L").save(path)
    else:
        raise ValueError(mode)


@torch.no_grad()
def run_case(pipes: dict, model, name, prompt, seed, steps, guidance, width, height, refs) -> None:
    pipe = pipes.setdefault(model, load_pipeline(ROOT / "models" / model))
    kv = isinstance(pipe, Flux2KleinKVPipeline)
    out = GOLDENS / model / name
    out.mkdir(parents=True, exist_ok=True)
    images = []
    for file, mode, w, h, s in refs:
        reference_file(out / file, mode, w, h, s)
        images.append(PIL.Image.open(out / file))
    # The size the pipeline will settle on, for the noise.
    unit = pipe.vae_scale_factor * 2
    first_w, first_h = images[0].size
    size_w = width or first_w // unit * unit
    size_h = height or first_h // unit * unit
    s = pipe.vae_scale_factor
    shape = (1, pipe.transformer.config.in_channels, size_h // (2 * s), size_w // (2 * s))
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.bfloat16)
    noise_tokens = shape[2] * shape[3]

    captured = {"conditions": [], "refs": None, "calls": [], "steps": []}
    prepare = pipe.prepare_image_latents

    def prepare_hook(images, **kwargs):
        captured["conditions"] = [img[0].clone() for img in images]
        result = prepare(images=images, **kwargs)
        captured["refs"] = result
        return result

    pipe.prepare_image_latents = prepare_hook

    def transformer_hook(_m, _args, kwargs, result):
        captured["calls"].append({
            "out": result[0][0].clone(),
            "img_ids": kwargs["img_ids"][0].clone(),
            "prompt": kwargs["encoder_hidden_states"][0].clone(),
        })

    handle = pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True)

    def on_step_end(_pipe, i, t, kwargs):
        captured["steps"].append(kwargs["latents"][0].clone())
        return {}

    try:
        # The KV pipeline has no guidance (its model is distilled).
        guided = {} if kv else {"guidance_scale": guidance}
        spec = model.removesuffix("-kv")
        result = pipe(
            prompt=prompt,
            image=images if len(images) > 1 else images[0],
            height=height,
            width=width,
            num_inference_steps=steps,
            latents=noise.to(torch.float32),
            output_type="pil",
            max_sequence_length=MAX_SEQ,
            text_encoder_out_layers=next(m for m in MODEL_SPECS if m.name == spec).out_layers,
            callback_on_step_end=on_step_end,
            callback_on_step_end_tensor_inputs=["latents"],
            **guided,
        )
    finally:
        handle.remove()
        pipe.prepare_image_latents = prepare
    pil = result.images[0]
    assert pil.size == (size_w, size_h), (pil.size, size_w, size_h)

    ref_tokens, ref_ids = captured["refs"]
    g = {
        "noise": noise.to(torch.float32).reshape(shape[1], -1).T.contiguous(),
        "image_latents": ref_tokens[0].contiguous(),
        "image_latent_ids": ref_ids[0].to(torch.int64).contiguous(),
    }
    g["prompt_embeds"] = captured["calls"][0]["prompt"].contiguous()
    if guidance > 1.0 and not pipe.config.is_distilled:
        g["negative_prompt_embeds"] = captured["calls"][1]["prompt"].contiguous()
    for i, c in enumerate(captured["conditions"]):
        g[f"reference.{i}"] = c.to(torch.float32).contiguous()
    cfg = guidance > 1.0 and not pipe.config.is_distilled
    passes = 2 if cfg else 1
    assert len(captured["calls"]) == steps * passes and len(captured["steps"]) == steps
    for i in range(steps):
        calls = captured["calls"][i * passes:(i + 1) * passes]
        for call in calls:
            # The KV pipeline's transformer answers for the noise tokens alone.
            assert call["out"].shape[0] == noise_tokens + (0 if kv else ref_tokens.shape[1])
        velocity = calls[0]["out"][:noise_tokens]
        if cfg:
            negative = calls[1]["out"][:noise_tokens]
            velocity = negative + guidance * (velocity - negative)
        g[f"velocity.{i}"] = velocity.contiguous()
        g[f"latents.{i}"] = captured["steps"][i].contiguous()
    # The reference ids: T = 10·(i+1), then each reference's own (y, x) grid.
    ids = g["image_latent_ids"]
    first = 0
    for i, cond in enumerate(captured["conditions"]):
        h, w = cond.shape[1] // unit, cond.shape[2] // unit
        block = ids[first:first + h * w]
        assert torch.all(block[:, 0] == 10 * (i + 1)) and torch.all(block[:, 3] == 0)
        assert torch.equal(block[:, 1], torch.arange(h).repeat_interleave(w))
        assert torch.equal(block[:, 2], torch.arange(w).repeat(h))
        first += h * w
    assert first == ids.shape[0]

    save_file(g, str(out / "goldens.safetensors"), metadata={"generator": "test_vectors/generate_references.py"})
    pil.save(out / "image.png")
    case = {
        "model": model,
        "prompt": prompt,
        "seed": seed,
        "steps": steps,
        "guidance": guidance,
        "width_flag": width,
        "height_flag": height,
        "width": size_w,
        "height": size_h,
        "references": [
            {"file": f, "mode": m, "size": [w, h], "processed": list(c.shape[1:][::-1])}
            for (f, m, w, h, _), c in zip(refs, captured["conditions"])
        ],
        "reference_tokens": int(ref_tokens.shape[1]),
    }
    (out / "case.json").write_text(json.dumps(case, indent=2) + "\n")
    print(f"{model}/{name}: {size_w}x{size_h}, {ref_tokens.shape[1]} reference tokens, image mean {np.asarray(pil).mean():.1f}")


# --------------------------------------------------------------------------------------------
# Image loading and resizing as PIL does it
# --------------------------------------------------------------------------------------------


def image_goldens() -> None:
    out = GOLDENS / "images"
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    loads = []
    # Files of every PNG colour type and depth PIL opens, and what convert("RGB") gives.
    files = [
        ("rgb8.png", pattern(70, 66, 3, 11), 2, 8),
        ("rgba8.png", pattern(66, 70, 4, 12), 6, 8),
        ("gray8.png", pattern(64, 65, 1, 13)[..., 0], 0, 8),
        ("graya8.png", pattern(65, 64, 2, 14), 4, 8),
        ("rgb16.png", pattern(64, 64, 3, 15).astype(np.uint16) * 257 + 91, 2, 16),
        ("rgba16.png", pattern(64, 64, 4, 16).astype(np.uint16) * 255 + 3, 6, 16),
        ("graya16.png", pattern(64, 64, 2, 18).astype(np.uint16) * 256 + 200, 4, 16),
    ]
    for name, pixels, color_type, depth in files:
        write_png(out / name, pixels, color_type, depth)
    PIL.Image.fromarray(pattern(72, 64, 3, 17), "RGB").convert("P", palette=PIL.Image.Palette.ADAPTIVE, colors=37).save(out / "palette.png")
    # JPEGs with full-resolution chroma (4:4:4) and as cameras write them (4:2:0), quality 90.
    PIL.Image.fromarray(pattern(96, 80, 3, 19), "RGB").save(out / "photo444.jpg", quality=90, subsampling=0)
    PIL.Image.fromarray(pattern(96, 80, 3, 19), "RGB").save(out / "photo.jpg", quality=90, subsampling=2)
    for name in [f[0] for f in files] + ["palette.png", "photo444.jpg", "photo.jpg"]:
        im = PIL.Image.open(out / name)
        rgb = np.asarray(im.convert("RGB"))
        tensors[f"load.{name}"] = torch.from_numpy(rgb.copy())
        loads.append({"file": name, "pil_mode": im.mode, "size": list(im.size)})
    # LANCZOS resizes, down and up, in each mode with its own path in PIL.
    resizes = []
    for name, size in [("rgb8.png", (41, 29)), ("rgb8.png", (101, 87)), ("gray8.png", (33, 50)),
                       ("rgba8.png", (40, 45)), ("graya8.png", (31, 31)), ("palette.png", (50, 41))]:
        im = PIL.Image.open(out / name)
        resized = np.asarray(im.resize(size, PIL.Image.Resampling.LANCZOS).convert("RGB"))
        key = f"resize.{name}.{size[0]}x{size[1]}"
        tensors[key] = torch.from_numpy(resized.copy())
        resizes.append({"file": name, "size": list(size), "tensor": key})
    # The size _resize_to_target_area picks, for sizes above 1024² pixels.
    areas = []
    for w, h in [(1025, 1024), (1024, 1025), (2000, 1500), (4032, 3024), (1920, 1080), (8192, 1024), (1100, 1000), (3000, 3000)]:
        scale = math.sqrt(1024 * 1024 / (w * h))
        areas.append({"size": [w, h], "resized": [int(w * scale), int(h * scale)]})
    save_file(tensors, str(out / "goldens.safetensors"), metadata={"generator": "test_vectors/generate_references.py"})
    (out / "cases.json").write_text(json.dumps({"loads": loads, "resizes": resizes, "target_area": areas}, indent=2) + "\n")
    print(f"images: {len(loads)} loads, {len(resizes)} resizes, {len(areas)} target sizes")


def main() -> None:
    """Every golden, or with case names as arguments (`tiny-9b-kv/reference-kv`) those cases alone."""
    import sys
    torch.manual_seed(0)
    chosen = sys.argv[1:]
    kv_model()
    if not chosen:
        image_goldens()
    pipes = {}
    for case in CASES:
        if not chosen or f"{case[0]}/{case[1]}" in chosen:
            run_case(pipes, *case)


if __name__ == "__main__":
    main()
