#!/usr/bin/env python3
"""What `padding_mask_crop`'s image steps give, by diffusers' own Flux2ImageProcessor.

Seeded masks and pictures (smooth gradients with noise, RGB and L, sizes with odd sides) run
through diffusers 0.42.1's `get_crop_region` (masks: one or two blobs, at edges and corners,
with several pads and output sizes), `_resize_and_fill` (LANCZOS; ratios wider, narrower and
equal, so the fill's edge strips are exercised from both sides), Flux2's `_resize_and_crop`
(a centre crop, also to windows larger than the image), `apply_overlay` (the decoded image put back over the original through the mask), and PIL's
own `Image.resize` on its own
(LANCZOS and BICUBIC, with and without a box, shapes on both sides of Pillow 13's rule for
which pass runs first). Written to goldens/mask_crop/cases.safetensors:
u8 tensors `<kind>.<i>.in` / `.out` (height, width, channels) and the cases' parameters and
expected boxes as JSON in the metadata.

    python3 test_vectors/generate_mask_crop.py
"""

import json
from pathlib import Path

import numpy as np
import torch
from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
from PIL import Image
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "goldens" / "mask_crop" / "cases.safetensors"


def picture(rng, w, h, mode):
    yy, xx = np.mgrid[0:h, 0:w]
    chans = 3 if mode == "RGB" else 1
    planes = [(xx * rng.uniform(0.5, 4) + yy * rng.uniform(0.5, 4) + rng.normal(0, 20, (h, w))) % 256 for _ in range(chans)]
    arr = np.stack(planes, -1).clip(0, 255).astype(np.uint8)
    return Image.fromarray(arr[..., 0] if chans == 1 else arr, mode)


def blob_mask(rng, w, h, blobs):
    arr = np.zeros((h, w), np.uint8)
    for x0, y0, bw, bh in blobs:
        arr[y0:y0 + bh, x0:x0 + bw] = rng.integers(1, 256, (min(bh, h - y0), min(bw, w - x0)))
    return Image.fromarray(arr, "L")


def main():
    rng = np.random.default_rng(20261127)
    # The inpaint pipeline's processors (image and mask) are Flux2ImageProcessors: LANCZOS, and
    # a `_resize_and_crop` that only centre-crops.
    proc = Flux2ImageProcessor(vae_scale_factor=16)
    tensors, meta = {}, {"regions": [], "fill": [], "crop": [], "resize": [], "overlay": []}
    region_cases = [
        (61, 47, [(20, 10, 9, 5)], 48, 32, 0), (61, 47, [(20, 10, 9, 5)], 48, 32, 6), (61, 47, [(0, 0, 4, 30)], 32, 48, 3),
        (64, 64, [(50, 55, 14, 9)], 64, 32, 10), (40, 90, [(5, 80, 30, 10), (2, 3, 3, 3)], 32, 64, 4),
        (100, 30, [(95, 12, 5, 4)], 16, 16, 2), (33, 33, [(16, 16, 1, 1)], 48, 16, 50),
    ]
    for i, (w, h, blobs, width, height, pad) in enumerate(region_cases):
        mask = blob_mask(rng, w, h, blobs)
        box = proc.get_crop_region(mask, width, height, pad=pad)
        tensors[f"region.{i}.in"] = torch.from_numpy(np.asarray(mask)[..., None].copy())
        meta["regions"].append({"width": width, "height": height, "pad": pad, "box": [int(v) for v in box]})
    resize_cases = [(57, 31, "RGB", 48, 32), (31, 57, "RGB", 48, 32), (50, 25, "RGB", 32, 16), (23, 47, "L", 32, 48),
                    (90, 20, "L", 40, 40), (17, 64, "RGB", 64, 32), (64, 48, "RGB", 16, 48), (88, 60, "RGB", 90, 57)]
    for kind, fn in (("fill", proc._resize_and_fill), ("crop", proc._resize_and_crop)):
        for i, (w, h, mode, width, height) in enumerate(resize_cases):
            img = picture(rng, w, h, mode)
            out = fn(img, width, height)
            if mode == "L":
                out = out.convert("L")  # diffusers makes RGB; grey stays grey (as the mask processor converts it back)
            arr_in, arr_out = np.asarray(img), np.asarray(out)
            tensors[f"{kind}.{i}.in"] = torch.from_numpy(arr_in.reshape(h, w, -1).copy())
            tensors[f"{kind}.{i}.out"] = torch.from_numpy(arr_out.reshape(height, width, -1).copy())
            meta[kind].append({"width": width, "height": height})
    plain_cases = [(17, 64, "RGB", 8, 32, "lanczos", None), (36, 51, "L", 40, 21, "lanczos", None),
                   (54, 38, "RGB", 30, 67, "lanczos", None), (41, 36, "L", 8, 16, "lanczos", None),
                   (20, 88, "RGB", 4, 22, "lanczos", None), (24, 24, "RGB", 57, 44, "bicubic", None),
                   (30, 33, "RGB", 38, 19, "bicubic", None), (40, 30, "RGB", 25, 50, "lanczos", (3.5, 2.0, 31.0, 27.25)),
                   (26, 20, "L", 26, 5, "bicubic", (0, 20, 26, 20)), (33, 45, "RGB", 9, 45, "bicubic", (33, 0, 33, 45))]
    filters = {"lanczos": Image.LANCZOS, "bicubic": Image.BICUBIC}
    for i, (w, h, mode, width, height, name, box) in enumerate(plain_cases):
        img = picture(rng, w, h, mode)
        out = img.resize((width, height), filters[name], box=box)
        tensors[f"resize.{i}.in"] = torch.from_numpy(np.asarray(img).reshape(h, w, -1).copy())
        tensors[f"resize.{i}.out"] = torch.from_numpy(np.asarray(out).reshape(height, width, -1).copy())
        meta["resize"].append({"width": width, "height": height, "filter": name, "box": list(box) if box else [0, 0, w, h]})
    overlay_cases = [(61, 47, [(20, 10, 9, 5)], 48, 32, 6, 48, 32), (64, 64, [(50, 55, 14, 9)], 64, 32, 10, 64, 32),
                     (40, 90, [(5, 80, 30, 10), (2, 3, 3, 3)], 32, 64, 4, 32, 64), (90, 60, [(70, 2, 20, 30)], 88, 60, 6, 88, 60)]
    for i, (w, h, blobs, width, height, pad, dw, dh) in enumerate(overlay_cases):
        mask = blob_mask(rng, w, h, blobs)
        original = picture(rng, w, h, "RGB")
        decoded = picture(rng, dw, dh, "RGB")
        box = proc.get_crop_region(mask, width, height, pad=pad)
        out = proc.apply_overlay(mask, original, decoded, box)
        for part, img in (("mask", mask), ("original", original), ("decoded", decoded), ("out", out)):
            arr = np.asarray(img)
            tensors[f"overlay.{i}.{part}"] = torch.from_numpy(arr.reshape(arr.shape[0], arr.shape[1], -1).copy())
        meta["overlay"].append({"box": [int(v) for v in box]})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(OUT), metadata={"cases": json.dumps(meta)})
    print(f"wrote {OUT}: {len(region_cases)} regions, {len(resize_cases)} fills and crops, {len(plain_cases)} resizes")


if __name__ == "__main__":
    main()
