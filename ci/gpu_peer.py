"""The PyTorch peer of `flux-lite bench kernels`, timed on the same GPU in
the same run (ci/gpu-run.sh): the same matrix products in bf16 and f32, and
one FLUX.2-klein transformer step with diffusers' Flux2Transformer2DModel
built from the model's config with random weights (no download), with its
first double and first single block timed inside the step; and the VAE
(diffusers' AutoencoderKLFlux2 from its config, random weights) decoding
and encoding one image in bf16.

Prints one `skipped:` line and exits 0 where PyTorch, diffusers or a CUDA
device is missing, so the GPU script goes on.
"""

import argparse
import json
import re
import statistics
import sys
import time


def parse_shapes(text):
    """`M×K · K×N` rows (as the bench prints them) to (m, k, n)."""
    shapes = []
    for m, k, k2, n in re.findall(r"(\d+)×(\d+) · (\d+)×(\d+)", text):
        if k == k2 and (int(m), int(k), int(n)) not in shapes:
            shapes.append((int(m), int(k), int(n)))
    return shapes


def timer(torch, device):
    """Seconds of `fn()`: CUDA events on a GPU, the wall clock elsewhere."""

    def measure(fn, repeats):
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times)

    return measure


def products(torch, device, shapes, repeats):
    measure = timer(torch, device)
    for m, k, n in shapes:
        for dtype, name in [(torch.bfloat16, "bf16"), (torch.float32, "f32")]:
            x = torch.randn(m, k, device=device, dtype=dtype)
            w = torch.randn(n, k, device=device, dtype=dtype)
            seconds = measure(lambda: x @ w.T, repeats)
            print(f"peer linear {m}×{k} · {k}×{n} {name}: {seconds * 1e3:.3f} ms, {2 * m * k * n / seconds / 1e12:.1f} TFLOP/s")


def load_config(path):
    """A diffusers config.json without its `_` entries: what `from_config` takes."""
    with open(path) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def step(torch, device, config_path, size, repeats):
    try:
        from diffusers import Flux2Transformer2DModel
    except ImportError as e:
        print(f"peer step: skipped: diffusers has no Flux2Transformer2DModel here ({e})")
        return
    config = load_config(config_path)
    # Built on the device in bf16: random initialisation of 4 billion
    # parameters on the host in f32 would take minutes and 16 GB.
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with device:
            model = Flux2Transformer2DModel.from_config(config).eval()
    finally:
        torch.set_default_dtype(default)
    side = size // 16
    image_tokens, text_tokens = side * side, 512
    hidden = torch.randn(1, image_tokens, config["in_channels"], device=device, dtype=torch.bfloat16)
    text = torch.randn(1, text_tokens, config["joint_attention_dim"], device=device, dtype=torch.bfloat16)
    # Position ids as the pipeline makes them: (t, h, w, l) per token.
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols, torch.zeros_like(rows)], dim=-1).reshape(-1, 4).to(device)
    txt_ids = torch.zeros(text_tokens, 4, dtype=torch.int64, device=device)
    txt_ids[:, 3] = torch.arange(text_tokens)
    timestep = torch.full((1,), 0.5, device=device, dtype=torch.bfloat16)
    blocks = {}

    def hooks(name, module):
        def pre(_m, _args, _kwargs):
            if device.type == "cuda":
                torch.cuda.synchronize()
            blocks[name + ".start"] = time.perf_counter()

        def post(_m, _args, _kwargs, _out):
            if device.type == "cuda":
                torch.cuda.synchronize()
            blocks.setdefault(name, []).append(time.perf_counter() - blocks[name + ".start"])

        module.register_forward_pre_hook(pre, with_kwargs=True)
        module.register_forward_hook(post, with_kwargs=True)

    if len(model.transformer_blocks) > 0:
        hooks("double block", model.transformer_blocks[0])
    if len(model.single_transformer_blocks) > 0:
        hooks("single block", model.single_transformer_blocks[0])

    def forward():
        with torch.no_grad():
            model(hidden_states=hidden, encoder_hidden_states=text, timestep=timestep, img_ids=img_ids, txt_ids=txt_ids, guidance=None, return_dict=False)

    seconds = timer(torch, device)(forward, repeats)
    print(f"peer step {size}² ({image_tokens} image + {text_tokens} text tokens) bf16: {seconds * 1e3:.2f} ms")
    for name in ["double block", "single block"]:
        if name in blocks:
            # The block's own time inside the timed steps (the warm-up's dropped); hooks synchronise, so it is a bound.
            print(f"peer {name} bf16: {statistics.median(blocks[name][1:] or blocks[name]) * 1e3:.2f} ms")


def vae(torch, device, config_path, size, repeats):
    try:
        from diffusers import AutoencoderKLFlux2
    except ImportError as e:
        print(f"peer vae: skipped: diffusers has no AutoencoderKLFlux2 here ({e})")
        return
    config = load_config(config_path)
    model = AutoencoderKLFlux2.from_config(config).to(device=device, dtype=torch.bfloat16).eval()
    # The latents' grid: 2^(levels - 1) downsamplings.
    factor = 2 ** (len(config["block_out_channels"]) - 1)
    latents = torch.randn(1, config["latent_channels"], size // factor, size // factor, device=device, dtype=torch.bfloat16)
    image = torch.rand(1, config["in_channels"], size, size, device=device, dtype=torch.bfloat16) * 2 - 1

    def decode():
        with torch.no_grad():
            model.decode(latents, return_dict=False)

    def encode():
        with torch.no_grad():
            model.encode(image, return_dict=False)

    measure = timer(torch, device)
    print(f"peer vae decode {size}² bf16: {measure(decode, repeats) * 1e3:.2f} ms")
    print(f"peer vae encode {size}² bf16: {measure(encode, repeats) * 1e3:.2f} ms")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bench", help="a file holding `flux-lite bench kernels` output: its linear shapes are timed")
    p.add_argument("--config", help="the transformer's config.json for the step")
    p.add_argument("--vae-config", help="the VAE's config.json: its decode and encode are timed")
    p.add_argument("--size", type=int, default=1024, help="image side of the step and the VAE, pixels")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cuda", help="cuda (skipped without one) or cpu (to check this script)")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("peer: skipped: PyTorch is not installed (carry torch and diffusers as wheels; see docs/selftest-and-gpu.md, 'On a GPU')")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"peer: skipped: no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)")
        return 0
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"peer: torch {torch.__version__} on {name}; medians of {args.repeats} after a warm-up")
    if args.bench:
        with open(args.bench) as f:
            products(torch, device, parse_shapes(f.read()), args.repeats)
    if args.config:
        step(torch, device, args.config, args.size, args.repeats)
    if args.vae_config:
        vae(torch, device, args.vae_config, args.size, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
