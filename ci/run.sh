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
exec cargo run --quiet --release --manifest-path "$root/Cargo.toml" -p flux-lite-cli -- "$@"
