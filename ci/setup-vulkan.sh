#!/usr/bin/env bash
# Makes sure a Vulkan loader and driver exist. Where none does (CI has no
# GPU), installs Mesa's software Vulkan driver, lavapipe, from Debian.
set -euo pipefail

have_vulkan() {
    ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' &&
        compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null
}

if have_vulkan; then
    echo "setup-vulkan: Vulkan loader and driver present"
    exit 0
fi

echo "setup-vulkan: no Vulkan driver found; installing mesa-vulkan-drivers (lavapipe)"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends mesa-vulkan-drivers libvulkan1
have_vulkan || { echo "setup-vulkan: still no Vulkan driver after installing" >&2; exit 1; }
