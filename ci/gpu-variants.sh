#!/usr/bin/env bash
# A second, short call on a GPU machine after ci/gpu-run.sh: where the matrix
# linear's k step spends its time. Each of ci/linear_variants.py's variants
# takes one part of the step away (the multiply-adds, the rounding and
# staging, the global loads, the range scales' arithmetic) and is timed with
# `bench kernels --only linear` on the matrix tier, the kernel as built first,
# all in one run, so the differences are that part's cost on this card.
#
#   bash ci/gpu-variants.sh [BINARY] [REPORT]
#
# BINARY and REPORT as for ci/gpu-run.sh (default REPORT:
# gpu-variants.txt, or $OUT/gpu-variants.txt when OUT is set).
# FLUX_LITE_GPU_RUN_TOKENS sets the token rows (default 4608). About 20 s a
# variant on an H200 (pipelines built, the ceilings measured, five shapes);
# each is stopped at 60 s. The variants' results are wrong by design: only
# their times mean anything.
set -uo pipefail
cd "$(dirname "$0")/.."

binary="${1:-target/release/flux-lite}"
report="${2:-${OUT:+$OUT/}gpu-variants.txt}"
tokens="${FLUX_LITE_GPU_RUN_TOKENS:-4608}"
: > "$report"
say() { echo "$*" | tee -a "$report"; }

if [ ! -x "$binary" ]; then
    echo "error: no flux-lite binary at $binary (build it with cargo build --release -p flux-lite-cli and carry it)" >&2
    exit 1
fi
source ci/gpu-loader.sh

variants="$(mktemp -d)"
trap 'rm -rf "$variants"' EXIT
if ! "$binary" gpu --kernel-sources "$variants/sources" >/dev/null; then
    say "error: the kernel sources could not be written"
    exit 1
fi
if ! python3 ci/linear_variants.py "$variants/sources" "$variants" > "$variants/names"; then
    say "error: ci/linear_variants.py made no variants"
    exit 1
fi
say "flux-lite matrix linear variants, $(date -u +%Y-%m-%dT%H:%M:%SZ), $tokens token rows"
while IFS=$'\t' read -r name leaves_out; do
    say ""
    say "== variant $name (leaves out: $leaves_out)"
    FLUX_LITE_KERNEL_DIR="$variants/$name" timeout 60 "$binary" bench kernels --model klein-4b --tokens "$tokens" \
        --only linear --precision matrix --repeats 3 2>&1 | grep -E '^\| linear|^ceilings|error|stopped' | tee -a "$report"
done < "$variants/names"
