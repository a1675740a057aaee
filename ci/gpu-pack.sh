#!/usr/bin/env bash
# What a call on the GPU machine carries, made here (the `device` tool's
# `carry`: [".bin", ".gl", ".whl"], 64 MiB with the tracked tree):
#   .bin/flux-lite.xz  the release binary, stripped and xz-compressed (about
#                      7 MB; 105 MB as built would not fit);
#   .gl/*.deb          the Vulkan loader and GL dispatch libraries (the
#                      machine has NVIDIA's driver but no libvulkan.so.1);
#   .whl/*.whl         diffusers 0.42.1 and importlib_metadata for the peer
#                      (the machine has PyTorch).
# Each folder is listed in .git/info/exclude, so the tree stays clean.
# Then, there: `bash ci/gpu-session.sh flash decisive`.
#
#   bash ci/gpu-pack.sh
set -euo pipefail
cd "$(dirname "$0")/.."

for folder in /.bin/ /.gl/ /.whl/; do
    grep -qxF "$folder" .git/info/exclude 2>/dev/null || echo "$folder" >> .git/info/exclude
done
cargo build --release -p flux-lite-cli
mkdir -p .bin
strip -o .bin/flux-lite target/release/flux-lite
xz -9 -T2 -f .bin/flux-lite

mkdir -p .gl /tmp/flux-lite-amd64-lists/partial
apt_amd64=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/flux-lite-amd64-lists)
apt-get "${apt_amd64[@]}" update -qq
(cd .gl && apt-get "${apt_amd64[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)

python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl diffusers==0.42.1 importlib_metadata

tracked=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
carried=$(du -cb .bin .gl .whl | tail -1 | cut -f1)
echo "gpu-pack: tracked tree $((tracked / 1048576)) MiB + carried $((carried / 1048576)) MiB of the 64 MiB a call takes"
[ $((tracked + carried)) -lt $((64 * 1048576)) ] || { echo "error: over 64 MiB" >&2; exit 1; }
