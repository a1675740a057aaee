#!/usr/bin/env bash
# The test command (README.md): driver setup, the no_std check of core,
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

# The build outside the clone, kept between CI runs on this machine: one
# folder per Cargo.lock and compiler, so a second run rebuilds only the
# workspace's own crates and a fresh machine builds everything. A
# CARGO_TARGET_DIR already set is used as it is.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
    key="$({ cat Cargo.lock; rustc -vV; } | sha256sum | cut -c 1-16)"
    CARGO_TARGET_DIR="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/flux-lite-ci/$key"
fi
mkdir -p "$CARGO_TARGET_DIR"
CARGO_TARGET_DIR="$(cd "$CARGO_TARGET_DIR" && pwd -P)"
export CARGO_TARGET_DIR
echo "build folder: $CARGO_TARGET_DIR"

# Everything below runs from a copy of the sources kept in the build folder
# (ci/mirror-tree.sh: only the files that differ are written), so that a
# fresh clone rebuilds only the crates whose files changed, incrementally,
# instead of the whole workspace (about 2.5 minutes here). Outside a git
# work tree the build runs where it is.
if [ -z "${FLUX_LITE_CI_COPY:-}" ] && [ "$(git rev-parse --is-inside-work-tree 2>/dev/null)" = true ]; then
    # One run at a time per build folder (the lock is held across the exec):
    # a second run would rewrite the copy under the first one's tests.
    exec 9> "$CARGO_TARGET_DIR/run.lock"
    flock -n 9 || { echo "waiting for another run of the tests that uses $CARGO_TARGET_DIR"; flock 9; }
    bash ci/mirror-tree.sh . "$CARGO_TARGET_DIR/source"
    export FLUX_LITE_CI_COPY=1
    exec bash "$CARGO_TARGET_DIR/source/ci/test.sh"
fi

# Mesa's WSI layer complains on every device creation without a runtime dir.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
    export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/flux-lite-xdg-$(id -u)"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi

# lavapipe's and llvmpipe's compiled kernels, kept between runs beside the
# build folders (and across them: a new Cargo.lock starts a new build folder,
# not a new cache): a kernel compiled once is read back in every later test
# process and run. With this cache empty, the kernel tests took 657 s on
# Mesa 22 and the Mesa 26 kernel reruns 284 s; with it filled, 40 s and 44 s.
# Mesa keys each entry by its own build and the kernel's code, so Mesa 22,
# its GL driver and Mesa 26 (ci/lavapipe-sid.sh mounts the folder into its
# root) share it. A MESA_SHADER_CACHE_DIR already set is used as it is.
export MESA_SHADER_CACHE_DIR="${MESA_SHADER_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/flux-lite-ci/mesa-shader-cache}"
mkdir -p "$MESA_SHADER_CACHE_DIR"

# Mesa 26's root (debootstrap: mostly downloads and unpacking) is made in
# the background while the workspace compiles, and waited for before its phase.
sid_log="$(mktemp)"
bash ci/lavapipe-sid.sh setup > "$sid_log" 2>&1 &
sid_setup=$!
# Chromium and chromedriver for the page's browser tests, likewise; the
# tests then must run, not skip (FLUX_LITE_REQUIRE_BROWSER).
browser_log="$(mktemp)"
bash ci/setup-browser.sh > "$browser_log" 2>&1 &
browser_setup=$!

# A check finds what a build would (std used without the feature) without
# generating code no test runs.
phase "no_std checks of flux-lite-core (without and with alloc)"
cargo check --locked -p flux-lite-core --no-default-features
cargo check --locked -p flux-lite-core --no-default-features --features alloc

phase "clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings

phase "fuzz targets (their own workspace; compiled, not run: ci/fuzz.sh runs them)"
# A check links nothing, so libfuzzer-sys is pointed at a library path
# instead of compiling libFuzzer's C++ sources, which only a fuzzing build links.
CUSTOM_LIBFUZZER_PATH="$CARGO_TARGET_DIR/libfuzzer-not-linked.a" \
    cargo check --locked --manifest-path fuzz/Cargo.toml --bins --target-dir "$CARGO_TARGET_DIR"

