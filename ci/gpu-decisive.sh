#!/usr/bin/env bash
# The one prepared run that settles the half-precision data path on a GPU
# machine (an NVIDIA H100 or H200): at most 9 minutes, each stage under its
# own limit, everything appended to the report as it goes, so a run cut
# short still leaves what it had.
#
#   bash ci/gpu-decisive.sh [BINARY] [REPORT]
#
# BINARY: flux-lite built with `cargo build --release -p flux-lite-cli`
# (default target/release/flux-lite). REPORT: default gpu-decisive.txt, or
# $OUT/gpu-decisive.txt when OUT is set. In order:
#   0. `bench traffic` at the same size (computed, no GPU): the dispatches,
#      bytes and roofline on an H200 of the measured rows below;
#   1. the adapter: its tiers, and whether the flash attention passed its
#      start-up check (`flux-lite gpu`). Each matrix pipeline's registers,
#      spills and workgroup memory (what the driver reports through
#      VK_KHR_pipeline_executable_properties) follow the rows of stages 3, 4
#      and 5 (`bench kernels --pipeline-statistics`): the pipelines each
#      built, so that a stage cut short still leaves those of the earlier ones;
#   2. `flux-lite selftest` on every tier;
#   3. the linears on every tier side by side, the matrix tier's at the
#      4B's shapes beside the ceiling our own WGSL reaches, each shape over
#      f32 x and bf16 W converted in every tile (the old path) and over the
#      f16 operands kept in memory (the new); then the matrix
#      tier's again with its GEMM staged deep (two buffers of 2T terms, one
#      workgroup a 48 KiB compute unit's memory) against the adapter's choice
#      (the deepest of which two workgroups fit: lean on a 48 KiB adapter);
#   4. attention at 4608 tokens: flash, then the fallback kernel, each over
#      f32 queries, keys and values and over f16 pieces in memory, and as
#      products on the GEMM core over f16 pieces (what runs the blocks'
#      attention where the flash kernel's check fails); then the
#      double and the single block at 4608 tokens whole and op by op (each
#      op timed alone as the step records it: the products over f16 operands
#      in memory with their epilogues, the flash attention over f16 pieces),
#      so that what bounds a block has its own row;
#   5. the 4B 1024² step (and, where flash runs the blocks' attention,
#      again with it as products on the GEMM core), then the 1024² VAE decode (with the tiny preview
#      decoder's share) and encode, and the decode op by op (each op timed
#      alone, summed by kind), then PyTorch / diffusers bf16 on the same card:
#      every product shape the report's rows timed (bf16 and f32), the same
#      step, the VAE decode and encode (ci/gpu_peer.py; skipped with a line
#      without PyTorch, diffusers or CUDA).
# FLUX_LITE_GPU_RUN_QUICK=1 runs a small version (64 tokens, a 256² step and
# VAE) to try the script on a software driver.
set -uo pipefail
cd "$(dirname "$0")/.."

binary="${1:-target/release/flux-lite}"
report="${2:-${OUT:+$OUT/}gpu-decisive.txt}"
tokens=4608
size=1024
repeats=()
if [ "${FLUX_LITE_GPU_RUN_QUICK:-}" = 1 ]; then
    tokens=64
    size=256
    repeats=(--repeats 1)
fi
: > "$report"
source ci/gpu-steps.sh
source ci/gpu-loader.sh
say "flux-lite decisive GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm)"
if command -v nvidia-smi >/dev/null; then
    step 10 "GPU" nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
fi

