"""Run FSDP2 training scenarios under torchrun (one process group for all of them).

    torchrun --standalone --nproc_per_node=2 tests/dist_scripts/fsdp_train.py \
        --model-dir DIR --out OUT [--scenarios full,per_rank,lora] [--fail-rank 1 --fail-step 2]

For each scenario rank 0 writes ``OUT/<name>/metrics.json`` (per-step metrics),
``OUT/<name>/published/v<k>.safetensors`` (the gathered policy after each step) and a
checkpoint (``OUT/full/ckpt`` at step 2, ``OUT/lora/ckpt`` at the end; ``OUT/lora/policy`` the
saved policy, merged and adapter). With ``--fail-rank``
that rank's loss raises in the first micro-batch of step ``--fail-step`` (the other rank is
then waiting inside a collective); it writes ``OUT/failed_at.txt`` (a timestamp) first.
Scenario ``resume-NAME`` loads the one-process checkpoint given as ``--resume NAME=CKPT``
(of scenario NAME, written after step 2) into the sharded trainer and trains the last step.
With ``--mismatch`` rank 1's source serves the same items in another order (a different
global batch), which ``batch_split="global"`` must refuse.
Every rank writes ``OUT/done-<rank>`` when all scenarios finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdp_scenarios import CHECKPOINT_STEP, SCENARIOS, STEPS, build_trainer
from torch.distributed.elastic.multiprocessing.errors import record
from trainer_helpers import ListBatchSource

from ludic_lab.distributed.dist_utils import destroy_distributed, get_rank, get_world_size, init_distributed
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.saving import save_policy


class FailingLoss:
    """Wraps a loss; raises on rank ``fail_rank`` once the trainer is at step ``fail_step``."""

    def __init__(self, inner: Any, trainer_ref: list, fail_rank: int, fail_step: int, out: Path) -> None:
        self.inner, self.trainer_ref, self.fail_rank, self.fail_step, self.out = (
            inner,
            trainer_ref,
            fail_rank,
            fail_step,
            out,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def compute(self, logprobs: Any, batch: Any) -> Any:
        trainer = self.trainer_ref[0]
        if get_rank() == self.fail_rank and trainer.step + 1 == self.fail_step:
            (self.out / "failed_at.txt").write_text(repr(time.time()))
            raise RuntimeError(f"injected failure on rank {self.fail_rank} at step {self.fail_step}")
        return self.inner.compute(logprobs, batch)


def _numeric(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if isinstance(v, (int, float, str))}


@record
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenarios", default="full,per_rank,lora")
    ap.add_argument("--fail-rank", type=int, default=-1)
    ap.add_argument("--fail-step", type=int, default=0)
    ap.add_argument("--mismatch", action="store_true", help="rank 1's source serves other batches than rank 0's")
    ap.add_argument(
        "--resume",
        action="append",
        default=[],
        metavar="NAME=CKPT",
        help="scenario 'resume-NAME': scenario NAME continued from this one-process checkpoint",
    )
    args = ap.parse_args()
    out = Path(args.out)
    init_distributed("cpu", timeout_s=120)
    rank, world = get_rank(), get_world_size()
    resume = dict(r.split("=", 1) for r in args.resume)
    try:
        for name in args.scenarios.split(","):
            base = name.removeprefix("resume-")
            sc = SCENARIOS[base]
            d = out / name
            kw: dict[str, Any] = {}
            if name == "full":
                kw = dict(checkpoint_dir=str(d / "ckpt"), checkpoint_every=CHECKPOINT_STEP, keep_checkpoints=5)
            trainer = build_trainer(sc, args.model_dir, str(d), rank=rank, world=world, **kw)
            assert trainer.world_size == world and trainer.data_parallel.root is not None, (
                "the trainer did not shard the model"
            )
            if args.mismatch and rank == 1:
                other = [SAWBatch(tuple(reversed(b.items))) for b in trainer.batch_source.batches]
                trainer.batch_source = ListBatchSource(other, cycle=False)
            if args.fail_rank >= 0:
                ref = [trainer]
                failing = FailingLoss(trainer.algo.loss, ref, args.fail_rank, args.fail_step, out)
                trainer.algo = dataclasses.replace(trainer.algo, loss=failing)
            try:
                if name != base:
                    trainer.load_checkpoint(resume[base], publish=False)
                    trainer.batch_source.served = trainer.step
                hist = trainer.train_sync(STEPS - trainer.step, progress=False)
                if name == "lora":
                    trainer.save_checkpoint(str(d / "ckpt"))
                    save_policy(trainer, d / "policy")  # every rank: gathered, rank 0 writes
            finally:
                trainer.close()
            if rank == 0:
                (d / "metrics.json").write_text(json.dumps([_numeric(m) for m in hist]))
        (out / f"done-{rank}").write_text("ok")
    finally:
        destroy_distributed()


if __name__ == "__main__":
    main()
