#!/usr/bin/env bash
# One call on the GPU machine, from what ci/gpu-pack.sh made here: the
# binary unpacked to /tmp/flux-lite, the diffusers wheels installed into
# /tmp/site (on PYTHONPATH), the Vulkan loader unpacked (ci/gpu-loader.sh),
# then each stage named, in order, its report under $OUT:
#   flash     ci/gpu-flash.sh: what the flash attention's fault follows (about a minute);
#   decisive  ci/gpu-decisive.sh: the half-precision path's figures (about 200 s on an H200);
#   variants  ci/gpu-variants.sh: where the matrix linear's k step spends its time (about 2 minutes).
#
#   bash ci/gpu-session.sh flash decisive
set -uo pipefail
cd "$(dirname "$0")/.."

binary=/tmp/flux-lite
if [ -f .bin/flux-lite.xz ]; then
    python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.bin/flux-lite.xz'), open('$binary', 'wb'))" && chmod +x "$binary"
elif [ -x target/release/flux-lite ]; then
    binary=target/release/flux-lite
fi
if compgen -G '.whl/*.whl' >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# A call may run 600 s: each stage gets its own limit or what is left of
# 575 s, whichever is less.
within() {
    local limit=$1 left=$((575 - SECONDS))
    shift
    [ "$left" -gt 10 ] || { echo "gpu-session: no time left for $*" >&2; return 1; }
    timeout $((limit < left ? limit : left)) "$@"
}
status=0
for stage in "$@"; do
    case "$stage" in
        flash) within 240 bash ci/gpu-flash.sh "$binary" || status=1 ;;
        decisive) within 575 bash ci/gpu-decisive.sh "$binary" || status=1 ;;
        variants) within 300 bash ci/gpu-variants.sh "$binary" || status=1 ;;
        *) echo "error: gpu-session: no stage $stage (flash, decisive, variants)" >&2; exit 2 ;;
    esac
done
exit "$status"
