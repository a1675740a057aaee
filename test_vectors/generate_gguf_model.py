#!/usr/bin/env python3
"""tiny-q: a tiny FLUX.2-klein whose transformer is one GGUF file, and diffusers' image of it.

The text encoder, tokenizer, VAE and scheduler are tiny-a's; the transformer has widths that
are multiples of 256 (inner 256 = 4 heads x 64, MLP 768), which K-quants need, one double and
one single block. Its weights (seeded, random) are written as ComfyUI-GGUF and
stable-diffusion.cpp lay FLUX.2 out: BFL's tensor names, the block linears and modulations
quantized (each a different GGML type, so one file holds Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
Q2_K ... Q6_K), the input, timestep and final layers and the norms kept in F32, one of them in
BF16 and one in F16. Legacy types are quantized by gguf-py; K-quants by the simple fits below
(any valid blocks serve: the test is the expansion, not the fit). gguf-py's writer writes the
file, to models/tiny-q/transformer/tiny-q.gguf, beside the transformer's config.json.

The golden: diffusers 0.42.1 runs the pipeline in float32 with the transformer's weights as
gguf-py's `dequantize` gives them, brought to diffusers' names by diffusers' own
`convert_flux2_transformer_checkpoint_to_diffusers`. (diffusers' GGUF loader is not the
reference: its dequantization does the scale arithmetic in float16, so its weights differ from
gguf-py's in the last bits; the difference of its image is printed for the record.)

    python3 test_vectors/generate_gguf_model.py
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import torch
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFWriter, quants
from safetensors.torch import save_file

import generate as g
import tiny_models as m
from diffusers import Flux2Transformer2DModel
from tiny_tokenizer import MAX_SEQ
from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

NAME = "tiny-q"
MODEL = m.MODELS_DIR / NAME
GOLDENS = g.GOLDENS_DIR / NAME
CASE = dict(prompt="a red fox in the snow", seed=7, width=64, height=48, steps=2, guidance=1.0)

TRANSFORMER = dict(m.TINY_A.transformer, num_layers=1, num_single_layers=1, attention_head_dim=64, num_attention_heads=4,
                   axes_dims_rope=(16, 16, 16, 16))

# The quantized tensors, each given its own type so that one file holds them all.
QUANTIZED = {
    "double_blocks.0.img_attn.qkv.weight": T.Q4_0,
    "double_blocks.0.img_attn.proj.weight": T.Q4_1,
    "double_blocks.0.img_mlp.0.weight": T.Q5_0,
    "double_blocks.0.img_mlp.2.weight": T.Q5_1,
    "double_blocks.0.txt_attn.qkv.weight": T.Q8_0,
    "double_blocks.0.txt_attn.proj.weight": T.Q2_K,
    "double_blocks.0.txt_mlp.0.weight": T.Q3_K,
    "double_blocks.0.txt_mlp.2.weight": T.Q4_K,
    "single_blocks.0.linear1.weight": T.Q5_K,
    "single_blocks.0.linear2.weight": T.Q6_K,
    "double_stream_modulation_img.lin.weight": T.Q4_K,
    "double_stream_modulation_txt.lin.weight": T.Q8_0,
    "single_stream_modulation.lin.weight": T.Q6_K,
    "final_layer.adaLN_modulation.1.weight": T.Q5_0,
}
HALF = {"time_in.out_layer.weight": T.BF16, "time_in.in_layer.weight": T.F16}


def to_bfl(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' names to BFL's (the inverse of diffusers' converter), fused projections joined."""
    out = {}
    top = {
        "x_embedder": "img_in",
        "context_embedder": "txt_in",
        "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
        "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
        "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
        "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
        "single_stream_modulation.linear": "single_stream_modulation.lin",
        "proj_out": "final_layer.linear",
    }
    for k, v in top.items():
        out[f"{v}.weight"] = sd[f"{k}.weight"]
    shift, scale = sd["norm_out.linear.weight"].chunk(2, dim=0)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat([scale, shift], dim=0)
    for i in range(TRANSFORMER["num_layers"]):
        p = f"transformer_blocks.{i}."
        q = f"double_blocks.{i}."
        out[q + "img_attn.qkv.weight"] = torch.cat([sd[p + f"attn.to_{x}.weight"] for x in "qkv"], dim=0)
        out[q + "txt_attn.qkv.weight"] = torch.cat([sd[p + f"attn.add_{x}_proj.weight"] for x in "qkv"], dim=0)
        pairs = {
            "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
            "ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2",
            "ff_context.linear_in": "txt_mlp.0", "ff_context.linear_out": "txt_mlp.2",
        }
        for a, b in pairs.items():
            out[q + b + ".weight"] = sd[p + a + ".weight"]
        norms = {"norm_q": "img_attn.norm.query_norm", "norm_k": "img_attn.norm.key_norm",
                 "norm_added_q": "txt_attn.norm.query_norm", "norm_added_k": "txt_attn.norm.key_norm"}
        for a, b in norms.items():
            out[q + b + ".scale"] = sd[p + f"attn.{a}.weight"]
    for i in range(TRANSFORMER["num_single_layers"]):
        p = f"single_transformer_blocks.{i}.attn."
        q = f"single_blocks.{i}."
        out[q + "linear1.weight"] = sd[p + "to_qkv_mlp_proj.weight"]
        out[q + "linear2.weight"] = sd[p + "to_out.weight"]
        out[q + "norm.query_norm.scale"] = sd[p + "norm_q.weight"]
        out[q + "norm.key_norm.scale"] = sd[p + "norm_k.weight"]
    assert len(out) == len(sd) - 2 * 3 * TRANSFORMER["num_layers"] + 2 * TRANSFORMER["num_layers"], (len(out), len(sd))
    return out


