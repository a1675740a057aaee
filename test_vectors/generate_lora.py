"""Goldens of LoRA adapters: three small adapters for tiny-a's transformer, one
in each layout FLUX.2 LoRAs are published in, and the images diffusers renders
with them (`load_lora_weights`, `set_adapters`) in float32.

- `peft.safetensors`: made with PEFT on the transformer (r 4, lora_alpha 8, so
  scale 2; `to_qkv_mlp_proj` at rank 2 and `proj_out` at alpha 2 through
  PEFT's rank_pattern and alpha_pattern), saved by
  `Flux2KleinPipeline.save_lora_weights` with its `lora_adapter_metadata`, f32.
- `bfl.safetensors`: BFL names as ai-toolkit saves them
  (`diffusion_model.double_blocks.N.img_attn.qkv.lora_A.weight`, `single_blocks.N.linear1`,
  `img_in`, `txt_in`, `final_layer.linear`, …), rank 2, no alpha, bf16.
- `kohya.safetensors`: kohya's names (`lora_unet_double_blocks_N_img_attn_qkv.lora_down.weight`,
  `lora_up`, `.alpha`), rank 3, alpha 1.5 (scale 0.5), bf16.

Cases in `goldens/lora/<case>/` (`case.json`, `image.png`): each file alone at
weight 1, and two adapters at once (`set_adapters(["peft", "kohya"], [0.8, 0.5])`).
Run after generate.py (it loads the saved tiny-a).
"""

import copy
import json
import re
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save_file

from diffusers import Flux2KleinPipeline
from tiny_models import MODEL_SPECS, load_float32_pipeline
from tiny_tokenizer import MAX_SEQ

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "goldens" / "lora"
MODEL = "tiny-a"
PROMPT = "a red fox in the snow"
SEED, STEPS, SIZE = 42, 2, 32
# The adapters' matrices: normal with these standard deviations, large enough
# that every adapter visibly changes the image.
DOWN_STD, UP_STD = 0.25, 0.25


def normal(gen: torch.Generator, shape, std: float) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def peft_file(pipe, path: Path) -> None:
    transformer = copy.deepcopy(pipe.transformer)
    targets = (
        r".*transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"
        r"|ff\.linear_in|ff\.linear_out|ff_context\.linear_in|ff_context\.linear_out)"
        r"|.*single_transformer_blocks\.\d+\.attn\.(to_qkv_mlp_proj|to_out)|context_embedder|proj_out"
    )
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=targets,
        rank_pattern={"to_qkv_mlp_proj": 2},
        alpha_pattern={"proj_out": 2},
        init_lora_weights=False,
    )
    transformer.add_adapter(config)
    gen = torch.Generator().manual_seed(101)
    with torch.no_grad():
        for name, module in sorted(transformer.named_modules()):
            if hasattr(module, "lora_A") and "default" in module.lora_A:
                module.lora_A["default"].weight.copy_(normal(gen, module.lora_A["default"].weight.shape, DOWN_STD))
                module.lora_B["default"].weight.copy_(normal(gen, module.lora_B["default"].weight.shape, UP_STD))
    state = get_peft_model_state_dict(transformer)
    assert any("to_qkv_mlp_proj.lora_A" in k for k in state) and any(k.startswith("proj_out.") for k in state)
    Flux2KleinPipeline.save_lora_weights(
        path.parent,
        transformer_lora_layers=state,
        weight_name=path.name,
        transformer_lora_adapter_metadata=config.to_dict(),
    )


def block_linears(config, put, double: str, single: str, dot: str) -> None:
    """`put(name, out, in)` for every linear of the BFL blocks, named by the
    `double` and `single` templates with `dot` between a part's words."""
    d = config.num_attention_heads * config.attention_head_dim
    f = int(d * config.mlp_ratio)
    for i in range(config.num_layers):
        for side in ("img", "txt"):
            for part, out_features, in_features in (("attn.qkv", 3 * d, d), ("attn.proj", d, d), ("mlp.0", 2 * f, d), ("mlp.2", d, f)):
                put(double.format(i=i, side=side, part=part.replace(".", dot)), out_features, in_features)
    for i in range(config.num_single_layers):
        put(single.format(i=i, part="linear1"), 3 * d + 2 * f, d)
        put(single.format(i=i, part="linear2"), d, d + f)


