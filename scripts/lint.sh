#!/usr/bin/env bash
# Lint and type checks, configured in pyproject.toml ([tool.ruff], [tool.mypy]):
#   ruff check          pyflakes, pycodestyle, import order, bugbear, pyupgrade, blind excepts
#   ruff format --check the formatter's layout (run `ruff format <files>` to apply it)
#   mypy                types of the library (ludic_lab/)
# All three run; the script fails if any fails. Needs the dev extra (pip install -e '.[dev]').
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
rc=0
echo "== ruff check"
"$PY" -m ruff check . || rc=1
echo "== ruff format --check"
"$PY" -m ruff format --check . || rc=1
echo "== mypy"
"$PY" -m mypy || rc=1
exit "$rc"
