#!/usr/bin/env python3
"""A whole generation on the CPU: flux-lite on a software adapter (lavapipe)
beside diffusers on the same cores, in one run, on one of the project's tiny
models.

    python3 ci/cpu_e2e.py [--binary target/release/flux-lite] [--model test_vectors/models/tiny-a]
                          [--size 256] [--steps 4] [--repeats 3]

Each side runs --repeats times after one warm-up run (which fills flux-lite's
pipeline cache and PyTorch's lazy initialisation), alternating, and the
median wall time is reported:
- flux-lite: the whole `flux-lite gen` process (model opened, prompt
  encoded, steps, VAE decode, PNG written), f32 tier;
- diffusers: `Flux2KleinPipeline.from_pretrained(model, dtype=float32)` and
  the pipeline call to a PIL image, in this process (Python's imports not
  counted), PyTorch with one thread per core.
Same prompt, size, steps, guidance (the model's: 1 when distilled, else 4)
and 512 prompt tokens on both sides. Prints a `skipped:` line and exits 0
where diffusers or torch is not installed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "a red fox in the snow"


def flux_lite_run(binary, model, size, steps, guidance, out):
    cmd = [binary, "gen", "--model", str(model), "--prompt", PROMPT, "--seed", "0", "--steps", str(steps),
           "--guidance", str(guidance), "--width", str(size), "--height", str(size), "--precision", "f32",
           "--quiet", "--output", str(out)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
    return elapsed


def diffusers_run(torch, pipeline_class, model, size, steps, guidance, out_layers):
    start = time.perf_counter()
    pipe = pipeline_class.from_pretrained(model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    pipe(prompt=PROMPT, height=size, width=size, num_inference_steps=steps, guidance_scale=guidance,
         generator=torch.Generator().manual_seed(0), output_type="pil", max_sequence_length=512,
         text_encoder_out_layers=out_layers)
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="target/release/flux-lite")
    p.add_argument("--model", default="test_vectors/models/tiny-a")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    args = p.parse_args()
    try:
        import torch
        from diffusers import Flux2KleinPipeline
    except ImportError as e:
        print(f"skipped: cpu_e2e: diffusers or torch is not installed ({e})")
        return
    torch.set_num_threads(args.threads)
    model = Path(args.model)
    index = json.loads((model / "model_index.json").read_text())
    guidance = 1.0 if index.get("is_distilled", False) else 4.0
    layers = json.loads((model / "text_encoder" / "config.json").read_text())["num_hidden_layers"]
    out_layers = (layers // 4, layers // 2, 3 * layers // 4)
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.png"
        for i in range(args.repeats + 1):
            a = flux_lite_run(args.binary, model, args.size, args.steps, guidance, out)
            b = diffusers_run(torch, Flux2KleinPipeline, model, args.size, args.steps, guidance, out_layers)
            if i > 0:
                ours.append(a)
                theirs.append(b)
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"{model.name} at {args.size}², {args.steps} steps, guidance {guidance}; {args.repeats} runs after a warm-up, medians")
    print("| what | flux-lite (lavapipe, f32) | diffusers (PyTorch CPU f32, "
          f"{args.threads} threads) | flux-lite / diffusers |")
    print("|---|---|---|---|")
    print(f"| whole run | {o:.2f} s ({min(ours):.2f}–{max(ours):.2f}) | {t:.2f} s ({min(theirs):.2f}–{max(theirs):.2f}) | {o / t:.1f}× |")


if __name__ == "__main__":
    main()
