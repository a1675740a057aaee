#!/usr/bin/env bash
# Mesa 26's lavapipe (Debian sid) offers VK_KHR_cooperative_matrix, which
# bookworm's Mesa does not; sid's Mesa needs sid's C library, so it runs in
# a sid root made with debootstrap, with the work tree bind-mounted at the
# same path. Test binaries are built on the host and run inside.
#
#   bash ci/lavapipe-sid.sh setup          make the root if it is missing (a few minutes, ~600 MiB)
#   bash ci/lavapipe-sid.sh run CMD ARG..  run CMD in the root, in the current folder
#   bash ci/lavapipe-sid.sh info           the Vulkan driver the root offers
#
# The root lives in FLUX_LITE_SID_ROOT (default /opt/flux-lite-sid) and is
# kept between runs; a root whose Mesa lacks cooperative matrices is an error.
set -euo pipefail

root="${FLUX_LITE_SID_ROOT:-/opt/flux-lite-sid}"
# The packages the root holds (python3 for the tests that run ci/*.py);
# the stamp names them, so a root made with fewer is made again.
packages="mesa-vulkan-drivers,libvulkan1,vulkan-tools,python3"
stamp="$root/.flux-lite-ready-$(echo "$packages" | sha256sum | cut -c 1-8)"

# The Debian mirror this machine's apt uses (no host is named here).
mirror() {
    local uri=""
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        uri="$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)"
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri="$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' /etc/apt/sources.list)"
    fi
    [ -n "$uri" ] || { echo "lavapipe-sid: no Debian mirror in this machine's apt sources" >&2; exit 1; }
    echo "$uri"
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

setup() {
    if [ -f "$stamp" ]; then
        echo "lavapipe-sid: $root ready"
        return
    fi
    # One apt at a time: ci/setup-browser.sh may be installing beside this.
    command -v debootstrap >/dev/null || (
        flock 8
        as_root apt-get update -q
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends debootstrap
    ) 8> "${TMPDIR:-/tmp}/flux-lite-apt.lock"
    as_root rm -rf "$root"
    echo "lavapipe-sid: making a sid root in $root"
    as_root debootstrap --variant=minbase --include="$packages" sid "$root" "$(mirror)" >/dev/null
    as_root touch "$stamp"
    info
}

# Runs "$@" inside the root with /proc, /dev, the work tree and the build
# folder (CARGO_TARGET_DIR, where it is outside the work tree: the test
# binaries and the flux-lite binary they run) mounted at their own paths, in
# a private mount namespace so nothing stays mounted after it. Mesa's shader
# cache is /tmp/.cache there (the root's HOME), or the folder
# MESA_SHADER_CACHE_DIR names, mounted at its own path.
inside() {
    local here repo target="" shader_cache=""
    here="$(pwd -P)"
    repo="$(cd "$(dirname "$0")/.." && pwd -P)"
    if [ -n "${CARGO_TARGET_DIR:-}" ] && [ -d "$CARGO_TARGET_DIR" ]; then
        target="$(cd "$CARGO_TARGET_DIR" && pwd -P)"
        case "$target/" in "$repo"/*) target="" ;; esac
    fi
    if [ -n "${MESA_SHADER_CACHE_DIR:-}" ]; then
        mkdir -p "$MESA_SHADER_CACHE_DIR"
        shader_cache="$(cd "$MESA_SHADER_CACHE_DIR" && pwd -P)"
    fi
    as_root unshare --mount --propagation private bash -c '
        set -e
        root="$1"; repo="$2"; here="$3"; target="$4"; shader_cache="$5"; shift 5
        mount --bind /proc "$root/proc"
        mount --bind /dev "$root/dev"
        mkdir -p "$root$repo" "$root/tmp"
        mount --bind "$repo" "$root$repo"
        for dir in "$target" "$shader_cache"; do
            if [ -n "$dir" ]; then
                mkdir -p "$root$dir"
                mount --bind "$dir" "$root$dir"
            fi
        done
        mount --bind /tmp "$root/tmp"
        exec chroot "$root" env -i PATH=/usr/bin:/bin HOME=/tmp XDG_RUNTIME_DIR=/tmp \
            ${FLUX_LITE_BACKEND:+FLUX_LITE_BACKEND=$FLUX_LITE_BACKEND} \
            ${FLUX_LITE_REQUIRE_MATRIX:+FLUX_LITE_REQUIRE_MATRIX=$FLUX_LITE_REQUIRE_MATRIX} \
            ${FLUX_LITE_EMULATE_MATRIX:+FLUX_LITE_EMULATE_MATRIX=$FLUX_LITE_EMULATE_MATRIX} \
            ${shader_cache:+MESA_SHADER_CACHE_DIR=$shader_cache} \
            bash -c "cd \"\$0\" && exec \"\$@\"" "$here" "$@"
    ' inside "$root" "$repo" "$here" "$target" "$shader_cache" "$@"
}

info() {
    inside vulkaninfo --summary 2>/dev/null | grep -E 'deviceName|driverInfo|apiVersion' || true
    inside bash -c 'vulkaninfo 2>/dev/null | grep -c VK_KHR_cooperative_matrix' >/dev/null \
        || { echo "lavapipe-sid: the root's Mesa offers no VK_KHR_cooperative_matrix" >&2; exit 1; }
    echo "lavapipe-sid: VK_KHR_cooperative_matrix offered"
}

case "${1:-}" in
    setup) setup ;;
    info) info ;;
    run) shift; inside "$@" ;;
    *) echo "usage: bash ci/lavapipe-sid.sh setup|info|run CMD..." >&2; exit 2 ;;
esac