phase "tests"
wait "$browser_setup" || { cat "$browser_log"; echo "setting up Chromium failed" >&2; exit 1; }
cat "$browser_log"
export FLUX_LITE_REQUIRE_BROWSER=1
log="$(mktemp)"
set +e
# Three tests at a time on the two cores: a test here waits on a child
# process, a shader compile's one thread or the disk often enough that two
# left a core idle (this run took 553 s of tests with three, 614 s with
# two). Not in the reruns on Mesa 26, whose matrix-tier tests keep both
# cores busy: three at a time made them 1.5–2.3 times slower. Every test
# binary runs even after one fails, so a failing run lists every failure.
RUST_TEST_THREADS=3 cargo test --locked --workspace --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# The test binaries of the run above, as cargo lists them (nothing is built
# again: a package built alone would unify other features and build its
# dependencies anew), so each rerun is the very binary of the Vulkan run.
artifacts="$(cargo test --locked --workspace --no-run --message-format=json 2>/dev/null | grep -F '"executable":"/' || true)"
# test_binary PACKAGE KIND TARGET: the binary's absolute path.
test_binary() {
    local path
    path="$(grep -F -e "#$1@" -e "\"$1 " <<<"$artifacts" | grep -F "\"kind\":[\"$2\"]" | grep -F "\"name\":\"$3\"" |
        sed 's/.*"executable":"\([^"]*\)".*/\1/' | head -n 1)"
    [ -n "$path" ] || { echo "error: no $2 test binary $3 in package $1" >&2; exit 1; }
    echo "$path"
}
kernels="$(test_binary flux-lite-kernels lib flux_lite_kernels)"

# The release binary for the closing check (no test hooks shipped), built
# on one core while the reruns below run their tests (the GL ones one at a
# time): cargo is done with the build folder until then, and the build
# hides behind them instead of adding a minute and more at the end.
release_log="$(mktemp)"
cargo build --locked --release -p flux-lite-cli -j 1 > "$release_log" 2>&1 &
release_build=$!
pngs="$(test_binary flux-lite-cli test gen_png)"
selftest="$(test_binary flux-lite-cli test selftest)"

