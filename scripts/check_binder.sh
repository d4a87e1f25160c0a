#!/usr/bin/env bash
# Binder's environment, built as repo2docker builds it, and the quickstart run in it.
#
# repo2docker (mybinder.org) makes a fresh Python (binder/runtime.txt), installs
# binder/requirements.txt, then runs binder/postBuild from the repository root. Here: a
# brand-new venv, the same two steps with that venv first on PATH, and an empty model cache
# (postBuild materialises SmolLM2 into it, as into a new image). Then
# notebooks/quickstart.ipynb runs headless in that venv's own kernel, in its smoke
# configuration (LUDIC_SMOKE=1), and must finish without an error.
#
# pip: postBuild passes $BINDER_PIP_FLAGS to every install (default --no-cache-dir, right for an
# image); this check sets it empty so pip's cache (warm after `make test`) is reused. torch
# comes from the PyTorch CPU index postBuild names, or from pip's find-links when the machine
# has the wheel on disk (/opt/wheels here).
# Usage: scripts/check_binder.sh [VENV]   (default /tmp/ludic-binder-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${BINDER_VENV:-/tmp/ludic-binder-venv}}"
work="$(mktemp -d /tmp/ludic-binder.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rm -rf "$VENV"
secs() { echo $(( $(date +%s) - $1 )); }

want="$(sed -n 's/^python-\([0-9.]*\).*/\1/p' binder/runtime.txt)"
PYTHON="${BINDER_PYTHON:-$(command -v "python$want" || command -v python3)}"
have="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$have" != "$want" ]; then
  echo "== note: binder/runtime.txt asks for python-$want; building with $PYTHON ($have)"
fi

t=$(date +%s)
"$PYTHON" -m venv "$VENV"
export PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV"
export JUPYTER_DATA_DIR="$work/jupyter-data" JUPYTER_CONFIG_DIR="$work/jupyter-config" JUPYTER_RUNTIME_DIR="$work/jupyter-runtime"  # no user kernels
export LUDIC_LAB_CACHE="$work/cache"          # an empty model cache, as in a new image
export BINDER_PIP_FLAGS="${BINDER_PIP_FLAGS-}"  # reuse pip's cache (postBuild's default: none)
export PIP_RETRIES="${PIP_RETRIES:-1}"          # an unreachable index fails fast, find-links answer
python -m pip install -q -r binder/requirements.txt
test -x binder/postBuild || { echo "binder/postBuild is not executable: repo2docker would not run it" >&2; exit 1; }
./binder/postBuild
echo "== binder environment built in $VENV (requirements.txt + postBuild) in $(secs "$t")s"

# what the environment must not hold: vLLM (binder is CPU, in-process sampling)
if python -c 'import vllm' 2>/dev/null; then
  echo "binder's environment holds vllm: it must not (CPU install, no vLLM extra)" >&2
  exit 1
fi
test -d "$LUDIC_LAB_CACHE" || { echo "postBuild did not materialise the model into $LUDIC_LAB_CACHE" >&2; exit 1; }

t=$(date +%s)
cp notebooks/quickstart.ipynb "$work/"
LUDIC_SMOKE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  python - "$work/quickstart.ipynb" "$work/quickstart.executed.ipynb" <<'EOF'
"""Execute a notebook in this interpreter's own kernel (the venv's ipykernel), fail on any error."""
import sys

import nbformat
from nbclient import NotebookClient

src, dst = sys.argv[1], sys.argv[2]
nb = nbformat.read(src, as_version=4)
client = NotebookClient(nb, timeout=900, startup_timeout=120, kernel_name="python3",
                        resources={"metadata": {"path": str(__import__("pathlib").Path(src).parent)}})
try:
    client.execute()
finally:
    nbformat.write(nb, dst)
code = [c for c in nb.cells if c.cell_type == "code"]
assert all(c.execution_count is not None for c in code), "some code cells of the quickstart did not run"
errors = [o for c in code for o in c.outputs if o.get("output_type") == "error"]
assert not errors, errors
print(f"quickstart: {len(code)} code cells ran in {sys.prefix}")
EOF
kernel_python="$(python -c 'from jupyter_client.kernelspec import KernelSpecManager as K; print(K().get_kernel_spec("python3").argv[0])')"
case "$kernel_python" in
  "$VENV"/*|python|python3) ;;
  *) echo "the quickstart's kernel ($kernel_python) is not binder's venv" >&2; exit 1 ;;
esac
echo "== quickstart (LUDIC_SMOKE=1) ran in binder's environment in $(secs "$t")s"
