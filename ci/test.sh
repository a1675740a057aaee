#!/usr/bin/env bash
# The test command (README.md): driver setup, the no_std build of core,
# clippy with warnings denied, then every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

bash ci/setup-vulkan.sh

# Mesa's WSI layer complains on every device creation without a runtime dir.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
    export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/flux-lite-xdg-$(id -u)"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi

echo "== no_std builds of flux-lite-core (without and with alloc)"
cargo build --locked -p flux-lite-core --no-default-features
cargo build --locked -p flux-lite-core --no-default-features --features alloc

echo "== clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings

echo "== tests"
log="$(mktemp)"
set +e
cargo test --locked --workspace 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line for the whole workspace (cargo prints one per test binary).
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "tests: %d passed, %d failed\n", passed, failed }' "$log"
rm -f "$log"
exit "$status"
