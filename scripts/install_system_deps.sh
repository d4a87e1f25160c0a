#!/usr/bin/env bash
# System packages the test suite drives for real: redis-server (pipeline RL tests),
# Debian's chromium + chromedriver (the HTML credit view is opened in a headless browser) and
# bubblewrap (the sandbox that runs model-written code in the code-execution env).
# Installs only what is missing; needs root or sudo and Debian's apt.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
if [ "${#need[@]}" -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "missing system packages: ${need[*]} (install them with apt, as root)" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
echo "== installing system packages: ${need[*]}"
$SUDO apt-get install -y -q "${need[@]}" >/dev/null 2>&1 || {
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q "${need[@]}" >/dev/null
}
