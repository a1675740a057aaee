#!/usr/bin/env python3
"""A FLUX.2-klein-4B with the real widths and a trimmed depth, and diffusers' image of it.

The transformer, text encoder and VAE take their configs from test_vectors/configs/klein-4b
(inner 3072, 24 heads x 128, MLP 9216, joint 7680; Qwen3-4B's 2560 hidden, 32/8 heads x 128,
MLP 9728 and 151,936-token vocabulary; the real VAE) with one double block, two single blocks
and four text-encoder layers (the pipeline reads layers L/4, L/2, 3L/4 = 1, 2, 3). Weights are
random (seeded), in the official diffusers layout, saved as bf16 like the real checkpoint. The
tokenizer is the tiny byte-level BPE of generate.py (its ids all fall inside the vocabulary).

Then diffusers 0.42.1 runs the bf16 weights in float32, as every golden here: one step at
256x256, and writes the PNG and the final packed latents; then the same with that PNG as the
reference image (the VAE encoder and the reference tokens at the real widths).

    python3 test_vectors/generate_real_width.py OUT_DIR

writes OUT_DIR/model/ (about 3.3 GB), OUT_DIR/want.png, OUT_DIR/want-latents.safetensors
(`latents` [tokens, 128] float32), OUT_DIR/want-ref.png and OUT_DIR/want-ref-latents.safetensors
(the reference case) and OUT_DIR/case.json. ci/real-width.sh runs flux-lite on the same folder
and compares. Needs about 12 GB of memory and a few minutes on two cores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import PIL.Image
import torch
from safetensors.torch import save_file

import generate as g
import tiny_models as m
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline
from tiny_tokenizer import MAX_SEQ, build_tokenizer

CONFIGS = g.ROOT / "configs" / "klein-4b"
VOCAB = 151_936
CASE = dict(prompt="a red fox in the snow", seed=42, width=256, height=256, steps=1, guidance=1.0, reference="want.png")


def config(component: str) -> dict:
    cfg = json.loads((CONFIGS / component / "config.json").read_text())
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def spec() -> m.ModelSpec:
    transformer = config("transformer")
    transformer.update(num_layers=1, num_single_layers=2, axes_dims_rope=tuple(transformer["axes_dims_rope"]))
    te = config("text_encoder")
    qwen = {k: te[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")}
    qwen["num_hidden_layers"] = 4
    vae_keys = ("in_channels", "out_channels", "down_block_types", "up_block_types", "block_out_channels", "layers_per_block",
                "latent_channels", "norm_num_groups", "sample_size", "use_quant_conv", "use_post_quant_conv", "mid_block_add_attention")
    vae_cfg = config("vae")
    vae = {k: tuple(vae_cfg[k]) if isinstance(vae_cfg[k], list) else vae_cfg[k] for k in vae_keys}
    return m.ModelSpec(name="real-width", seed=4242, is_distilled=True, transformer=transformer, qwen=qwen, vae=vae, out_layers=(1, 2, 3))


def build(spec: m.ModelSpec, tokenizer):
    torch.manual_seed(spec.seed)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    text_encoder = m.build_text_encoder(spec, VOCAB, gen)
    transformer = m.build_transformer(spec, gen)
    vae = m.build_vae(spec, gen)
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**m.SCHEDULER_CONFIG),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        is_distilled=spec.is_distilled,
    )
    assert transformer.config.joint_attention_dim == 3 * text_encoder.config.hidden_size
    return pipe.to(torch.bfloat16)


@torch.no_grad()
def main() -> None:
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = out / "model"
    tokenizer = build_tokenizer()
    s = spec()
    pipe16 = build(s, tokenizer)
    pipe16.save_pretrained(model, safe_serialization=True)
    del pipe16
    pipe = m.load_float32_pipeline(model)
    case = g.Case(s, "real-width", CASE["prompt"], CASE["seed"], CASE["width"], CASE["height"], CASE["steps"], CASE["guidance"])
    noise = g.make_noise(pipe, case)
    final = {}

    def keep(_pipe, _i, _t, kwargs):
        final["latents"] = kwargs["latents"]
        return kwargs

    def run(name: str, **reference) -> None:
        result = pipe(
            prompt=case.prompt,
            height=case.height,
            width=case.width,
            num_inference_steps=case.steps,
            guidance_scale=case.guidance,
            latents=noise.to(torch.float32),
            output_type="pil",
            max_sequence_length=MAX_SEQ,
            text_encoder_out_layers=s.out_layers,
            callback_on_step_end=keep,
            callback_on_step_end_tensor_inputs=["latents"],
            **reference,
        )
        result.images[0].save(out / f"{name}.png")
        save_file({"latents": g.f32(final["latents"][0])}, out / f"{name}-latents.safetensors")

    run("want")
    run("want-ref", image=PIL.Image.open(out / CASE["reference"]))
    (out / "case.json").write_text(json.dumps(CASE, indent=2) + "\n")
    print(f"wrote {model} and diffusers' {case.width}x{case.height} images of it (without and with a reference) in {out}")


if __name__ == "__main__":
    main()
