#!/usr/bin/env bash
# The test command (README.md): driver setup, the no_std build of core,
# clippy with warnings denied, the fuzz targets compiled, then every test of
# the workspace on Vulkan, the kernels, golden PNGs and selftest again on
# wgpu's GL backend, the tier tests on Mesa 26, failing if fewer tests ran
# than ci/test-floor says.
set -euo pipefail
cd "$(dirname "$0")/.."

bash ci/setup-vulkan.sh

# Each phase's line carries the seconds since the start, so a slow phase shows.
started=$SECONDS
phase() { echo "== $1 (at $((SECONDS - started)) s)"; }

# Mesa's WSI layer complains on every device creation without a runtime dir.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
    export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/flux-lite-xdg-$(id -u)"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi

phase "no_std builds of flux-lite-core (without and with alloc)"
cargo build --locked -p flux-lite-core --no-default-features
cargo build --locked -p flux-lite-core --no-default-features --features alloc

phase "clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings

phase "fuzz targets (their own workspace; compiled, not run: ci/fuzz.sh runs them)"
cargo check --locked --manifest-path fuzz/Cargo.toml --bins --target-dir target

phase "tests"
log="$(mktemp)"
set +e
cargo test --locked --workspace 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

test_binary() {
    cargo test --locked "$@" --no-run 2>&1 | grep -o 'target/debug/deps/[a-z_]*-[0-9a-f]*' | head -n 1
}
kernels="$(test_binary -p flux-lite-kernels --lib)"
pngs="$(test_binary -p flux-lite-cli --test gen_png)"
selftest="$(test_binary -p flux-lite-cli --test selftest)"

# A second shader translation: wgpu's GL backend (GLSL) over Mesa's
# llvmpipe through EGL, headless. Every kernel test, the f32 golden PNGs
# (GL has no f16, so the tier ones are skipped) and the selftest.
phase "on wgpu's GL backend (GLSL, llvmpipe through EGL): every kernel test, the f32 golden PNGs, the selftest"
for run in "$kernels" "$pngs --skip tier" "$selftest"; do
    set +e
    # shellcheck disable=SC2086 # the binary and its arguments
    FLUX_LITE_BACKEND=gl $run 2>&1 | tee -a "$log"
    gl_status=${PIPESTATUS[0]}
    set -e
    if [ "$status" -eq 0 ]; then status=$gl_status; fi
done

# The matrix tier needs cooperative matrices, which only Mesa 26's lavapipe
# (Debian sid) offers: the kernel tests, built above, run again in a sid root
# (ci/lavapipe-sid.sh, kept under /opt), where a missing tier fails them;
# with them the golden PNGs and the stage tests on both half tiers, auto's
# choice and fallback, bench kernels' matrix rows and tier table, and
# flux-lite selftest on all three tiers.
phase "on Mesa 26's lavapipe: every kernel test, the golden PNGs, auto and bench kernels on the f16 and matrix tiers"
bash ci/lavapipe-sid.sh setup
bench="$(test_binary -p flux-lite-cli --test bench)"
cli="$(test_binary -p flux-lite-cli --test cli)"
stages="$(test_binary -p flux-lite-tests --test half_tiers)"
for run in "$kernels" "$pngs tier_reproduces" "$bench matrix tiers" "$cli tier" "$stages" "$selftest"; do
    set +e
    # shellcheck disable=SC2086 # the binary and its filter
    FLUX_LITE_REQUIRE_MATRIX=1 bash ci/lavapipe-sid.sh run $run 2>&1 | tee -a "$log"
    sid_status=${PIPESTATUS[0]}
    set -e
    if [ "$status" -eq 0 ]; then status=$sid_status; fi
done
# One closing line for the whole workspace (cargo prints one per test binary).
passed="$(awk '/^test result:/ { passed += $4 } END { print passed + 0 }' "$log")"
failed="$(awk '/^test result:/ { failed += $6 } END { print failed + 0 }' "$log")"
rm -f "$log"
echo "tests: $passed passed, $failed failed, in $((SECONDS - started)) s"
# The suite cannot shrink silently: raise ci/test-floor whenever tests are added.
floor="$(tr -dc '0-9' < ci/test-floor)"
if [ "$status" -eq 0 ] && [ "$passed" -lt "$floor" ]; then
    echo "error: $passed tests passed, fewer than the floor of $floor in ci/test-floor" >&2
    exit 1
fi
exit "$status"
