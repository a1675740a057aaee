"""Goldens of inpainting and image-to-image: `Flux2KleinInpaintPipeline` (diffusers 0.42.1)
in float32 on the saved tiny models.

Each case folder holds the init image and mask PNGs (and a reference, where the case has one),
`case.json`, `goldens.safetensors` and the pipeline's `image.png`. The goldens: the starting
noise (drawn as flux-lite draws it: torch's generator in bf16, widened; the pipeline's own
`randn_tensor` is replaced by that draw, as every golden here does), the packed init-image
latents the schedule mixes with it, the packed mask as the pipeline interpolates it to the token
grid, the latents it starts from, and the latents after each step it runs.

Run from test_vectors/:  python3 generate_inpaint.py
"""

import json
from pathlib import Path

import numpy as np
import PIL.Image
import torch
from safetensors.torch import save_file

import diffusers.pipelines.flux2.pipeline_flux2_klein_inpaint as inpaint_module
from diffusers import Flux2KleinInpaintPipeline
from tiny_models import MODEL_SPECS
from tiny_tokenizer import MAX_SEQ
from generate_references import pattern

ROOT = Path(__file__).resolve().parent
GOLDENS = ROOT / "goldens"


def rect_mask(width, height, box):
    m = np.zeros((height, width), np.uint8)
    x0, y0, x1, y1 = box
    m[y0:y1, x0:x1] = 255
    return m


