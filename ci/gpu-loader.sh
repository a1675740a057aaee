# Sourced by ci/gpu-run.sh and ci/gpu-variants.sh (which define `say`): the
# Vulkan loader unpacked from .gl/*.deb where the machine has a driver but no
# loader, NVIDIA's ICD named, and a runtime dir for Mesa's WSI layer.
# (Only where ldconfig can say: without it, e.g. in a chroot's bare PATH,
# nothing is unpacked over the root's own libraries.)
ldconfig_bin="$(command -v ldconfig || echo /sbin/ldconfig)"
if [ -x "$ldconfig_bin" ] && ! "$ldconfig_bin" -p 2>/dev/null | grep 'libvulkan\.so\.1' >/dev/null; then
    if compgen -G '.gl/*.deb' >/dev/null && [ "$(id -u)" -eq 0 ]; then
        for f in .gl/*.deb; do dpkg -x "$f" /; done
        "$ldconfig_bin"
        say "loader: unpacked $(ls .gl/*.deb | wc -l) packages from .gl/"
    else
        say "loader: no libvulkan.so.1 and no .gl/*.deb to unpack (or not root); Vulkan may not start"
    fi
fi
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
    if [ -f "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then
        export VK_DRIVER_FILES="$icd"
        say "loader: VK_DRIVER_FILES=$icd"
    fi
done
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/flux-lite-xdg-$(id -u)}"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"

