#!/usr/bin/env bash
# The run command (README.md), one command on a fresh machine:
#
#   bash ci/run.sh gen --model DIR --prompt TEXT --output OUT.png
#
# On Linux without a Vulkan driver it first installs Mesa's software one
# (ci/setup-vulkan.sh; root or sudo needed for that step only), then builds
# the release binary and runs it with the arguments given, from the
# caller's folder (so relative paths mean what they say).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$(uname -s)" = Linux ]; then
    bash "$root/ci/setup-vulkan.sh" vulkan-only >&2 ||
        echo "warning: could not install a Vulkan driver; flux-lite will say if it finds no GPU adapter" >&2
fi
# Mesa's WSI layer prints an error line on every device creation without a
# runtime dir (a root shell or a container has none): give it a private one.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
    export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/flux-lite-xdg-$(id -u)"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi
exec cargo run --quiet --release --manifest-path "$root/Cargo.toml" -p flux-lite-cli -- "$@"