# The limits add up to 540 s (575 s where the blocks' attention runs on the
# one-subgroup fallback: the step and the VAE get longer, the fallback's
# stage goes): under 10 minutes with room for the loader.
step 5 "0. the roofline: what the matrix tier's encode, step, decode and whole run move (no GPU)" "$binary" bench traffic --model klein-4b --width "$size" --height "$size" --precision matrix
step 40 "1. adapter and tiers" "$binary" gpu
# Where the flash attention's check over f16 pieces (the blocks' path)
# failed, the step's attention runs as products on the GEMM core (the tier's
# line says so), or where those cannot run on the one-subgroup fallback
# (589 ms a block on the H200): the step and the VAE then run once each
# under longer limits (they stopped at 50 s with two runs), and the
# fallback's own attention stage, the same kernel there, is left out.
step_runs=("${repeats[@]}")
step_limit=50
vae_limit=50
fallback_only=0
pieces_flash=0
matrix_line=$(grep -m1 "^matrix tier: matrix (" "$report" || true)
if echo "$matrix_line" | grep -qE "; flash attention(\)| over f16 pieces)"; then
    pieces_flash=1
fi
if [ -n "$matrix_line" ] && [ "$pieces_flash" = 0 ] && ! echo "$matrix_line" | grep -q "attention as products on the GEMM core"; then
    fallback_only=1
    step_runs=(--repeats 1)
    step_limit=120
    vae_limit=80
    say "(no flash attention over f16 pieces: the step and the VAE run once, under ${step_limit} s and ${vae_limit} s)"
fi
step 60 "2. selftest, every tier" "$binary" selftest
step 60 "3. linears on every tier (4B shapes)" "$binary" bench kernels --model klein-4b --tokens "$tokens" --only linear,tiers --pipeline-statistics "${repeats[@]}"
step 40 "3. linears, the GEMM staged deep" env FLUX_LITE_GEMM_STAGING=deep "$binary" bench kernels --model klein-4b --tokens "$tokens" --only linear --precision matrix "${repeats[@]}"
step 45 "4. attention at $tokens tokens, flash" "$binary" bench kernels --model klein-4b --tokens "$tokens" --only attention --pipeline-statistics "${repeats[@]}"
if [ "$fallback_only" = 0 ]; then
    step 35 "4. attention at $tokens tokens, the fallback" env FLUX_LITE_ATTENTION_KERNEL=matrix "$binary" bench kernels --model klein-4b --tokens "$tokens" --only attention "${repeats[@]}"
fi
step 30 "4. the double and single block at $tokens tokens, whole and op by op" "$binary" bench kernels --model klein-4b --tokens "$tokens" --only blocks,ops "${repeats[@]}"
# The step first, in a stage of its own: its row prints before the decode
# that the end-to-end row needs, so a slow VAE cannot cut it off.
step "$step_limit" "5. the 4B ${size}² step (the text encoder before it, the decode and the end-to-end sum after)" "$binary" bench kernels --model klein-4b --only step --step-sizes "$size" --pipeline-statistics "${step_runs[@]}"
# Where the flash kernel runs the blocks' attention, the step again with
# it as products on the GEMM core (what runs it where the check fails).
if [ "$pieces_flash" = 1 ]; then
    step 30 "5. the 4B ${size}² step, its attention as products on the GEMM core" env FLUX_LITE_ATTENTION_KERNEL=products "$binary" bench kernels --model klein-4b --only step --step-sizes "$size" "${repeats[@]}"
fi
step "$vae_limit" "5. the ${size}² VAE decode (the tiny preview decoder's share) and encode, then the decode op by op" "$binary" bench kernels --model klein-4b --only vae,vae-ops --vae-size "$size" "${step_runs[@]}"
if command -v python3 >/dev/null; then
    step 85 "5. PyTorch / diffusers bf16, same card" python3 ci/gpu_peer.py --bench "$report" \
        --config test_vectors/configs/klein-4b/transformer/config.json \
        --vae-config test_vectors/configs/klein-4b/vae/config.json --size "$size" --repeats 5
else
    say "peer: skipped: no python3"
fi

say ""
say "gpu-decisive: done in ${SECONDS}s, $failed stage(s) failed; report in $report"
[ "$failed" -eq 0 ]
