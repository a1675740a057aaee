#!/usr/bin/env python3
"""A tiny Qwen3 text encoder whose heads are wide enough to split into f16 pieces, and its embedding.

The tiny models' text encoders have heads of 8 values: on the matrix tier's half-precision data
path their queries, keys and values stay f32 (a piece is at least 32 values wide). This encoder
has four query heads and two key/value heads of 32 (hidden 64, MLP 128, four layers; the pipeline
reads layers L/4, L/2, 3L/4 = 1, 2, 3), so the projections write f16 pieces, the per-head norm
and rotate-half RoPE run on them, and attention reads and writes them.

Weights are random (seeded, as generate.py's text encoders), saved as bf16 in transformers'
layout; transformers 5.23 loads them back as the pipeline does (`from_pretrained`, its default
attention), runs them in float32, and diffusers 0.42.1's
`Flux2KleinPipeline._get_qwen3_prompt_embeds` stacks the picked hidden states, as every golden
here. The tokenizer is generate.py's tiny byte-level BPE.

    python3 test_vectors/generate_wide_heads.py

writes test_vectors/models/wide-heads/text_encoder/ (config.json, model.safetensors) and
test_vectors/goldens/wide-heads/goldens.safetensors (input_ids, attention_mask, prompt_embeds).
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import torch
from safetensors.torch import save_file
from transformers import Qwen3ForCausalLM
from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

import tiny_models as m
from tiny_tokenizer import build_tokenizer


NAME = "wide-heads"
SEED = 2468
QWEN = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
PROMPT = "a lighthouse on a cliff at dusk, waves below"
LAYERS = (1, 2, 3)


@torch.no_grad()
def main() -> None:
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    tokenizer = build_tokenizer()
    model = m.build_text_encoder(SimpleNamespace(qwen=QWEN), len(tokenizer), gen)
    # Saved as bf16, run in float32 on the bf16-rounded weights.
    model = model.to(torch.bfloat16)
    out = m.MODELS_DIR / NAME / "text_encoder"
    if out.parent.exists():
        shutil.rmtree(out.parent)
    model.save_pretrained(out, safe_serialization=True)
    # Loaded as the pipeline loads it: the model built in memory attends
    # through another implementation, whose pad rows differ by about 1e-2.
    model = Qwen3ForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    embeds = Flux2KleinPipeline._get_qwen3_prompt_embeds(model, tokenizer, PROMPT, dtype=torch.float32, hidden_states_layers=LAYERS)
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    inputs = tokenizer(text, return_tensors="pt", padding="max_length", truncation=True, max_length=512)
    goldens = m.ROOT / "goldens" / NAME
    goldens.mkdir(parents=True, exist_ok=True)
    tensors = {
        "input_ids": inputs["input_ids"][0].to(torch.int64).contiguous(),
        "attention_mask": inputs["attention_mask"][0].to(torch.int64).contiguous(),
        "prompt_embeds": embeds[0].contiguous(),
    }
    save_file(tensors, str(goldens / "goldens.safetensors"), metadata={"generator": "test_vectors/generate_wide_heads.py"})
    (goldens / "case.json").write_text(json.dumps({"prompt": PROMPT, "text_encoder_out_layers": list(LAYERS), "qwen": QWEN}, indent=2) + "\n")
    print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters; prompt tokens {int(inputs['attention_mask'].sum())}")


if __name__ == "__main__":
    main()
