#!/usr/bin/env bash
# Makes sure the drivers the tests run on exist. Where none does (CI has no
# GPU), installs Mesa's software drivers from Debian: lavapipe for Vulkan,
# and llvmpipe behind EGL for wgpu's GL backend (the second translation,
# GLSL, that ci/test.sh runs the kernels, the golden PNGs and the selftest on).
# `vulkan-only` (ci/run.sh) leaves GL alone.
set -euo pipefail
want_gl=1
if [ "${1:-}" = vulkan-only ]; then want_gl=0; fi

# Any installed Vulkan driver counts (a GPU vendor's included): every folder
# the loader searches for ICD manifests, and the ones named by VK_DRIVER_FILES
# or VK_ICD_FILENAMES, so lavapipe is never installed beside a real driver.
icd_folders() {
    local data="${XDG_DATA_DIRS:-/usr/local/share:/usr/share}" config="${XDG_CONFIG_DIRS:-/etc/xdg}" d
    for d in ${data//:/ } ${config//:/ } /etc /usr/local/nvidia/share; do
        echo "$d/vulkan/icd.d"
    done
}
have_icd() {
    local f d named="${VK_DRIVER_FILES:-}:${VK_ICD_FILENAMES:-}"
    for f in ${named//:/ }; do
        [ -f "$f" ] && return 0
    done
    while read -r d; do
        compgen -G "$d/*.json" >/dev/null && return 0
    done < <(icd_folders)
    return 1
}
have_vulkan() {
    ldconfig -p 2>/dev/null | grep 'libvulkan\.so\.1' >/dev/null && have_icd
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
# The Khronos SPIR-V validator, which the kernel tests run on every module's
# SPIR-V (the tests only: `vulkan-only` runs leave it alone).
if [ "$want_gl" -eq 1 ] && ! command -v spirv-val >/dev/null; then
    echo "setup-vulkan: no spirv-val found; installing spirv-tools"
    packages+=(spirv-tools)
fi
if [ "${#packages[@]}" -gt 0 ]; then
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${packages[@]}"
fi
have_vulkan || { echo "setup-vulkan: still no Vulkan driver after installing" >&2; exit 1; }
[ "$want_gl" -eq 0 ] || have_egl || { echo "setup-vulkan: still no EGL with Mesa's GL driver after installing" >&2; exit 1; }
