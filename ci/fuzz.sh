#!/usr/bin/env bash
# Fuzzes the readers of untrusted input under libFuzzer, each target for a
# fixed time, and prints each run's final figures (runs, time, coverage).
#   bash ci/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 600, all targets)
# Targets (tests/src/fuzz.rs): model_configs, weights, df11, tokenizer.
# Needs the nightly toolchain (libFuzzer's instrumentation); installs
# cargo-fuzz from crates.io if it is missing. Not part of every CI run.
# A crash stops the script with libFuzzer's report; the input is kept in
# fuzz/artifacts/<target>/: minimise it (cargo +nightly fuzz tmin), fix the
# bug, and add the minimised input to fuzz/regressions/<target>/, which
# tests/tests/fuzz_corpus.rs replays on every test run.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-600}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(model_configs weights df11 tokenizer)
fi

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "error: ci/fuzz.sh needs the nightly toolchain (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi

# The starting corpus: every valid file each target can replace, from test_vectors/.
cargo run --quiet --locked -p flux-lite-tests --example fuzz_seeds -- fuzz/corpus

# Release with debug assertions (integer overflow is a finding); the code is
# safe Rust, so no sanitizer beyond libFuzzer's own checks (allocations over
# -malloc_limit_mb, timeouts, panics).
flags=(--release --debug-assertions --sanitizer none)
cd fuzz
cargo +nightly fuzz build "${flags[@]}"
for target in "${targets[@]}"; do
    echo "== fuzz $target for ${seconds}s"
    mkdir -p "regressions/$target"
    dict=()
    case "$target" in model_configs | tokenizer) dict=(-dict=json.dict) ;; esac
    set +e
    cargo +nightly fuzz run "${flags[@]}" "$target" "corpus/$target" "regressions/$target" -- \
        -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -malloc_limit_mb=2048 \
        -print_final_stats=1 -print_pcs=0 "${dict[@]}" 2>&1 |
        grep -E '^(Done|stat::|==|INFO: Seed|#[0-9]+.*(DONE|INITED))|panicked|ERROR|SUMMARY'
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" -ne 0 ]; then
        echo "error: fuzz target $target failed (status $status); see fuzz/artifacts/$target/" >&2
        exit "$status"
    fi
done
