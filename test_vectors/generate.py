#!/usr/bin/env python3
"""Regenerate flux-lite's test vectors: two tiny random FLUX.2-klein pipelines in the
official diffusers layout, and goldens computed by diffusers in float32.

Run from anywhere:  python3 test_vectors/generate.py
Everything is deterministic (fixed torch seeds, CPU only). See README.md for the layout.
The tokenizer, the models, the recording hooks and the DiT checks live in tiny_tokenizer.py,
tiny_models.py, pipeline_recorder.py and dit_reference.py; the other generate_*.py scripts
import them and this one's cases and noise.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import Qwen2TokenizerFast

from dit_reference import check_dit_chain, check_dit_reference
from pipeline_recorder import Recorder
from tiny_models import MODEL_SPECS, ROOT, TINY_9B, TINY_A, TINY_B, ModelSpec, build_pipeline, check_weights_match, load_float32_pipeline, save_pipeline
from tiny_tokenizer import MAX_SEQ, build_tokenizer, check_tokenizer, dump_tokenizer_cases, tokenizer_cases

GOLDENS_DIR = ROOT / "goldens"
CLAMP_LIMIT = 0.30  # max fraction of decoded pixels allowed to sit at 0 or 1

@dataclass
class Case:
    model: ModelSpec
    name: str
    prompt: str
    seed: int
    width: int
    height: int
    steps: int
    guidance: float


CASES = [
    Case(TINY_A, "one-step", "a red fox in the snow", 42, 32, 32, 1, 1.0),
    Case(TINY_A, "four-step-wide", "Ünïcödé café 東京 🦊 at night", 7, 48, 32, 4, 1.0),
    Case(TINY_B, "three-step", "a lighthouse on a cliff, 1998\nsecond line", 0, 32, 32, 3, 1.0),
    Case(TINY_B, "cfg", "blue bird", 3, 32, 48, 2, 4.0),
    Case(TINY_9B, "two-step", "a paper boat on a pond", 11, 32, 32, 2, 1.0),
]


def vae_scale_factor(pipe) -> int:
    return 2 ** (len(pipe.vae.config.block_out_channels) - 1)


def make_noise(pipe, case: Case) -> torch.Tensor:
    """Noise exactly as flux-lite draws it: bf16 randn in the patchified shape (1, C, h, w)."""
    s = vae_scale_factor(pipe)
    assert case.width % (2 * s) == 0 and case.height % (2 * s) == 0
    shape = (1, pipe.transformer.config.in_channels, case.height // (2 * s), case.width // (2 * s))
    gen = torch.Generator().manual_seed(case.seed)
    return torch.randn(shape, generator=gen, dtype=torch.bfloat16)


def f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous()


def unpack_and_denorm(pipe, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Our own decode preparation: tokens → (C, h, w) → BN de-normalisation → unpatchify."""
    s = vae_scale_factor(pipe)
    h, w = height // (2 * s), width // (2 * s)
    x = latents[0].T.reshape(1, -1, h, w)  # token = y*w + x
    bn = pipe.vae.bn
    std = torch.sqrt(bn.running_var + pipe.vae.config.batch_norm_eps).view(1, -1, 1, 1)
    x = x * std + bn.running_mean.view(1, -1, 1, 1)
    c = x.shape[1] // 4
    x = x.reshape(1, c, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(1, c, 2 * h, 2 * w)
    return x


@torch.no_grad()
def run_case(pipe, case: Case) -> dict:
    spec = case.model
    noise = make_noise(pipe, case)  # (1, C, h, w) bf16
    packed = noise.reshape(1, noise.shape[1], -1).permute(0, 2, 1)  # (1, S, C)
    S, C = packed.shape[1], packed.shape[2]
    do_cfg = case.guidance > 1.0 and not spec.is_distilled
    calls_per_step = 2 if do_cfg else 1

    with Recorder(pipe) as rec:
        result = pipe(
            prompt=case.prompt,
            height=case.height,
            width=case.width,
            num_inference_steps=case.steps,
            guidance_scale=case.guidance,
            # diffusers packs the (B, C, h, w) latents itself (prepare_latents); pass them unpacked.
            latents=noise.to(torch.float32),
            output_type="pil",
            max_sequence_length=MAX_SEQ,
            text_encoder_out_layers=spec.out_layers,
            callback_on_step_end=rec.on_step_end,
            callback_on_step_end_tensor_inputs=["latents"],
        )
    pil = result.images[0]
    sched = pipe.scheduler

    n = case.steps
    assert len(rec.te_inputs) == (2 if do_cfg else 1)
    assert len(rec.tr_calls) == n * calls_per_step
    assert len(rec.sched_steps) == n and len(rec.step_latents) == n
    assert len(rec.decode_in) == 1

    g: dict[str, torch.Tensor] = {}
    g["input_ids"] = rec.te_inputs[0]["input_ids"][0].to(torch.int64)
    g["attention_mask"] = rec.te_inputs[0]["attention_mask"][0].to(torch.int64)
    hidden = rec.te_hidden[0]
    assert len(hidden) == pipe.text_encoder.config.num_hidden_layers + 1
    num_layers = pipe.text_encoder.config.num_hidden_layers
    for k in spec.out_layers:
        # hidden_states[k] is the raw output of decoder layer k-1 (only the last entry is normed).
        assert torch.equal(hidden[k], rec.te_layer_out[k - 1]), k
        g[f"hidden_states.{k}"] = f32(hidden[k][0])
    assert not torch.equal(hidden[num_layers], rec.te_layer_out[num_layers - 1])
    prompt_embeds = rec.tr_calls[0]["encoder_hidden_states"][0]
    g["prompt_embeds"] = f32(prompt_embeds)
    # prompt_embeds[:, slot*hidden + d] = hidden_states[out_layers[slot]][:, d]
    stacked = torch.cat([hidden[k][0] for k in spec.out_layers], dim=-1)
    assert torch.equal(stacked, prompt_embeds)
    if do_cfg:
        g["negative_input_ids"] = rec.te_inputs[1]["input_ids"][0].to(torch.int64)
        g["negative_attention_mask"] = rec.te_inputs[1]["attention_mask"][0].to(torch.int64)
        g["negative_prompt_embeds"] = f32(rec.tr_calls[1]["encoder_hidden_states"][0])
        neg_stacked = torch.cat([rec.te_hidden[1][k][0] for k in spec.out_layers], dim=-1)
        assert torch.equal(neg_stacked, rec.tr_calls[1]["encoder_hidden_states"][0])
    qcos, qsin = rec.qwen_rope[0]
    g["qwen_rope_cos"] = f32(qcos[0])
    g["qwen_rope_sin"] = f32(qsin[0])

    g["noise"] = f32(packed[0])
    assert torch.equal(rec.tr_calls[0]["hidden_states"][0], g["noise"])  # diffusers packed it the same way
    g["sigmas"] = f32(sched.sigmas)
    g["timesteps"] = f32(sched.timesteps)
    assert g["sigmas"].shape == (n + 1,) and g["timesteps"].shape == (n,)

    # pos_embed is called on img_ids first, then txt_ids (transformer forward).
    img_ids, img_cos, img_sin = rec.pos_embed[0]
    txt_ids, txt_cos, txt_sin = rec.pos_embed[1]
    assert img_cos.shape[0] == S and txt_cos.shape[0] == MAX_SEQ
    g["txt_ids"] = txt_ids.to(torch.int64)
    g["img_ids"] = img_ids.to(torch.int64)
    g["txt_rope_cos"], g["txt_rope_sin"] = f32(txt_cos), f32(txt_sin)
    g["img_rope_cos"], g["img_rope_sin"] = f32(img_cos), f32(img_sin)

    for i in range(n):
        call = rec.tr_calls[i * calls_per_step]
        g[f"temb.{i}"] = f32(rec.temb[i * calls_per_step][0])
        g[f"timestep_input.{i}"] = f32(rec.temb_input[i * calls_per_step]).reshape(1)
        g[f"timestep_sinusoid.{i}"] = f32(rec.sinusoid[i * calls_per_step][0])
        if do_cfg:
            assert torch.equal(rec.temb[2 * i], rec.temb[2 * i + 1])
            g[f"velocity_pos.{i}"] = f32(call["out"][0, :S])
            g[f"velocity_neg.{i}"] = f32(rec.tr_calls[2 * i + 1]["out"][0, :S])
            guided = g[f"velocity_neg.{i}"] + case.guidance * (g[f"velocity_pos.{i}"] - g[f"velocity_neg.{i}"])
            assert torch.equal(guided, rec.sched_steps[i]["velocity"][0])
        g[f"velocity.{i}"] = f32(rec.sched_steps[i]["velocity"][0])
        g[f"latents.{i}"] = f32(rec.step_latents[i][0])
        if not do_cfg:
            assert torch.equal(rec.sched_steps[i]["velocity"][0], call["out"][0, :S])
        assert torch.equal(rec.sched_steps[i]["prev"], rec.step_latents[i])

    # DiT internals, block by block, for every step (cfg: the positive pass only). Checked for every call.
    tr = pipe.transformer
    assert len(rec.tr_inner) == n * calls_per_step
    rope = (
        torch.cat([g["txt_rope_cos"], g["img_rope_cos"]]),
        torch.cat([g["txt_rope_sin"], g["img_rope_sin"]]),
    )
    for c, inner in enumerate(rec.tr_inner):
        check_dit_chain(tr, inner, S, rec.tr_calls[c]["out"][0], rec.temb[c][0])
        check_dit_reference(tr, inner, rec.sinusoid[c][0], rec.temb_input[c].reshape(1), rope)
    n_double, n_single = len(tr.transformer_blocks), len(tr.single_transformer_blocks)
    for i in range(n):
        inner = rec.tr_inner[i * calls_per_step]
        # proj_out(norm_out) is the velocity of this pass (the conditional one for cfg).
        v = g[f"velocity_pos.{i}"] if do_cfg else g[f"velocity.{i}"]
        assert torch.equal(inner["proj_out"], v)
        assert torch.allclose(inner["norm_out"] @ tr.proj_out.weight.T, v, rtol=0, atol=1e-5)
        keys = ["x_embed", "context_embed", "mod_img", "mod_txt", "mod_single", "norm_out"]
        keys += [f"double.{b}.{part}" for b in range(n_double) for part in ("in_img", "in_txt", "out_img", "out_txt")]
        keys += [f"single.{b}.{part}" for b in range(n_single) for part in ("in", "out")]
        for key in keys:
            assert f"tr.{key}.{i}" not in g
            g[f"tr.{key}.{i}"] = f32(inner[key])

    z = rec.decode_in[0]
    g["denorm_latent"] = f32(z[0])
    decoded = rec.decode_out[0]
    g["decoded"] = f32(decoded[0])
    image = (decoded[0] / 2 + 0.5).clamp(0, 1)
    g["image"] = f32(image)

    # --- independent checks --------------------------------------------------------------
    # 1. The Euler steps reproduce the captured latents (f32 arithmetic, as the scheduler).
    lat = packed.to(torch.float32)[0]
    for i in range(n):
        lat = lat + (g["sigmas"][i + 1] - g["sigmas"][i]) * g[f"velocity.{i}"]
        assert torch.allclose(lat, g[f"latents.{i}"], rtol=0, atol=1e-6), i
        lat = g[f"latents.{i}"]
    # 2. Our own unpack/de-normalise/unpatchify of the final latents gives what entered the VAE.
    z_own = unpack_and_denorm(pipe, g[f"latents.{n - 1}"][None], case.height, case.width)
    assert torch.allclose(z_own, z, rtol=0, atol=1e-6)
    # 3. Decoding it again reproduces the pipeline image and PNG.
    dec_own = pipe.vae.decode(z_own, return_dict=False)[0]
    assert torch.allclose(dec_own, decoded, rtol=0, atol=1e-5)
    u8 = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    pil_np = np.asarray(pil.convert("RGB"))
    assert pil_np.shape == (case.height, case.width, 3)
    assert np.array_equal(u8, pil_np)

    clamped = float(((image <= 0.0) | (image >= 1.0)).float().mean())
    stats = {
        "clamped_fraction": clamped,
        "image_mean": float(image.mean()),
        "image_std": float(image.std()),
        "velocity0_std": float(g["velocity.0"].std()),
        "prompt_embeds_std": float(g["prompt_embeds"].std()),
    }
    return {"tensors": g, "pil": pil, "stats": stats}


def write_case(case: Case, out: dict) -> Path:
    d = GOLDENS_DIR / case.model.name / case.name
    d.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": case.model.name,
        "model_dir": f"models/{case.model.name}",
        "prompt": case.prompt,
        "seed": case.seed,
        "width": case.width,
        "height": case.height,
        "steps": case.steps,
        "guidance": case.guidance,
        "cfg": case.guidance > 1.0 and not case.model.is_distilled,
        "text_encoder_out_layers": list(case.model.out_layers),
        "max_sequence_length": MAX_SEQ,
        "noise_shape": list(make_noise_shape(case)),
        "clamped_fraction": round(out["stats"]["clamped_fraction"], 6),
    }
    (d / "case.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    tensors = {k: v.contiguous() for k, v in sorted(out["tensors"].items())}
    save_file(tensors, str(d / "goldens.safetensors"), metadata={"generator": "test_vectors/generate.py"})
    out["pil"].save(d / "image.png")
    return d


def make_noise_shape(case: Case) -> tuple[int, ...]:
    s = 2 ** (len(case.model.vae["block_out_channels"]) - 1)
    return (1, case.model.transformer["in_channels"], case.height // (2 * s), case.width // (2 * s))


def main() -> None:
    tokenizer = build_tokenizer()
    check_tokenizer(tokenizer)

    if GOLDENS_DIR.exists():
        shutil.rmtree(GOLDENS_DIR)
    GOLDENS_DIR.mkdir(parents=True)

    model_dirs = {}
    for spec in MODEL_SPECS:
        pipe16 = build_pipeline(spec, tokenizer)
        model_dirs[spec.name] = save_pipeline(spec, pipe16)
        pipe32 = load_float32_pipeline(model_dirs[spec.name])
        check_weights_match(pipe32, pipe16)
        # The Qwen3 rope base survived the round trip through config.json (either spelling).
        te = pipe32.text_encoder
        hd = te.config.head_dim
        want_inv_freq = 1.0 / (1_000_000.0 ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        assert torch.allclose(te.model.rotary_emb.inv_freq, want_inv_freq, rtol=1e-6, atol=0)
        # The tokenizer as the Rust side will read it (from the saved folder).
        saved_tok = pipe32.tokenizer
        check_tokenizer(saved_tok)
        for case in [c for c in CASES if c.model is spec]:
            out = run_case(pipe32, case)
            d = write_case(case, out)
            st = out["stats"]
            print(
                f"{spec.name}/{case.name}: clamped={st['clamped_fraction']:.3f} mean={st['image_mean']:.3f} "
                f"std={st['image_std']:.3f} v0_std={st['velocity0_std']:.3f} emb_std={st['prompt_embeds_std']:.3f}"
                f" -> {d.relative_to(ROOT)}"
            )
            assert st["clamped_fraction"] <= CLAMP_LIMIT, st

    # Tokenizer cases, from the tokenizer as reloaded from a saved model folder.
    tok = Qwen2TokenizerFast.from_pretrained(model_dirs["tiny-a"] / "tokenizer")
    check_tokenizer(tok)
    cases = tokenizer_cases(tok)
    assert cases == tokenizer_cases(tokenizer)
    (GOLDENS_DIR / "tokenizer_cases.json").write_text(dump_tokenizer_cases(cases))
    print(f"tokenizer: {len(tok)} tokens, {len(cases)} cases")


if __name__ == "__main__":
    main()
