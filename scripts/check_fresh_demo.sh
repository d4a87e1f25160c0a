#!/usr/bin/env bash
# README's first command on a fresh machine: `make demo` into a brand-new venv (exactly what a
# new user's `make demo` installs: `make setup`), then `ludic-lab --help`, every subcommand's
# `--help`, a missing-extra command (one line naming the pip install, no traceback), and the
# demo itself in a short configuration with an empty model cache (so SmolLM2 is materialised
# from the GGUF as on a first run). Usage: scripts/check_fresh_demo.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${DEMO_VENV:-/tmp/ludic-demo-venv}}"
DEMO_ARGS="${DEMO_ARGS:---steps 1 --questions-per-step 2 --group-size 2 --max-tokens 8 --eval-k 0}"
work="$(mktemp -d /tmp/ludic-fresh-demo.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rm -rf "$VENV"
secs() { echo $(( $(date +%s) - $1 )); }

t=$(date +%s)
make --no-print-directory setup VENV="$VENV"
echo "== fresh venv $VENV set up (make setup) in $(secs "$t")s"

t=$(date +%s)
"$VENV/bin/ludic-lab" --help >/dev/null
commands=$("$VENV/bin/python" -c 'from ludic_lab.cli import subcommands; print(*subcommands())')
for cmd in $commands; do
  "$VENV/bin/ludic-lab" "$cmd" --help >/dev/null || { echo "ludic-lab $cmd --help failed" >&2; exit 1; }
done
echo "== ludic-lab --help and --help of: $commands ($(secs "$t")s)"

# without the pipeline extra, `ludic-lab actor` must say what to install, in one line
if "$VENV/bin/python" -c 'import msgpack' 2>/dev/null; then
  echo "== (the pipeline extra is installed in $VENV: skipping the missing-extra check)"
else
  set +e
  "$VENV/bin/ludic-lab" actor --max-rounds 1 >"$work/actor.out" 2>&1
  rc=$?
  set -e
  if [ "$rc" -ne 1 ] || grep -q Traceback "$work/actor.out" || ! grep -Eq "pip install (-e )?'[^']*\[pipeline\]'" "$work/actor.out"; then
    echo "ludic-lab actor without the pipeline extra (exit $rc) should print one line naming the pip install:" >&2
    cat "$work/actor.out" >&2
    exit 1
  fi
  echo "== ludic-lab actor without the pipeline extra: $(cat "$work/actor.out")"
fi

t=$(date +%s)
LUDIC_LAB_CACHE="$work/cache" timeout 900 \
  make --no-print-directory demo VENV="$VENV" DEMO_ARGS="$DEMO_ARGS --out $work/demo"
for f in summary.json metrics.jsonl reward_curve.png rollouts.html; do
  test -s "$work/demo/$f" || { echo "the demo did not write $f" >&2; exit 1; }
done
echo "== make demo DEMO_ARGS='$DEMO_ARGS' passed in $(secs "$t")s (model materialised into an empty cache)"