# Runs a test binary again (`rerun [ENV=VALUE...] [--sid] BINARY [FILTER...]`,
# --sid inside Mesa 26's root), its output into the log under a line naming
# the binary, so the closing count knows which test each line is of. A
# filter that matches no test is a failure: the rerun would check nothing.
rerun() {
    local envs=() sid=()
    while [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
    if [ "$1" = --sid ]; then sid=(bash ci/lavapipe-sid.sh run); shift; fi
    local out rc began=$SECONDS
    out="$(mktemp)"
    echo "--- rerun: $* ${envs[*]}" | tee -a "$log"
    set +e
    env "${envs[@]}" "${sid[@]}" "$@" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    set -e
    # What each rerun costs, for keeping the whole run's time in hand.
    echo "--- rerun took $((SECONDS - began)) s" | tee -a "$out"
    cat "$out" >> "$log"
    if grep -q '^running 0 tests$' "$out"; then
        echo "error: \`$*\` ran no test: its filter matches none" | tee -a "$log" >&2
        rc=1
    fi
    rm -f "$out"
    if [ "$status" -eq 0 ]; then status=$rc; fi
}

# A second shader translation: wgpu's GL backend (GLSL) over Mesa's
# llvmpipe through EGL, headless. Every kernel test, the selftest, and the
# f32 golden PNGs of each distinct pipeline (text to image; a reference
# through the encoder under guidance; the 9B's structure with the
# references' KV cache; the tiled decoder; GL has no f16, so the tier ones
# are skipped):
# the other PNGs, and the command-line tests of gen_png that check files
# and settings, not pixels, ran on Vulkan above through the same kernels,
# whose GLSL the kernel tests check one by one.
phase "on wgpu's GL backend (GLSL, llvmpipe through EGL): every kernel test, the f32 golden PNGs of each pipeline, the selftest"
# One test at a time: wgpu's GL backend lets one thread hold the EGL
# context, and a test waiting over 6 s for it (a cold shader compile of a
# large kernel on a loaded machine) panics with "Could not lock adapter
# context".
rerun FLUX_LITE_BACKEND=gl "$kernels" --test-threads=1
rerun FLUX_LITE_BACKEND=gl "$pngs" --exact one_step_distilled a_reference_image_under_guidance \
    the_kv_pipeline_caches_the_references_after_the_first_step vae_tiles_much_smaller_than_the_image_keep_the_image --test-threads=1
rerun FLUX_LITE_BACKEND=gl "$selftest" --test-threads=1

# The matrix tier needs cooperative matrices, which only Mesa 26's lavapipe
# (Debian sid) offers: the kernel tests that need it, built above, run again in a sid root
# (ci/lavapipe-sid.sh, kept under /opt), where a missing tier fails them;
# with them the matrix tier's golden PNGs (the f16 tier's ran on Mesa 22
# above; a GGUF model's on both, and its transformer in blocks against its
# weights expanded at load), the stage tests and the tiny preview decoders
# on both half tiers, auto's
# choice and fallback, bench kernels' matrix rows and tier table, and
# flux-lite selftest on all three tiers.
phase "on Mesa 26's lavapipe: the kernel tests Mesa 22 skipped, the matrix tier's golden PNGs, the stages, auto and bench kernels on the f16 and matrix tiers"
set +e
wait "$sid_setup"
sid_status=$?
set -e
cat "$sid_log"
rm -f "$sid_log"
if [ "$sid_status" -ne 0 ]; then
    echo "error: making Mesa 26's root failed (ci/lavapipe-sid.sh setup, status $sid_status)" >&2
    exit 1
fi
bench="$(test_binary flux-lite-cli test bench)"
cli="$(test_binary flux-lite-cli test cli)"
stages="$(test_binary flux-lite-tests test half_tiers)"
previews="$(test_binary flux-lite-tests test previews)"
quantized="$(test_binary flux-lite-cli test gguf)"
quantized_stages="$(test_binary flux-lite-tests test gguf)"
# The kernel tests the run above skipped (a `skipped:` line: the matrix
# tier, spirv-val's cooperative matrices), by name: the others ran on
# Mesa 22 and on GL already.
mapfile -t matrix_kernel_tests < <(awk -v bin="$(basename "$kernels")" '
    /^ *Running / { on = index($0, bin) > 0; next }
    /^--- rerun: / { on = 0; next }
    on && match($0, /skipped: [^ ]+: /) { print substr($0, RSTART + 9, RLENGTH - 11) }' "$log" | sort -u)
if [ "${#matrix_kernel_tests[@]}" -eq 0 ]; then
    echo "error: no kernel test skipped on Mesa 22, so none is known to need Mesa 26" | tee -a "$log" >&2
    status=1
else
    rerun FLUX_LITE_REQUIRE_MATRIX=1 --sid "$kernels" --exact "${matrix_kernel_tests[@]}"
fi
rerun FLUX_LITE_REQUIRE_MATRIX=1 --sid "$pngs" matrix_tier_reproduces
rerun FLUX_LITE_REQUIRE_MATRIX=1 --sid "$bench" matrix tiers
rerun FLUX_LITE_REQUIRE_MATRIX=1 --sid "$cli" tier the_gpu_variant_scripts the_flash_report
rerun FLUX_LITE_REQUIRE_MATRIX=1 --sid "$stages"
rerun FLUX_LITE_REQUIRE_MATRIX=1 --sid "$previews" half
rerun FLUX_LITE_REQUIRE_MATRIX=1 --sid "$quantized" half_tiers
rerun FLUX_LITE_REQUIRE_MATRIX=1 --sid "$quantized_stages" matrix_tier
rerun FLUX_LITE_REQUIRE_MATRIX=1 --sid "$selftest"
# The matrix kernels on 16×16 tiles in subgroups of 32, planned for 48 KiB
# of workgroup memory, as NVIDIA's cards run them and no software driver
# offers them: their cooperative matrices emulated in plain WGSL
# (kernels-wgsl/src/emulated_matrix/; Mesa 26, since Mesa 22.3's lavapipe
# gives wrong products with it). The checks that hold the fused
# half-precision path, attention and the convolutions to the oracle, and
# the GEMM's stagings, the wide head's splits, the convolution's pieces
# and four-tap fetching, its narrow and thin blocks, the linear and the flash attention over f16 pieces to each other's bits, the flash attention's start-up check and its variations, the chunked attention (the VAE's) against the oracle and by bands, the transformer's attention on products against the oracle; docs/testing.md says what else was run so and what
# it found.
emulated_tests=(
    selftest::half_path::tests::the_half_paths_checks_pass_on_matrix_units_at_the_adapters_block
    selftest::channels_last::tests::the_channels_last_checks_pass_on_matrix_units_at_the_adapters_block
    kernels::linear::tests::linear_on_matrix_units_matches_the_oracle
    kernels::epilogue_tests::the_swiglu_epilogue_equals_the_product_then_the_swiglu_on_matrix_units
    kernels::epilogue_tests::the_gated_epilogue_equals_the_product_then_the_gated_residual_on_matrix_units
    kernels::attention::tests::attention_on_matrix_units_matches_the_oracle
    kernels::attention::tests::the_matrix_tiers_fallback_attention_matches_the_oracle
    kernels::conv_nhwc::tests::the_channels_last_conv_on_matrix_units_matches_the_oracle
    kernels::conv_nhwc::tests::the_channels_last_conv_in_pieces_of_pixels_matches_the_oracle
    kernels::conv_nhwc::tests::the_channels_last_conv_fetching_four_taps_at_a_time_gives_the_element_fetchs_bits
    kernels::conv_nhwc::tests::blocks::the_channels_last_convs_narrow_blocks_give_the_square_ones_bits
    kernels::conv_nhwc::tests::blocks::the_channels_last_convs_thin_blocks_give_the_square_ones_bits
    kernels::half_path_tests::linear_on_matrix_units_over_half_pieces_equals_it_over_their_f32_values
    kernels::linear::tests::every_staging_of_the_matrix_linear_gives_the_same_bits
    kernels::attention::tests::the_wide_matrix_attention_gives_the_same_bits_whole_and_split_over_its_dims
    device::proof::tests::the_flash_attention_is_taken_where_its_check_passes_and_left_with_a_notice_where_it_fails
    kernels::half_path_tests::the_flash_kernel_over_half_pieces_copies_them_as_stored_with_the_bits_of_it_over_their_values
    probe_flash::cases::tests::every_variation_passes_on_the_test_device_and_repeats
    kernels::attention_chunks::tests::chunked_attention_matches_the_oracle
    kernels::attention_chunks::tests::chunked_attention_by_query_bands_and_key_calls_equals_one_call_bit_for_bit
    selftest::half_path::tests::attention_on_products_over_pieces_matches_the_oracle
    kernels::linear::softmax::tests::the_scores_product_writes_the_hosts_probabilities_exponents_and_sums
)
rerun FLUX_LITE_REQUIRE_MATRIX=1 FLUX_LITE_EMULATE_MATRIX=nvidia --sid "$kernels" --exact "${emulated_tests[@]}"
# A whole component so: the tiny preview decoders' channels-last decode
# (pieces, ReLU epilogues, a global norm read, packed f32 W, bands).
rerun FLUX_LITE_REQUIRE_MATRIX=1 FLUX_LITE_EMULATE_MATRIX=nvidia --sid "$previews" half_tiers
# Every matrix kernel test on an Apple GPU's tiles, 8×8 f32 in simdgroups
# of 32, emulated the same way: what runs on f32 tiles against the oracle,
# the f16-only checks saying they are skipped.
if [ "${#matrix_kernel_tests[@]}" -gt 0 ]; then
    rerun FLUX_LITE_REQUIRE_MATRIX=1 FLUX_LITE_EMULATE_MATRIX=apple --sid "$kernels" --exact "${matrix_kernel_tests[@]}"
fi

# The tests' switches and fault injections exist only where the tests
# enable the `test-support` feature: the binary the tests ran has them, a
# release build none of their names.
phase "a release build carries no test hook"
hook_names='FLUX_LITE_(LOSE_DEVICE_AFTER|BREAK_KERNEL|FAIL_TIER_PROBE|DEVICE_MEMORY|PAUSE_MID_WRITE|PER_LANE_READS|EMULATE_MATRIX)'
release_status=0
wait "$release_build" || release_status=$?
cat "$release_log"
rm -f "$release_log"
if [ "$release_status" -ne 0 ]; then
    echo "error: the release build failed" >&2
    exit 1
fi
shipped="$(grep -a -o -E "$hook_names" "$CARGO_TARGET_DIR/release/flux-lite" | sort -u | tr '\n' ' ' || true)"
tested="$(grep -a -o -E "$hook_names" "$CARGO_TARGET_DIR/debug/flux-lite" | sort -u | wc -l || true)"
if [ -n "$shipped" ]; then
    echo "error: the release binary carries test hooks: $shipped" >&2
    status=1
elif [ "$tested" -eq 0 ]; then
    echo "error: the tests' binary carries no test hook either: the check sees nothing" >&2
    status=1
else
    echo "release binary: none of the $tested test hooks the tests' binary has"
fi

# One closing line for the whole suite, counting distinct tests: a test is
# named by its binary (cargo's `Running … (PATH)` or a rerun's line) and its
# name, so a test run again on GL or Mesa 26 counts once. It passed if one of
# its runs passed without a `skipped: TEST: why` line (the workspace's one
# skip helper, flux_lite_kernels::skip); skipped if every run skipped it or
# cargo ignored it; failed if any run failed.
read -r passed failed skipped < <(awk '
    function binary(path,    parts, n) { n = split(path, parts, "/"); return parts[n] }
    function result(line, outcome,    name) {
        name = substr(line, 6, length(line) - 5 - length(" ... " outcome))
        k = section SUBSEP name
        if (outcome == "ok") { if ((run SUBSEP k) in skip) skipped[k] = 1; else passed[k] = 1 }
        else if (outcome == "FAILED") failed[k] = 1
        else ignored[k] = 1
    }
    /^ *Running .*\(.*\)$/ { p = $0; sub(/.*\(/, "", p); sub(/\)$/, "", p); section = binary(p); run++; next }
    /^ *Doc-tests / { section = "doc-tests " $2; run++; next }
    /^--- rerun: / { section = binary($3); run++; next }
    {
        line = $0
        # A skip line: alone, or after "test NAME ... " (a single-threaded run).
        if (match(line, /skipped: [^ ]+: /)) {
            skip[run SUBSEP section SUBSEP substr(line, RSTART + 9, RLENGTH - 11)] = 1
            pending = (RSTART > 1) ? substr(line, 1, RSTART - 1) : ""
            next
        }
        if (pending != "") { line = pending line; pending = "" }
        if (line ~ /^test .* \.\.\. ok$/) result(line, "ok")
        else if (line ~ /^test .* \.\.\. FAILED$/) result(line, "FAILED")
        else if (line ~ /^test .* \.\.\. ignored(, .*)?$/) { sub(/, .*$/, "", line); result(line, "ignored") }
    }
    END {
        for (k in passed) if (!(k in failed)) np++
        for (k in failed) nf++
        for (k in skipped) if (!(k in passed) && !(k in failed)) { ns++; gone[k] = 1 }
        for (k in ignored) if (!(k in passed) && !(k in failed) && !(k in gone)) ns++
        print np + 0, nf + 0, ns + 0
    }' "$log")
rm -f "$log"
echo "tests: $passed passed, $failed failed, $skipped skipped, in $((SECONDS - started)) s"
# The suite cannot shrink silently: raise ci/test-floor whenever tests are added.
floor="$(tr -dc '0-9' < ci/test-floor)"
if [ "$status" -eq 0 ] && [ "$passed" -lt "$floor" ]; then
    echo "error: $passed distinct tests passed, fewer than the floor of $floor in ci/test-floor" >&2
    exit 1
fi
exit "$status"
