#!/usr/bin/env bash
# The CUDA checks: tests/test_gpu.py (every test marked `gpu`; they skip without a GPU) and a
# CUDA smoke run of the FSDP2 example. Run from anywhere on a machine with an NVIDIA GPU:
#
#     scripts/gpu_check.sh [extra pytest args]
#
# ludic_lab runs from the source tree (PYTHONPATH=., no install). The machine needs torch with
# CUDA, transformers, tokenizers, safetensors, peft, numpy, pytest and pytest-timeout; the tiny
# test model is built from code, so nothing is downloaded. On a machine without network access
# carry the missing pure-Python wheels in .whl/ (built elsewhere with `pip download --no-deps
# --only-binary=:all: --python-version 3.12 -d .whl pytest-asyncio`): they are installed into
# /tmp/site and put on PYTHONPATH first. Measurements go to $LUDIC_GPU_REPORT (JSON lines,
# default gpu_report.jsonl). docs/deployment.md ("GPU paths, checked on an H100") has the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export LUDIC_GPU_REPORT=${LUDIC_GPU_REPORT:-gpu_report.jsonl}
: > "$LUDIC_GPU_REPORT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'nccl', torch.cuda.nccl.version(), 'transformers', transformers.__version__, 'peft', peft.__version__)"
status=0
"$PY" -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -rs "$@" || status=$?
# the FSDP2 example on the GPU in one process (rank 0 samples on CPU, the trainer on CUDA)
"$PY" examples/fsdp2_training/train_math_fsdp2.py --model tiny --device cuda --train-steps 2 \
  --questions-per-step 4 --group-size 4 --out "${GPU_CHECK_OUT:-/tmp/gpu_check}/fsdp2_example" || status=$?
exit $status
