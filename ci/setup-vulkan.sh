#!/usr/bin/env bash
# Makes sure the drivers the tests run on exist. Where none does (CI has no
# GPU), installs Mesa's software drivers from Debian: lavapipe for Vulkan,
# and llvmpipe behind EGL for wgpu's GL backend (the second translation,
# GLSL, that ci/test.sh runs the kernels, the golden PNGs and the selftest on).
# `vulkan-only` (ci/run.sh) leaves GL alone.
set -euo pipefail
want_gl=1
if [ "${1:-}" = vulkan-only ]; then want_gl=0; fi

have_vulkan() {
    ldconfig -p 2>/dev/null | grep 'libvulkan\.so\.1' >/dev/null &&
        compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null
}

have_egl() {
    ldconfig -p 2>/dev/null | grep 'libEGL\.so\.1' >/dev/null &&
        ldconfig -p 2>/dev/null | grep 'libEGL_mesa\.so\.0' >/dev/null &&
        compgen -G '/usr/lib/*/dri/swrast_dri.so' >/dev/null
}

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
packages=()
if have_vulkan; then
    echo "setup-vulkan: Vulkan loader and driver present"
else
    echo "setup-vulkan: no Vulkan driver found; installing mesa-vulkan-drivers (lavapipe)"
    packages+=(mesa-vulkan-drivers libvulkan1)
fi
if [ "$want_gl" -eq 0 ] || have_egl; then
    [ "$want_gl" -eq 0 ] || echo "setup-vulkan: EGL and Mesa's GL driver present"
else
    echo "setup-vulkan: no EGL with Mesa's GL driver found; installing libegl1, libegl-mesa0, libgl1-mesa-dri (llvmpipe)"
    packages+=(libegl1 libegl-mesa0 libgl1-mesa-dri)
fi
if [ "${#packages[@]}" -gt 0 ]; then
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${packages[@]}"
fi
have_vulkan || { echo "setup-vulkan: still no Vulkan driver after installing" >&2; exit 1; }
[ "$want_gl" -eq 0 ] || have_egl || { echo "setup-vulkan: still no EGL with Mesa's GL driver after installing" >&2; exit 1; }
