#!/usr/bin/env python3
"""A negative prompt's golden: `Flux2KleinPipeline` (diffusers 0.42.1) in float32 on the saved
tiny base model, guided, with `negative_prompt_embeds` encoded from a negative text by the same
pipeline's `encode_prompt` (the pipeline takes no negative text itself; it encodes "" when given
none). The noise is drawn as flux-lite draws it (torch's generator in bf16, widened), as every
golden here.

Writes goldens/tiny-b/cfg-negative/: case.json (the prompt, the negative, the settings),
goldens.safetensors (`prompt_embeds`, `negative_prompt_embeds` [512, joint], the final packed
`latents` [tokens, channels]) and the pipeline's image.png.

    python3 test_vectors/generate_negative.py
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from diffusers import Flux2KleinPipeline
from generate import Case, make_noise
from tiny_models import TINY_B
from tiny_tokenizer import MAX_SEQ

ROOT = Path(__file__).resolve().parent
CASE = Case(TINY_B, "cfg-negative", "blue bird", 5, 32, 48, 2, 4.0)
NEGATIVE = "a grey stone wall, blurry, low quality"


@torch.no_grad()
def main():
    pipe = Flux2KleinPipeline.from_pretrained(ROOT / "models" / CASE.model.name, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    layers = CASE.model.out_layers
    positive, _ = pipe.encode_prompt(CASE.prompt, max_sequence_length=MAX_SEQ, text_encoder_out_layers=layers)
    negative, _ = pipe.encode_prompt(NEGATIVE, max_sequence_length=MAX_SEQ, text_encoder_out_layers=layers)
    final = {}

    def keep_latents(_pipe, _step, _t, kwargs):
        final["latents"] = kwargs["latents"].clone()
        return kwargs

    noise = make_noise(pipe, CASE)
    result = pipe(
        prompt_embeds=positive,
        negative_prompt_embeds=negative,
        height=CASE.height,
        width=CASE.width,
        num_inference_steps=CASE.steps,
        guidance_scale=CASE.guidance,
        latents=noise.to(torch.float32),
        output_type="pil",
        max_sequence_length=MAX_SEQ,
        text_encoder_out_layers=layers,
        callback_on_step_end=keep_latents,
        callback_on_step_end_tensor_inputs=["latents"],
    )
    out = ROOT / "goldens" / CASE.model.name / CASE.name
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": CASE.model.name,
        "model_dir": f"models/{CASE.model.name}",
        "prompt": CASE.prompt,
        "negative_prompt": NEGATIVE,
        "seed": CASE.seed,
        "width": CASE.width,
        "height": CASE.height,
        "steps": CASE.steps,
        "guidance": CASE.guidance,
        "cfg": True,
    }
    (out / "case.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    tensors = {
        "prompt_embeds": positive[0].contiguous(),
        "negative_prompt_embeds": negative[0].contiguous(),
        "latents": final["latents"][0].contiguous(),
    }
    save_file(tensors, str(out / "goldens.safetensors"), metadata={"generator": "test_vectors/generate_negative.py"})
    result.images[0].save(out / "image.png")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
