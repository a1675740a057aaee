#!/usr/bin/env bash
# Makes sure Chromium and chromedriver exist for the page's browser tests
# (cli/tests/page.rs): installs Debian's chromium and chromium-driver where
# chromedriver is missing (about a minute).
set -euo pipefail
if command -v chromedriver >/dev/null && { command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null; }; then
    echo "setup-browser: chromedriver and a Chromium present"
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "setup-browser: installing chromium and chromium-driver"
# One apt at a time: ci/lavapipe-sid.sh may be installing beside this.
(
    flock 8
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends chromium chromium-driver
) 8> "${TMPDIR:-/tmp}/flux-lite-apt.lock"
command -v chromedriver >/dev/null || { echo "setup-browser: still no chromedriver after installing" >&2; exit 1; }
