"""FSDP2 on a GPU over NCCL, with one rank (NCCL cannot put two ranks on one GPU).

    torchrun --standalone --nproc_per_node=1 tests/dist_scripts/fsdp_gpu.py \
        --model-dir DIR --out OUT [--scenarios full,per_rank,lora] [--precision bf16|fp32]

The trainer shards only when there is more than one rank (``WORLD_SIZE > 1``); to run its
sharded path on a single GPU this script opens the NCCL process group itself and tells the
library that a one-rank group counts as distributed. Everything else is the real path:
``fully_shard`` per block and on the root, the mixed-precision policy (bf16 compute, fp32
reduction) or fp32, the step-wide reductions and the gradient-norm all-reduce over NCCL,
the full-state-dict gather for publishing.

For each scenario rank 0 writes ``OUT/<name>/metrics.json`` and
``OUT/<name>/published/v<k>.safetensors`` (as ``fsdp_train.py`` does), plus
``OUT/<name>/cuda.json`` (peak GPU memory, seconds per step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from fsdp_scenarios import SCENARIOS, STEPS, build_trainer

import ludic_lab.distributed.dist_utils as dist_utils
import ludic_lab.training.trainer  # noqa: F401  (imports whatever decides on sharding)


def _one_rank_counts() -> bool:
    return dist.is_available() and dist.is_initialized()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenarios", default="full,per_rank,lora")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    args = ap.parse_args()
    out = Path(args.out)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    assert dist.get_backend() == "nccl" and dist.get_world_size() == 1
    # a one-rank group counts as distributed: the trainer shards and every collective runs over NCCL
    original = dist_utils.is_distributed
    for mod in [m for name, m in sys.modules.items() if name.startswith("ludic_lab.")]:
        if getattr(mod, "is_distributed", None) is original:
            mod.is_distributed = _one_rank_counts
    try:
        for name in args.scenarios.split(","):
            d = out / name
            sc = SCENARIOS[name]
            torch.cuda.reset_peak_memory_stats(device)
            trainer = build_trainer(
                sc, args.model_dir, str(d), model_device="cuda", fsdp_mixed_precision=args.precision == "bf16"
            )
            try:
                assert trainer.data_parallel.root is not None, "the trainer did not shard the model"
                t0 = time.perf_counter()
                hist = trainer.train_sync(STEPS, progress=False)
                torch.cuda.synchronize(device)
                seconds = time.perf_counter() - t0
                param_dtype = str(next(trainer.model.parameters()).dtype)
            finally:
                trainer.close()
            numeric = [{k: v for k, v in m.items() if isinstance(v, (int, float, str))} for m in hist]
            (d / "metrics.json").write_text(json.dumps(numeric))
            info: dict[str, Any] = {
                "seconds_per_step": seconds / STEPS,
                "peak_mem_mib": torch.cuda.max_memory_allocated(device) / 2**20,
                "sharded_param_dtype": param_dtype,
                "backend": dist.get_backend(),
            }
            (d / "cuda.json").write_text(json.dumps(info))
            print(name, args.precision, json.dumps(info), flush=True)
        (out / "done-0").write_text("ok")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