def bfl_file(config, path: Path) -> None:
    d = config.num_attention_heads * config.attention_head_dim
    f = int(d * config.mlp_ratio)
    rank = 2
    gen = torch.Generator().manual_seed(202)
    tensors = {}

    def put(name: str, out_features: int, in_features: int) -> None:
        tensors[f"diffusion_model.{name}.lora_A.weight"] = normal(gen, (rank, in_features), DOWN_STD).to(torch.bfloat16)
        tensors[f"diffusion_model.{name}.lora_B.weight"] = normal(gen, (out_features, rank), UP_STD).to(torch.bfloat16)

    block_linears(config, put, "double_blocks.{i}.{side}_{part}", "single_blocks.{i}.{part}", ".")
    put("img_in", d, config.in_channels)
    put("txt_in", d, config.joint_attention_dim)
    put("final_layer.linear", config.in_channels, d)
    put("double_stream_modulation_img.lin", 6 * d, d)
    save_file(tensors, str(path))


def kohya_file(config, path: Path) -> None:
    rank, alpha = 3, 1.5
    gen = torch.Generator().manual_seed(303)
    tensors = {}

    def put(name: str, out_features: int, in_features: int) -> None:
        tensors[f"lora_unet_{name}.lora_down.weight"] = normal(gen, (rank, in_features), DOWN_STD).to(torch.bfloat16)
        tensors[f"lora_unet_{name}.lora_up.weight"] = normal(gen, (out_features, rank), UP_STD).to(torch.bfloat16)
        tensors[f"lora_unet_{name}.alpha"] = torch.tensor(alpha, dtype=torch.bfloat16)

    block_linears(config, put, "double_blocks_{i}_{side}_{part}", "single_blocks_{i}_{part}", "_")
    save_file(tensors, str(path))


def render(adapters: list[tuple[str, float]]):
    pipe = load_float32_pipeline(ROOT / "models" / MODEL)
    names = []
    for file, _ in adapters:
        name = Path(file).stem
        pipe.load_lora_weights(str(OUT), weight_name=file, adapter_name=name)
        names.append(name)
    if adapters:
        pipe.set_adapters(names, adapter_weights=[w for _, w in adapters])
    shape = (1, pipe.transformer.config.in_channels, SIZE // (2 * pipe.vae_scale_factor), SIZE // (2 * pipe.vae_scale_factor))
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(SEED), dtype=torch.bfloat16)
    result = pipe(
        prompt=PROMPT,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=1.0,
        latents=noise.to(torch.float32),
        output_type="pil",
        max_sequence_length=MAX_SEQ,
        text_encoder_out_layers=next(m for m in MODEL_SPECS if m.name == MODEL).out_layers,
    )
    return result.images[0]


CASES = [
    ("peft", [("peft.safetensors", 1.0)]),
    ("bfl", [("bfl.safetensors", 1.0)]),
    ("kohya", [("kohya.safetensors", 1.0)]),
    ("two", [("peft.safetensors", 0.8), ("kohya.safetensors", 0.5)]),
]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    pipe = load_float32_pipeline(ROOT / "models" / MODEL)
    peft_file(pipe, OUT / "peft.safetensors")
    bfl_file(pipe.transformer.config, OUT / "bfl.safetensors")
    kohya_file(pipe.transformer.config, OUT / "kohya.safetensors")
    base = np.asarray(render([]), dtype=np.float64)
    for name, adapters in CASES:
        image = render(adapters)
        pixels = np.asarray(image, dtype=np.float64)
        change = np.abs(pixels - base).mean()
        clamped = float(np.mean((pixels == 0) | (pixels == 255)))
        # An adapter must change the image clearly, without saturating it.
        assert change > 4.0 and clamped < 0.3, (name, change, clamped)
        folder = OUT / name
        folder.mkdir(exist_ok=True)
        image.save(folder / "image.png")
        case = {"model": MODEL, "prompt": PROMPT, "seed": SEED, "steps": STEPS, "width": SIZE, "height": SIZE, "lora": [[f, w] for f, w in adapters]}
        (folder / "case.json").write_text(json.dumps(case, indent=2) + "\n")
        print(f"lora/{name}: mean change {change:.1f} levels from no adapter, clamped {clamped:.3f}")


if __name__ == "__main__":
    main()
