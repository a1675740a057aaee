#!/usr/bin/env bash
# The flash attention's fault, localised in one short call on a GPU machine
# whose matrix tier fails the flash start-up check (an NVIDIA H200 did: a
# few outputs -inf). About a minute; each stage under its own limit, the
# report appended as it goes:
#   1. `flux-lite gpu --flash-report`: the kernel as built on the check and
#      its variations (ci's probe_flash cases: the values' range, the mask,
#      the heads, head widths, whole tiles, one and many key tiles, f16
#      pieces), each run twice (does it repeat bit for bit?), then
#      ci/flash_analyse.py on its outputs (what is not finite, by row, dim,
#      tile position, sign; what else is far off);
#   2. each of ci/flash_variants.py's variants the same way: a fix that
#      passes says what the fault needed; a probe writes an intermediate
#      (the output before its row's sum, the sums, the maxima), analysed as
#      such.
# Every case's outputs come back in one archive for analysis here (a call
# returns at most 8 files): gpu-flash-outputs.tar.xz beside the report,
# flash/<variant>/<case>.got.f32, the exact answers once, in flash/built/
# (`python3 ci/flash_analyse.py flash/<variant> --answers flash/built`).
#
#   bash ci/gpu-flash.sh [BINARY] [REPORT]
#
# BINARY as for ci/gpu-decisive.sh; REPORT: default gpu-flash.txt, or
# $OUT/gpu-flash.txt when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."

binary="${1:-target/release/flux-lite}"
report="${2:-${OUT:+$OUT/}gpu-flash.txt}"
archive="$(dirname "$report")/gpu-flash-outputs.tar.xz"
: > "$report"
source ci/gpu-steps.sh
source ci/gpu-loader.sh
say "flux-lite flash attention report, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm)"
step 40 "adapter and tiers" "$binary" gpu

variants="$(mktemp -d)"
trap 'rm -rf "$variants"' EXIT
outputs="$variants/flash"
"$binary" gpu --kernel-sources "$variants/sources" >/dev/null || say "error: the kernel sources could not be written"
python3 ci/flash_variants.py "$variants/sources" "$variants" > "$variants/names" || say "error: ci/flash_variants.py made no variants"

mkdir -p "$outputs"
step 30 "the kernel as built" "$binary" gpu --flash-report "$outputs/built"
step 10 "the kernel as built, analysed" python3 ci/flash_analyse.py "$outputs/built"
while IFS=$'\t' read -r name kind tells; do
    probe=()
    if [ "$kind" = probe ]; then probe=(--probe "$name"); fi
    step 30 "variant $name ($kind: $tells)" env FLUX_LITE_KERNEL_DIR="$variants/$name" "$binary" gpu --flash-report "$outputs/$name"
    step 10 "variant $name, analysed" python3 ci/flash_analyse.py "$outputs/$name" --answers "$outputs/built" "${probe[@]}"
    rm -f "$outputs/$name"/*.want.f64
done < "$variants/names"
# (Python's tarfile: the machine may have no xz.)
python3 -c "import sys, tarfile; t = tarfile.open(sys.argv[1], 'w:xz'); t.add(sys.argv[2], arcname='flash'); t.close()" \
    "$archive" "$outputs" || say "error: the outputs could not be archived"

say ""
say "gpu-flash: done in ${SECONDS}s, $failed stage(s) failed; report in $report, outputs in $archive"
[ "$failed" -eq 0 ]
