"""Config files of the published FLUX.2-klein 4B and 9B pipelines, without weights.

Each folder under configs/ has the official diffusers layout (model_index.json,
scheduler/, text_encoder/, transformer/, vae/ with their config files) and no
weight files: `flux-lite info` plans a run from it by estimating the weight
sizes from the configs. The shapes are the published ones (klein-4B: 5 double
+ 20 single blocks, 24 heads, Qwen3-4B; klein-9B: 8 double + 24 single
blocks, 32 heads, Qwen3-8B; both the same 32-channel VAE). The modules are
built on torch's meta device, so nothing is allocated.
"""

import json
import shutil
from pathlib import Path

import torch
from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
from transformers import Qwen3Config

from tiny_models import QWEN3_FIXED, SCHEDULER_CONFIG, transformer_config, vae_config


ROOT = Path(__file__).resolve().parent / "configs"

TRANSFORMER_4B = transformer_config(
    in_channels=128,
    num_layers=5,
    num_single_layers=20,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=7680,
    axes_dims_rope=(32, 32, 32, 32),
)
TRANSFORMER_9B = dict(TRANSFORMER_4B, num_layers=8, num_single_layers=24, num_attention_heads=32, joint_attention_dim=12288)

QWEN3_COMMON = dict(
    QWEN3_FIXED,
    vocab_size=151936,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    bos_token_id=151643,
    eos_token_id=151645,
)
QWEN3_4B = dict(QWEN3_COMMON, hidden_size=2560, intermediate_size=9728, tie_word_embeddings=True)
QWEN3_8B = dict(QWEN3_COMMON, hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False)

VAE = vae_config((128, 256, 512, 512), layers_per_block=2, latent_channels=32, norm_num_groups=32, sample_size=1024)


def write(name: str, transformer: dict, qwen: dict, is_distilled: bool) -> None:
    out = ROOT / name
    if out.exists():
        shutil.rmtree(out)
    with torch.device("meta"):
        Flux2Transformer2DModel(**transformer).save_config(out / "transformer")
        AutoencoderKLFlux2(**VAE).save_config(out / "vae")
    FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG).save_config(out / "scheduler")
    qwen_config = Qwen3Config(**qwen)
    qwen_config.architectures = ["Qwen3ForCausalLM"]
    qwen_config.save_pretrained(out / "text_encoder")
    index = {
        "_class_name": "Flux2KleinPipeline",
        "is_distilled": is_distilled,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    }
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    for f in sorted(out.rglob("*.json")):
        print(f.relative_to(ROOT))


def main() -> None:
    write("klein-4b", TRANSFORMER_4B, QWEN3_4B, is_distilled=True)
    write("klein-9b", TRANSFORMER_9B, QWEN3_8B, is_distilled=True)


if __name__ == "__main__":
    main()