def blob_mask(width, height, seed):
    """An irregular mask: a disc with a ragged edge, grey levels around the threshold."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    r = np.hypot((x - 0.6 * width) / width, (y - 0.4 * height) / height)
    v = 255 * (0.35 - r) / 0.1 + 40 * rng.standard_normal((height, width))
    return np.clip(np.round(128 + v), 0, 255).astype(np.uint8)


# (model, case, prompt, seed, steps, guidance, strength, init (w, h, seed), mask, reference[, padding_mask_crop])
# mask: ("rect", w, h, box) | ("blob", w, h, seed) | ("white", w, h) | ("rgb-blob", w, h, seed)
CASES = [
    ("tiny-a", "inpaint-rect", "a red fox in the snow", 3, 2, 1.0, 1.0, (66, 50, 11), ("rect", 64, 48, (16, 8, 40, 32)), None),
    ("tiny-a", "inpaint-blob", "a red fox in the snow", 4, 4, 1.0, 0.5, (64, 48, 12), ("blob", 64, 48, 5), None),
    ("tiny-a", "img2img-reference", "the same fox, in summer", 6, 3, 1.0, 0.6, (48, 64, 13), ("white", 48, 64), (74, 82, 14)),
    ("tiny-a", "inpaint-mask-rescaled", "a lighthouse", 7, 2, 1.0, 0.75, (64, 64, 15), ("rgb-blob", 128, 128, 6), None),
    ("tiny-b", "inpaint-cfg", "blue bird", 8, 2, 4.0, 0.75, (64, 48, 16), ("blob", 64, 48, 7), None),
    # padding_mask_crop: the region around a blob (grown by 6 pixels, widened to 80:48), filled
    # up to 80x48, and the result pasted back over the 90x60 init image (the PNG's size).
    ("tiny-a", "inpaint-crop", "a red fox in the snow", 9, 2, 1.0, 0.9, (90, 60, 17), ("blob", 90, 60, 8), None, 6),
]


def mask_file(path, kind):
    if kind[0] == "rect":
        PIL.Image.fromarray(rect_mask(kind[1], kind[2], kind[3]), "L").save(path)
    elif kind[0] == "blob":
        PIL.Image.fromarray(blob_mask(kind[1], kind[2], kind[3]), "L").save(path)
    elif kind[0] == "white":
        PIL.Image.fromarray(np.full((kind[2], kind[1]), 255, np.uint8), "L").save(path)
    elif kind[0] == "rgb-blob":
        grey = blob_mask(kind[1], kind[2], kind[3]).astype(np.int32)
        rgb = np.stack([grey, np.clip(grey + 30, 0, 255), np.clip(grey - 30, 0, 255)], axis=-1).astype(np.uint8)
        PIL.Image.fromarray(rgb, "RGB").save(path)
    else:
        raise ValueError(kind)


@torch.no_grad()
def run_case(pipes, model, name, prompt, seed, steps, guidance, strength, init, mask, reference, crop=None):
    if model not in pipes:
        pipe = Flux2KleinInpaintPipeline.from_pretrained(ROOT / "models" / model, dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        pipes[model] = pipe
    pipe = pipes[model]
    out = GOLDENS / model / name
    out.mkdir(parents=True, exist_ok=True)
    PIL.Image.fromarray(pattern(init[0], init[1], 3, init[2]), "RGB").save(out / "init.png")
    mask_file(out / "mask.png", mask)
    if reference:
        PIL.Image.fromarray(pattern(reference[0], reference[1], 3, reference[2]), "RGB").save(out / "ref0.png")
    unit = pipe.vae_scale_factor * 2
    width, height = init[0] // unit * unit, init[1] // unit * unit
    shape = (1, pipe.transformer.config.in_channels, height // unit, width // unit)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.bfloat16).to(torch.float32)

    captured = {"steps": []}
    real_randn = inpaint_module.randn_tensor
    real_prepare_latents = pipe.prepare_latents
    real_prepare_mask = pipe.prepare_mask_latents

    def randn(shape_asked, **kwargs):
        assert tuple(shape_asked) == shape, (shape_asked, shape)
        return noise.clone()

    def prepare_latents(*args, **kwargs):
        result = real_prepare_latents(*args, **kwargs)
        captured["start"], captured["noise"], captured["init"] = result[0][0].clone(), result[1][0].clone(), result[2][0].clone()
        return result

    def prepare_mask(*args, **kwargs):
        result = real_prepare_mask(*args, **kwargs)
        captured["mask"] = result[0].clone()
        return result

    def on_step_end(_pipe, i, t, kwargs):
        captured["steps"].append(kwargs["latents"][0].clone())
        return {}

    inpaint_module.randn_tensor = randn
    pipe.prepare_latents = prepare_latents
    pipe.prepare_mask_latents = prepare_mask
    try:
        result = pipe(
            prompt=prompt,
            image=PIL.Image.open(out / "init.png"),
            mask_image=PIL.Image.open(out / "mask.png"),
            image_reference=PIL.Image.open(out / "ref0.png") if reference else None,
            strength=strength,
            padding_mask_crop=crop,
            num_inference_steps=steps,
            guidance_scale=guidance,
            output_type="pil",
            max_sequence_length=MAX_SEQ,
            text_encoder_out_layers=next(m for m in MODEL_SPECS if m.name == model).out_layers,
            callback_on_step_end=on_step_end,
            callback_on_step_end_tensor_inputs=["latents"],
        )
    finally:
        inpaint_module.randn_tensor = real_randn
        pipe.prepare_latents = real_prepare_latents
        pipe.prepare_mask_latents = real_prepare_mask
    pil = result.images[0]
    assert pil.size == ((width, height) if crop is None else tuple(init[:2])), (pil.size, width, height)
    g = {
        "noise": captured["noise"].contiguous(),
        "init_latents": captured["init"].contiguous(),
        "mask": captured["mask"][:, 0].contiguous(),
        "start": captured["start"].contiguous(),
    }
    assert torch.equal(g["noise"], noise.reshape(shape[1], -1).T)
    for i, latents in enumerate(captured["steps"]):
        g[f"latents.{i}"] = latents.contiguous()
    save_file(g, str(out / "goldens.safetensors"), metadata={"generator": "test_vectors/generate_inpaint.py"})
    pil.save(out / "image.png")
    case = {
        "model": model,
        "prompt": prompt,
        "seed": seed,
        "steps": steps,
        "steps_run": len(captured["steps"]),
        "guidance": guidance,
        "strength": strength,
        "width": width,
        "height": height,
        "init": {"file": "init.png", "size": list(init[:2])},
        "mask": {"file": "mask.png", "kind": mask[0], "size": list(mask[1:3])},
        "references": ["ref0.png"] if reference else [],
    }
    if crop is not None:
        case["mask_crop"] = crop
    (out / "case.json").write_text(json.dumps(case, indent=2) + "\n")
    m = g["mask"]
    print(f"{model}/{name}: {width}x{height}, {case['steps_run']} of {steps} steps, mask mean {m.mean():.3f}, image mean {np.asarray(pil).mean():.1f}")


def main():
    """Every case, or those whose names are given (python3 generate_inpaint.py inpaint-crop)."""
    import sys
    pipes = {}
    for case in CASES:
        if len(sys.argv) == 1 or case[1] in sys.argv[1:]:
            run_case(pipes, *case)


if __name__ == "__main__":
    main()