def f16(x):
    return x.astype(np.float16)


def safe_div(a, b):
    return np.divide(a, b, out=np.zeros_like(a, dtype=np.float32), where=b != 0)


def k_quantize(x: np.ndarray, qtype) -> np.ndarray:
    """A simple fit of rows of f32 into K-quant blocks, laid out as ggml reads them."""
    nb = x.size // 256
    x = x.reshape(nb, 256).astype(np.float32)
    i = np.arange(256)
    if qtype in (T.Q4_K, T.Q5_K):
        nmax = 15 if qtype == T.Q4_K else 31
        sub = x.reshape(nb, 8, 32)
        mn = np.minimum(sub.min(-1), 0)
        scale = (sub.max(-1) - mn) / nmax
        d, dmin = f16(scale.max(-1) / 63), f16((-mn).max(-1) / 63)
        sc = np.clip(np.round(safe_div(scale, d.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
        m = np.clip(np.round(safe_div(-mn, dmin.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
        eff = d.astype(np.float32)[:, None] * sc
        off = dmin.astype(np.float32)[:, None] * m
        q = np.clip(np.round(safe_div(sub + off[..., None], eff[..., None])), 0, nmax).astype(np.uint8).reshape(nb, 256)
        scales = np.zeros((nb, 12), np.uint8)
        scales[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
        scales[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
        scales[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
        qs = np.zeros((nb, 128), np.uint8)
        np.bitwise_or.at(qs, (slice(None), 32 * (i // 64) + i % 32), ((q & 15) << (4 * ((i % 64) // 32))).astype(np.uint8))
        parts = [d.view(np.uint8).reshape(nb, 2), dmin.view(np.uint8).reshape(nb, 2), scales]
        if qtype == T.Q5_K:
            qh = np.zeros((nb, 32), np.uint8)
            np.bitwise_or.at(qh, (slice(None), i % 32), ((q >> 4) << (i // 32)).astype(np.uint8))
            parts.append(qh)
        return np.concatenate(parts + [qs], axis=1)
    if qtype == T.Q6_K:
        sub = x.reshape(nb, 16, 16)
        scale = np.abs(sub).max(-1) / 31
        d = f16(scale.max(-1) / 127)
        sc = np.clip(np.round(safe_div(scale, d.astype(np.float32)[:, None])), -128, 127).astype(np.int8)
        eff = d.astype(np.float32)[:, None] * sc
        q = (np.clip(np.round(safe_div(sub, eff[..., None])), -32, 31) + 32).astype(np.uint8).reshape(nb, 256)
        ql = np.zeros((nb, 128), np.uint8)
        qh = np.zeros((nb, 64), np.uint8)
        h, r = i // 128, i % 128
        np.bitwise_or.at(ql, (slice(None), 64 * h + r % 64), ((q & 15) << (4 * (r // 64))).astype(np.uint8))
        np.bitwise_or.at(qh, (slice(None), 32 * h + r % 32), ((q >> 4) << (2 * (r // 32))).astype(np.uint8))
        return np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(nb, 2)], axis=1)
    if qtype == T.Q2_K:
        sub = x.reshape(nb, 16, 16)
        mn = np.minimum(sub.min(-1), 0)
        scale = (sub.max(-1) - mn) / 3
        d, dmin = f16(scale.max(-1) / 15), f16((-mn).max(-1) / 15)
        sc = np.clip(np.round(safe_div(scale, d.astype(np.float32)[:, None])), 0, 15).astype(np.uint8)
        m = np.clip(np.round(safe_div(-mn, dmin.astype(np.float32)[:, None])), 0, 15).astype(np.uint8)
        eff = d.astype(np.float32)[:, None] * sc
        off = dmin.astype(np.float32)[:, None] * m
        q = np.clip(np.round(safe_div(sub + off[..., None], eff[..., None])), 0, 3).astype(np.uint8).reshape(nb, 256)
        qs = np.zeros((nb, 64), np.uint8)
        h, r = i // 128, i % 128
        np.bitwise_or.at(qs, (slice(None), 32 * h + r % 32), (q << (2 * (r // 32))).astype(np.uint8))
        return np.concatenate([sc | (m << 4), qs, d.view(np.uint8).reshape(nb, 2), dmin.view(np.uint8).reshape(nb, 2)], axis=1)
    if qtype == T.Q3_K:
        sub = x.reshape(nb, 16, 16)
        scale = np.abs(sub).max(-1) / 4
        d = f16(scale.max(-1) / 31)
        sc = np.clip(np.round(safe_div(scale, d.astype(np.float32)[:, None])), -32, 31).astype(np.int32)
        eff = d.astype(np.float32)[:, None] * sc
        q = (np.clip(np.round(safe_div(sub, eff[..., None])), -4, 3) + 4).astype(np.uint8).reshape(nb, 256)
        s6 = (sc + 32).astype(np.uint8)
        scales = np.zeros((nb, 12), np.uint8)
        for k in range(16):
            scales[:, k % 8] |= (s6[:, k] & 15) << (4 * (k // 8))
            scales[:, 8 + k % 4] |= (s6[:, k] >> 4) << (2 * (k // 4))
        hmask = np.zeros((nb, 32), np.uint8)
        np.bitwise_or.at(hmask, (slice(None), i % 32), ((q >> 2) << (i // 32)).astype(np.uint8))
        qs = np.zeros((nb, 64), np.uint8)
        h, r = i // 128, i % 128
        np.bitwise_or.at(qs, (slice(None), 32 * h + r % 32), ((q & 3) << (2 * (r // 32))).astype(np.uint8))
        return np.concatenate([hmask, qs, scales, d.view(np.uint8).reshape(nb, 2)], axis=1)
    raise ValueError(qtype)


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    if qtype in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
        rows = x.shape[0]
        return k_quantize(x, qtype).reshape(rows, -1)
    return quants.quantize(x, qtype)


def write_gguf(bfl: dict[str, torch.Tensor], path) -> None:
    writer = GGUFWriter(str(path), "flux")
    for name, t in bfl.items():
        x = t.detach().to(torch.float32).numpy()
        qtype = QUANTIZED.get(name) or HALF.get(name)
        if qtype is None:
            writer.add_tensor(name, x)
        elif qtype in (T.BF16, T.F16):
            writer.add_tensor(name, quants.quantize(x, qtype), raw_dtype=qtype)
        else:
            blocks = quantize(x, qtype)
            back = quants.dequantize(blocks, qtype)
            err = np.linalg.norm(back - x) / np.linalg.norm(x)
            assert err < 0.6, (name, qtype.name, err)  # a fit, however rough, not garbage
            writer.add_tensor(name, blocks, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# llama.cpp's Qwen3 names for transformers', and the type each text encoder tensor is written in.
LLAMA_NAMES = {
    "self_attn.q_proj": ("attn_q", T.Q8_0), "self_attn.k_proj": ("attn_k", T.Q8_0),
    "self_attn.v_proj": ("attn_v", T.Q8_0), "self_attn.o_proj": ("attn_output", T.Q8_0),
    "self_attn.q_norm": ("attn_q_norm", None), "self_attn.k_norm": ("attn_k_norm", None),
    "input_layernorm": ("attn_norm", None), "post_attention_layernorm": ("ffn_norm", None),
    "mlp.gate_proj": ("ffn_gate", T.Q4_1), "mlp.up_proj": ("ffn_up", T.Q4_1), "mlp.down_proj": ("ffn_down", T.Q5_0),
}


def write_text_encoder_gguf(sd: dict[str, torch.Tensor], path) -> None:
    """tiny-a's Qwen3 text encoder as llama.cpp's converter lays a Qwen3 GGUF out (names, F32 norms)."""
    writer = GGUFWriter(str(path), "qwen3")
    for name, t in sd.items():
        x = t.detach().to(torch.float32).numpy()
        if name == "model.embed_tokens.weight":
            gname, qtype = "token_embd.weight", T.Q8_0
        elif name == "model.norm.weight":
            gname, qtype = "output_norm.weight", None
        elif name == "lm_head.weight":
            continue  # tied to the embeddings, as llama.cpp leaves it out
        else:
            rest = name.removeprefix("model.layers.")
            i, module = rest.split(".", 1)
            short, qtype = LLAMA_NAMES[module.removesuffix(".weight")]
            gname = f"blk.{i}.{short}.weight"
        if qtype is None:
            writer.add_tensor(gname, x)
        else:
            writer.add_tensor(gname, quants.quantize(x, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def text_encoder_from_gguf(path) -> dict[str, torch.Tensor]:
    """The text encoder's weights as gguf-py expands the file, under transformers' names."""
    inverse = {short: module for module, (short, _) in LLAMA_NAMES.items()}
    out = {}
    for name, t in expanded_bfl(path).items():
        if name == "token_embd.weight":
            out["model.embed_tokens.weight"] = t
        elif name == "output_norm.weight":
            out["model.norm.weight"] = t
        else:
            _, i, short, _ = name.split(".")
            out[f"model.layers.{i}.{inverse[short]}.weight"] = t
    return out


# BFL-named tensors kept in bf16 in the FP8 single file; every other 2-D weight is F8_E4M3.
FP8_KEPT = ("img_in.", "txt_in.", "time_in.", "final_layer.linear.")


def write_fp8(bfl: dict[str, torch.Tensor], path) -> dict[str, torch.Tensor]:
    """A scaled-FP8 single file under BFL's names: each F8_E4M3 weight with a float32
    `weight_scale` (one with ComfyUI's `scale_weight` spelling, one with no scale at all: 1)
    and an `input_scale` hint; the rest bf16. Returns the weights as torch expands them
    (`w.to(float32) * scale`), float32."""
    out, expanded = {}, {}
    for i, (name, t) in enumerate(bfl.items()):
        x = t.detach().to(torch.float32)
        if x.dim() != 2 or name.startswith(FP8_KEPT):
            out[name] = x.to(torch.bfloat16)
            expanded[name] = out[name].to(torch.float32)
            continue
        module = name.removesuffix(".weight")
        unscaled = name == "single_stream_modulation.lin.weight"
        scale = torch.tensor(1.0 if unscaled else float(x.abs().max()) / 448.0, dtype=torch.float32)
        w8 = (x / scale).to(torch.float8_e4m3fn)
        out[name] = w8
        if not unscaled:
            out[f"{module}.{'scale_weight' if i % 5 == 0 else 'weight_scale'}"] = scale
            out[f"{module}.input_scale"] = torch.tensor(1.0, dtype=torch.float32)
        expanded[name] = w8.to(torch.float32) * scale
    save_file(out, str(path))
    return expanded


def expanded_bfl(path) -> dict[str, torch.Tensor]:
    """The file's tensors as gguf-py's dequantize gives them, float32."""
    out = {}
    for t in GGUFReader(str(path)).tensors:
        values = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        out[t.name] = torch.from_numpy(values.reshape([int(d) for d in reversed(t.shape)]).copy())
    return out


@torch.no_grad()
def main() -> None:
    tiny_a = m.MODELS_DIR / "tiny-a"
    if MODEL.exists():
        shutil.rmtree(MODEL)
    shutil.copytree(tiny_a, MODEL, ignore=shutil.ignore_patterns("transformer"))
    (MODEL / "transformer").mkdir()
    torch.manual_seed(97)
    gen = torch.Generator().manual_seed(98)
    spec = m.ModelSpec(name=NAME, seed=97, is_distilled=True, transformer=TRANSFORMER, qwen=m.TINY_A.qwen, vae=m.TINY_A.vae, out_layers=m.TINY_A.out_layers)
    transformer = m.build_transformer(spec, gen)
    transformer.save_config(MODEL / "transformer")
    gguf_path = MODEL / "transformer" / f"{NAME}.gguf"
    write_gguf(to_bfl(transformer.state_dict()), gguf_path)

    weights = convert_flux2_transformer_checkpoint_to_diffusers(expanded_bfl(gguf_path))
    pipe = m.load_float32_pipeline(tiny_a)
    model = Flux2Transformer2DModel(**TRANSFORMER).eval()
    model.load_state_dict(weights, strict=True)
    pipe.transformer = model.to(torch.float32)
    case = g.Case(spec, "gguf", CASE["prompt"], CASE["seed"], CASE["width"], CASE["height"], CASE["steps"], CASE["guidance"])
    noise = g.make_noise(pipe, case)
    final = {}

    def keep(_pipe, _i, _t, kwargs):
        final["latents"] = kwargs["latents"]
        return kwargs

    def run():
        return pipe(prompt=case.prompt, height=case.height, width=case.width, num_inference_steps=case.steps,
                    guidance_scale=case.guidance, latents=noise.to(torch.float32), output_type="pil",
                    max_sequence_length=MAX_SEQ, text_encoder_out_layers=spec.out_layers,
                    callback_on_step_end=keep, callback_on_step_end_tensor_inputs=["latents"]).images[0]

    image = run()
    if GOLDENS.exists():
        shutil.rmtree(GOLDENS)
    GOLDENS.mkdir(parents=True)
    image.save(GOLDENS / "gguf.png")
    save_file({"latents": g.f32(final["latents"][0])}, GOLDENS / "gguf-latents.safetensors")
    (GOLDENS / "case.json").write_text(json.dumps(dict(CASE, model=NAME), indent=2) + "\n")

    # The text encoder from a llama.cpp-style GGUF (Q8_0, Q4_1, Q5_0 and F32 norms) as well.
    te_path = GOLDENS / "text-encoder.gguf"
    write_text_encoder_gguf(pipe.text_encoder.state_dict(), te_path)
    original = {k: v.clone() for k, v in pipe.text_encoder.state_dict().items()}
    missing, unexpected = pipe.text_encoder.load_state_dict(text_encoder_from_gguf(te_path), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    run().save(GOLDENS / "gguf-text-encoder.png")
    pipe.text_encoder.load_state_dict(original)
    pipe.transformer = model.to(torch.float32)

    # A LoRA in BFL's layout (generate_lora.py's) on the GGUF transformer: its adapted linears
    # include quantized ones (the blocks, a modulation) and plain ones (img_in, txt_in).
    import generate_lora
    generate_lora.bfl_file(model.config, GOLDENS / "lora-bfl.safetensors")
    pipe.load_lora_weights(str(GOLDENS), weight_name="lora-bfl.safetensors", adapter_name="bfl")
    run().save(GOLDENS / "gguf-lora.png")
    pipe.unload_lora_weights()
    pipe.transformer = model.to(torch.float32)

    # BFL's scaled FP8 as a single file, against the same pipeline on torch's expansion of it.
    fp8 = write_fp8(to_bfl(transformer.state_dict()), GOLDENS / "transformer-fp8.safetensors")
    model8 = Flux2Transformer2DModel(**TRANSFORMER).eval()
    model8.load_state_dict(convert_flux2_transformer_checkpoint_to_diffusers(fp8), strict=True)
    pipe.transformer = model8.to(torch.float32)
    run().save(GOLDENS / "fp8.png")
    pipe.transformer = model.to(torch.float32)

    # For the record: diffusers' own GGUF loader, whose float16 scale arithmetic moves the weights.
    try:
        from diffusers import GGUFQuantizationConfig
        own = Flux2Transformer2DModel.from_single_file(
            str(gguf_path), quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32),
            config=str(MODEL), subfolder="transformer", torch_dtype=torch.float32)
        pipe.transformer = own
        other = np.asarray(run(), dtype=np.int16)
        diff = np.abs(other - np.asarray(image, dtype=np.int16))
        print(f"diffusers' GGUF loader: image max |diff| {diff.max()}, mean {diff.mean():.4f} levels from gguf-py's weights")
    except Exception as e:  # noqa: BLE001 (the record is optional)
        print(f"diffusers' GGUF loader did not run: {type(e).__name__}: {e}")
    print(f"wrote {MODEL} and {GOLDENS}")


if __name__ == "__main__":
    main()
