#!/usr/bin/env bash
# flux-lite's kernels on a software adapter (lavapipe) beside PyTorch on the
# same CPU, in one run: `flux-lite bench kernels` at klein-4B's linear and
# attention shapes on the f32 tier, then ci/cpu_peer.py times the same rows
# with PyTorch (f32, one thread per core) and prints them side by side.
#
#   bash ci/cpu-bench.sh [BINARY]
#
# BINARY: flux-lite built with `cargo build --release -p flux-lite-cli`
# (default target/release/flux-lite). FLUX_LITE_CPU_BENCH_TOKENS sets the
# token rows (default 1024), FLUX_LITE_CPU_BENCH_REPEATS the timed runs per
# row after a warm-up, for both sides (default 3); FLUX_LITE_CPU_BENCH_SID=1
# runs the bench on Mesa 26's lavapipe (ci/lavapipe-sid.sh, its root made
# first) instead of the system's. The bench's output and
# the peer's table go to standard output; the peer prints one `skipped:`
# line where PyTorch is not installed (pip install torch).
set -euo pipefail
cd "$(dirname "$0")/.."

binary="${1:-target/release/flux-lite}"
tokens="${FLUX_LITE_CPU_BENCH_TOKENS:-1024}"
repeats="${FLUX_LITE_CPU_BENCH_REPEATS:-3}"
if [ ! -x "$binary" ]; then
    echo "error: no flux-lite binary at $binary (build it with cargo build --release -p flux-lite-cli)" >&2
    exit 1
fi
# Mesa's WSI layer prints an error line on every device creation without a runtime dir.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
    export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/flux-lite-xdg-$(id -u)"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi

inside=()
if [ "${FLUX_LITE_CPU_BENCH_SID:-}" = 1 ]; then
    inside=(bash ci/lavapipe-sid.sh run)
fi

bench="$(mktemp)"
trap 'rm -f "$bench"' EXIT
echo "== ${inside[*]} $binary bench kernels --model klein-4b --tokens $tokens --only linear,attention --precision f32 --repeats $repeats"
"${inside[@]}" "$binary" bench kernels --model klein-4b --tokens "$tokens" --only linear,attention --precision f32 --repeats "$repeats" | tee "$bench"
echo
echo "== python3 ci/cpu_peer.py --repeats $repeats"
python3 ci/cpu_peer.py --bench "$bench" --repeats "$repeats"
