#!/usr/bin/env bash
# A browser's view of the demo's rollouts.html, as a PNG to look at: runs `ludic-lab demo` in
# a one-step configuration (unless HTML is given), then headless Chromium screenshots the page.
# Usage: scripts/screenshot_rollouts.sh [HTML] [PNG]
#   HTML  an existing rollouts.html (default: run the demo into a temporary folder)
#   PNG   where the screenshot goes (default: /tmp/rollouts.png)
# Environment: DEMO_ARGS (default: one step of 4 questions x 4 samples on SmolLM2, the demo's 20-token
# replies (shorter ones are often cut, and a cut reply is a parse error), so that the
# weights differ: rows green, red and grey), VENV (default: .venv), CHROMIUM (default: chromium),
# WINDOW (default: 1400,1000).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
CHROMIUM="${CHROMIUM:-chromium}"
WINDOW="${WINDOW:-1400,1000}"
DEMO_ARGS="${DEMO_ARGS:---steps 1 --questions-per-step 4 --group-size 4 --eval-k 0}"
html="${1:-}"
png="${2:-/tmp/rollouts.png}"

if [ -z "$html" ]; then
  out="$(mktemp -d /tmp/ludic-rollouts.XXXXXX)"
  # shellcheck disable=SC2086 # DEMO_ARGS is a list of flags
  timeout 900 "$VENV/bin/ludic-lab" demo $DEMO_ARGS --out "$out"
  html="$out/rollouts.html"
fi
test -s "$html" || { echo "no rollouts.html at $html" >&2; exit 1; }

rm -f "$png"
timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --window-size="$WINDOW" --screenshot="$png" "file://$(realpath "$html")" 2>/dev/null || true
test -s "$png" || { echo "chromium wrote no screenshot to $png" >&2; exit 1; }
echo "== $html -> $png"
