#!/usr/bin/env bash
# One call on a Linux machine with a GPU and no Rust toolchain: settles
# correctness and speed there from a release binary built elsewhere.
#
#   bash ci/gpu-run.sh [BINARY] [REPORT]
#
# BINARY: flux-lite built with `cargo build --release -p flux-lite-cli`
# (default target/release/flux-lite). REPORT: the one file everything goes
# to (default gpu-report.txt, or $OUT/gpu-report.txt when OUT is set); it is
# printed as it grows. In order:
#   1. the Vulkan loader: unpacked from .gl/*.deb when the machine lacks one
#      (docs/selftest-and-gpu.md, "On a GPU", says how to fetch them), NVIDIA's ICD named;
#   2. nvidia-smi, `flux-lite gpu`, `flux-lite selftest` (every tier the GPU
#      offers, against the references and diffusers' tiny-model goldens);
#   3. `flux-lite bench kernels` with the 4B's shapes (linears, LoRA,
#      attention, blocks, the VAE decode at 1024² beside the tiny preview
#      decoder, DF11's and the GGUF types' expansion, the tier table), one
#      4B step at 1024², and the
#      9B's linears, attention and blocks; then the matrix tier's fallback
#      attention (FLUX_LITE_ATTENTION_KERNEL=matrix: attention_matrix.wgsl,
#      what runs where flash fails its start-up check) checked and timed, and
#      the f32 tier's tiled attention timed beside them;
#   4. beside them, PyTorch on the same GPU (ci/gpu_peer.py): the bench's
#      matrix products in bf16 and f32 and one 4B transformer step, with its
#      first double and single block, in bf16 (skipped, with a line saying
#      why, without PyTorch, diffusers or CUDA);
#   5. where the flash attention failed its start-up check (the adapter's
#      notice says so), the selftest again with each one-change variant of
#      the kernel (ci/flash_variants.py), 30 s each.
# Each step has its own time limit so that the whole fits in 10 minutes.
# ci/gpu-variants.sh is the short second call (where the matrix linear's
# k step spends its time).
# FLUX_LITE_GPU_RUN_TOKENS sets the benches' token rows (default 4608: a
# 1024² image and the 512-token prompt); FLUX_LITE_GPU_RUN_QUICK=1 runs a
# small version (64 rows, linears and attention only, a 256² step) to try
# the script on a software driver.
set -uo pipefail
cd "$(dirname "$0")/.."

binary="${1:-target/release/flux-lite}"
report="${2:-${OUT:+$OUT/}gpu-report.txt}"
tokens="${FLUX_LITE_GPU_RUN_TOKENS:-4608}"
only=(--only linear,lora,attention,blocks,vae,df11,tiers)
only_9b=(--only linear,attention,blocks)
only_step=(--only step --repeats 2)
step_size=1024
if [ "${FLUX_LITE_GPU_RUN_QUICK:-}" = 1 ]; then
    tokens=64
    only=(--only linear,attention --repeats 1)
    only_9b=("${only[@]}")
    only_step=(--only step --repeats 1)
    step_size=256
fi
: > "$report"

source ci/gpu-steps.sh

# 1. The Vulkan loader, where the machine has a driver but no loader.
source ci/gpu-loader.sh

say "flux-lite GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm)"
say "binary: $binary ($("$binary" --help >/dev/null 2>&1 && echo runs || echo does not run))"

# 2. The machine and the checks.
# The limits add up to 600 s, and 180 more where the flash selftest fails (4B bench 90,
# 9B 60, flash selftest and bench 45 each, tiled attention 30, peer 75). On an H200 (2026-11-26) the whole ran in
# under 6 minutes with the first kernels, whose whole 1024² step row alone
# took over a minute: the step has its own call, so a slow one cannot cut
# the linear and block rows short.
if command -v nvidia-smi >/dev/null; then
    step 15 "GPU" nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
fi
step 30 "adapter" "$binary" gpu
step 90 "selftest" "$binary" selftest

# 3. The benches, each against the ceilings measured in its own run.
bench_4b="$(mktemp)"
step 90 "bench, klein-4B shapes" "$binary" bench kernels --model klein-4b --tokens "$tokens" "${only[@]}"
awk '/^== bench, klein-4B/ { on = 1; next } /^== / { on = 0 } on' "$report" > "$bench_4b"
step 120 "bench, a klein-4B step" "$binary" bench kernels --model klein-4b --tokens "$tokens" --step-sizes "$step_size" "${only_step[@]}"
step 60 "bench, klein-9B shapes" "$binary" bench kernels --model klein-9b --tokens "$tokens" "${only_9b[@]}"
# The matrix tier's attention is flash where its start-up check passed
# (`gpu` and `selftest` say when it did not): the fallback kernel checked and
# timed in the same shapes, to measure flash against.
step 45 "selftest, fallback attention" env FLUX_LITE_ATTENTION_KERNEL=matrix "$binary" selftest
step 45 "bench, fallback attention" env FLUX_LITE_ATTENTION_KERNEL=matrix "$binary" bench kernels --model klein-4b --tokens "$tokens" --only attention,blocks
# The f32 tier's tiled attention on the same shapes.
step 30 "bench, tiled f32 attention" env FLUX_LITE_ATTENTION_KERNEL=tiled "$binary" bench kernels --model klein-4b --tokens "$tokens" --only attention

# 4. The PyTorch peer on the same GPU.
if command -v python3 >/dev/null; then
    step 75 "PyTorch peer (4B shapes)" python3 ci/gpu_peer.py --bench "$bench_4b" --config test_vectors/configs/klein-4b/transformer/config.json --size "$step_size"
else
    say "peer: skipped: no python3"
fi
rm -f "$bench_4b"

# 5. Where the flash attention failed its start-up check: which one change
# to the kernel makes it pass (ci/flash_variants.py), each variant built from
# FLUX_LITE_KERNEL_DIR. Skipped, with a line, where the run is already past 8
# minutes (a device call has 10).
flash_failed=false
if grep -q 'the flash attention failed its known-answer check' "$report"; then
    flash_failed=true
fi
if $flash_failed && [ "$SECONDS" -gt 480 ]; then
    say "flash variants: skipped, the run is ${SECONDS}s old; run them alone (ci/flash_variants.py, FLUX_LITE_KERNEL_DIR)"
elif $flash_failed; then
    variants="$(mktemp -d)"
    if "$binary" gpu --kernel-sources "$variants/sources" >/dev/null && command -v python3 >/dev/null \
        && python3 ci/flash_variants.py "$variants/sources" "$variants" > "$variants/names"; then
        while IFS=$'\t' read -r name rules_out; do
            say ""
            say "== flash variant $name ($rules_out)"
            FLUX_LITE_KERNEL_DIR="$variants/$name" timeout 30 "$binary" gpu 2>&1 \
                | grep -E 'built from|flash attention|error' | sort -u | tee -a "$report"
        done < "$variants/names"
    else
        say "flash variants: not made (no python3, or the kernel sources could not be written)"
    fi
    rm -rf "$variants"
fi

say ""
say "gpu-run: done, $failed step(s) failed; report in $report"
[ "$failed" -eq 0 ]
