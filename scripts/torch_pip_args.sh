#!/usr/bin/env bash
# The pip arguments that install the right torch build on this machine (stdout), and one line
# saying which build and why (stderr). `make setup` runs it before `pip install torch==...`.
#   TORCH_BUILD=auto (default): the CUDA build when `nvidia-smi -L` lists a GPU, else the CPU build
#   TORCH_BUILD=cpu | cuda:     that build
# The CPU build comes from a local wheel folder when there is one (TORCH_WHEELS_DIR, default
# /opt/wheels), else from the PyTorch CPU index (binder/postBuild does the same): PyPI's Linux
# wheel is the CUDA build, ~500 MiB plus several GB of nvidia-* packages. The CUDA build comes
# from the default index (PyPI).
set -euo pipefail
build="${TORCH_BUILD:-auto}"
wheels="${TORCH_WHEELS_DIR:-/opt/wheels}"
case "$build" in
  auto | cpu | cuda) ;;
  *) echo "TORCH_BUILD must be auto, cpu or cuda, got '$build'" >&2; exit 2 ;;
esac
if [ "$build" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    build=cuda why="nvidia-smi lists a GPU"
  else
    build=cpu why="no CUDA device found"
  fi
  why="$why; TORCH_BUILD=cpu or cuda overrides"
else
  why="TORCH_BUILD=$build"
fi
if [ "$build" = cpu ]; then
  if [ -d "$wheels" ]; then
    echo "== torch: the CPU build, from the wheels in $wheels ($why)" >&2
    echo "--find-links $wheels"
  else
    echo "== torch: the CPU build, from the PyTorch CPU index ($why)" >&2
    echo "--index-url https://download.pytorch.org/whl/cpu"
  fi
else
  echo "== torch: the CUDA build, from the default index ($why)" >&2
  echo ""
fi
