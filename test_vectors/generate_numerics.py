#!/usr/bin/env python3
"""Goldens for flux-lite's torch-compatible noise and the FLUX.2 schedule.

Writes two small files next to the model goldens:

- ``goldens/noise.safetensors``: ``torch.randn`` outputs of a fresh
  ``torch.Generator().manual_seed(seed)`` for several seeds and shapes, in
  float32 and bfloat16, plus one sequence of successive calls on a single
  generator.
- ``goldens/schedule.json``: ``FlowMatchEulerDiscreteScheduler`` sigmas and
  timesteps computed as ``Flux2KleinPipeline`` computes them, for several
  (image tokens, steps) pairs and scheduler configs.

Run after ``generate.py`` (which deletes and rewrites ``goldens/``):

    python3 test_vectors/generate_numerics.py

CPU only, a few seconds. The noise depends on the CPU kernel torch picks: the
x86-64 wheel (AVX2 or AVX-512 capability) is the reference that flux-lite
reproduces; on other CPUs torch's vectorised normal kernel differs in the last
bits, so the script warns there.
"""

import json
import platform
from pathlib import Path

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu, retrieve_timesteps
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent
GOLDENS_DIR = ROOT / "goldens"

SEEDS = [0, 42, 2**32 + 7, 2**63 - 1]
SHAPES = [
    (1,),
    (2,),
    (7,),
    (15,),
    (16,),
    (17,),
    (33,),
    (1000,),
    (3, 5, 7),
    (1, 16, 4, 4),
    (1, 32, 4, 6),
    (1, 128, 8, 8),
]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

# One generator, several calls in a row: the scalar path (< 16 elements) caches
# the second Box-Muller sample across calls and the vector path leaves it alone.
SEQUENCE_SEED = 42
SEQUENCE = [((5,), "f32"), ((20,), "f32"), ((3,), "f32"), ((1, 16, 4, 4), "bf16"), ((7,), "bf16"), ((33,), "f32")]

# (image tokens S, steps N). 4300 is the switch of compute_empirical_mu; the
# tiny goldens use (64, 1), (96, 4), (16, 3) and (24, 2).
SCHEDULE_CASES = [
    (16, 3),
    (24, 2),
    (64, 1),
    (96, 4),
    (256, 4),
    (1024, 4),
    (4096, 4),
    (4096, 50),
    (4300, 4),
    (4301, 4),
    (4608, 4),
    (16384, 28),
]
SCHEDULER_CONFIGS = {
    # The FLUX.2 family config (klein's scheduler_config.json).
    "flux2": dict(
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=True,
        time_shift_type="exponential",
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    ),
    "flux2_linear": dict(
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=True,
        time_shift_type="linear",
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    ),
    "static_shift3": dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False),
    # FlowMatchEulerDiscreteScheduler() as the diffusers unit test builds it.
    "default": dict(),
}


def randn(shape, generator, dtype):
    return torch.randn(shape, generator=generator, dtype=dtype)


def noise_goldens():
    tensors = {}
    for seed in SEEDS:
        for shape in SHAPES:
            for name, dtype in DTYPES.items():
                g = torch.Generator().manual_seed(seed)
                key = f"randn/{name}/{seed}/{'x'.join(map(str, shape))}"
                tensors[key] = randn(shape, g, dtype).contiguous()
    g = torch.Generator().manual_seed(SEQUENCE_SEED)
    for i, (shape, name) in enumerate(SEQUENCE):
        tensors[f"sequence/{SEQUENCE_SEED}/{i}/{name}"] = randn(shape, g, DTYPES[name]).contiguous()

    # Checks of the facts flux-lite relies on.
    for seed in SEEDS:
        a = randn((40,), torch.Generator().manual_seed(seed), torch.float32)
        b = randn((40,), torch.Generator().manual_seed(seed & 0xFFFFFFFF), torch.float32)
        assert torch.equal(a, b), "seeds should act through their low 32 bits"
    g = torch.Generator().manual_seed(0)
    first = randn((5,), g, torch.float32)
    second = randn((3,), g, torch.float32)
    both = randn((8,), torch.Generator().manual_seed(0), torch.float32)
    assert torch.equal(torch.cat([first, second]), both), "scalar path should cache across calls"

    path = GOLDENS_DIR / "noise.safetensors"
    # A single metadata entry: safetensors writes the metadata map in hash
    # order, so more than one key would make the file differ between runs.
    save_file(tensors, str(path), metadata={"generator": "test_vectors/generate_numerics.py"})
    print(f"wrote {path.relative_to(ROOT)}: {len(tensors)} tensors, {path.stat().st_size} bytes")


def f32_bits(values):
    return [int(b) for b in np.asarray(values, dtype=np.float32).view(np.uint32)]


def schedule_goldens():
    configs = {}
    for name, kwargs in SCHEDULER_CONFIGS.items():
        scheduler = FlowMatchEulerDiscreteScheduler(**kwargs)
        c = scheduler.config
        cases = []
        for seq_len, steps in SCHEDULE_CASES:
            # Exactly Flux2KleinPipeline.__call__, step 6.
            sigmas = np.linspace(1.0, 1 / steps, steps)
            mu = compute_empirical_mu(image_seq_len=seq_len, num_steps=steps)
            timesteps, n = retrieve_timesteps(scheduler, steps, "cpu", sigmas=sigmas, mu=mu)
            assert n == steps
            got_sigmas = scheduler.sigmas.numpy()
            assert got_sigmas.dtype == np.float32 and timesteps.dtype == torch.float32
            cases.append(
                {
                    "image_seq_len": seq_len,
                    "steps": steps,
                    "mu": mu,
                    "sigmas": [float(s) for s in got_sigmas],
                    "sigmas_bits": f32_bits(got_sigmas),
                    "timesteps": [float(t) for t in timesteps.numpy()],
                    "timesteps_bits": f32_bits(timesteps.numpy()),
                }
            )
        configs[name] = {
            "config": {
                "num_train_timesteps": c.num_train_timesteps,
                "shift": c.shift,
                "use_dynamic_shifting": c.use_dynamic_shifting,
                "time_shift_type": c.time_shift_type,
                "base_shift": c.base_shift,
                "max_shift": c.max_shift,
                "base_image_seq_len": c.base_image_seq_len,
                "max_image_seq_len": c.max_image_seq_len,
            },
            "cases": cases,
        }
    out = {"generator": "test_vectors/generate_numerics.py", "configs": configs}
    path = GOLDENS_DIR / "schedule.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)}: {path.stat().st_size} bytes")


def main():
    capability = torch.backends.cpu.get_cpu_capability()
    if platform.machine() not in ("x86_64", "AMD64") or capability not in ("AVX2", "AVX512"):
        print(
            f"warning: torch runs the {capability} kernels on {platform.machine()}; flux-lite reproduces the "
            "x86-64 AVX2 normal kernel, so the >= 16-element noise goldens may not match it"
        )
    print(f"torch {torch.__version__}, {platform.machine()}, CPU capability {capability}")
    GOLDENS_DIR.mkdir(exist_ok=True)
    noise_goldens()
    schedule_goldens()


if __name__ == "__main__":
    main()
