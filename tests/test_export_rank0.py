"""Exported scripts under ``torchrun``: rank 0 samples and every rank trains on that batch.

A script exported from ``tutorials/03_grpo.ipynb`` used to die at step 2 under
``torchrun --nproc_per_node=2`` ("the ranks' batch sources yielded different batches"): every
rank sampled with its own client, and only rank 0's received the new weights. The export now
wraps the source handed to ``Trainer`` in ``Rank0BroadcastSource``; here the exported
tutorial trains 3 steps on 2 ranks (gloo, the tiny model), launched from its command line,
and only rank 0 (the rank whose sampler holds the trained weights) evaluates and prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ludic_lab.lab.export_rank0 import asks_per_rank, wrap_trainer_sources

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def _torchrun(*args: str, cwd: Path, timeout: float = 420, tee: bool = False) -> subprocess.CompletedProcess:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch build has no gloo backend")
    # --tee 3: every line a rank prints is prefixed with its rank ("[default1]:..." / "[rank1]:...")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *(["--tee", "3"] if tee else []), *args]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_wraps_the_trainer_source_positional_and_keyword() -> None:
    body = "t = Trainer(policy, algo, source, config=c)\nu = lt.Trainer(m, a, batch_source=make(x,\n  y))\n"
    out, n = wrap_trainer_sources(body)
    assert n == 2
    assert "Trainer(policy, algo, Rank0BroadcastSource(source), config=c)" in out
    assert "batch_source=Rank0BroadcastSource(make(x,\n  y))" in out
    again, k = wrap_trainer_sources(out)  # already wrapped: left alone
    assert k == 0 and again == out
    assert wrap_trainer_sources("x = Trainer(*args)\ny = Other(a, b, c)\n")[1] == 0
    # non-ASCII before the argument: ast columns count bytes
    out, n = wrap_trainer_sources("t = Trainer(é_model, algo, src)  # ü\n")
    assert n == 1 and out == "t = Trainer(é_model, algo, Rank0BroadcastSource(src))  # ü\n"


def test_per_rank_cells_are_left_alone(tmp_path: Path) -> None:
    import ast

    from ludic_lab.lab.export import export_cells

    assert asks_per_rank(ast.parse('c = TrainerConfig(batch_split="per_rank")'))
    cells = ["#| export\nfrom ludic_lab.training import Trainer, TrainerConfig\nsource = algo = policy = None\n"]
    per_rank = 'trainer = Trainer(policy, algo, source, config=TrainerConfig(batch_split="per_rank"))\n'
    s = export_cells(cells, per_rank, tmp_path / "a.py")
    assert "Rank0BroadcastSource" not in s.source and not s.notes
    s = export_cells(cells, "trainer = Trainer(policy, algo, source)\n", tmp_path / "b.py")
    assert "Trainer(policy, algo, Rank0BroadcastSource(source))" in s.source
    assert "from ludic_lab.training import Rank0BroadcastSource" in s.source
    assert any("Rank0BroadcastSource" in n for n in s.notes)


@pytest.mark.slow
@pytest.mark.distributed
def test_exported_grpo_tutorial_trains_3_steps_on_2_ranks(tmp_path: Path, tiny_model_dir: str) -> None:
    exp = subprocess.run(
        [str(BIN / "ludic-lab"), "export", str(ROOT / "tutorials" / "03_grpo.ipynb"), "-o", str(tmp_path / "train.py")],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert exp.returncode == 0, exp.stderr
    assert "Rank0BroadcastSource(source)" in (tmp_path / "train.py").read_text()
    p = _torchrun(
        "train.py", "--model", tiny_model_dir, "--steps", "3", "--questions-per-step", "2", "--group-size", "4",
        "--max-tokens", "8", "--eval-questions", "2", "--run-dir", str(tmp_path / "run"), cwd=tmp_path, tee=True,
    )  # fmt: skip
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the global batch (2 questions x 4 answers) every step, and the new weights pushed after each
    assert all(r["items"] == 8 and r["policy_version"] == r["step"] and isinstance(r["loss"], float) for r in rows)
    # only rank 0 holds the trained sampler, so only rank 0 evaluates and prints the held-out numbers
    held_out = _rank_lines(p.stdout, "held-out:")
    assert len(held_out[0]) == 1 and "'accuracy':" in held_out[0][0], p.stdout[-3000:]
    assert held_out[1] == [], held_out[1]


def _rank_lines(stdout: str, needle: str) -> dict[int, list[str]]:
    """The lines of each rank (torchrun --tee prefix ``[<name><rank>]:``) that contain ``needle``."""
    import re

    out: dict[int, list[str]] = {0: [], 1: []}
    for line in stdout.splitlines():
        m = re.match(r"\[[A-Za-z_]*(\d+)\]:", line)
        if needle in line:
            assert m, f"a line without a rank prefix: {line!r}"
            out.setdefault(int(m.group(1)), []).append(line)
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_rank0_source_failure_reaches_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent(
        """
        import asyncio, sys
        from ludic_lab.distributed.dist_utils import destroy_distributed, get_rank, init_distributed
        from ludic_lab.rollouts import SAWBatch, SAWItem
        from ludic_lab.training import Rank0BroadcastSource

        class Source:
            def __init__(self):
                self.n = 0
            async def next_batch(self):
                self.n += 1
                if self.n == 2:
                    raise ValueError("no more questions")
                item = SAWItem(input_ids=[1, 2, 3], action_mask=[0, 1, 1], weights=[0.0, 0.5, 0.5],
                               behaviour_logprobs=[0.0, -1.0, -2.0])
                return SAWBatch((item,), meta={"reward_mean": 0.5, "not_json": object()})

        init_distributed("cpu", timeout_s=60)
        src = Rank0BroadcastSource(Source() if get_rank() == 0 else None)
        b = asyncio.run(src.next_batch())
        print(f"rank {get_rank()} got {len(b.items)} item(s) weight {b.items[0].weights[1]}", flush=True)
        try:
            asyncio.run(src.next_batch())
        except Exception as e:
            print(f"rank {get_rank()} raised {type(e).__name__}: {e}", flush=True)
        destroy_distributed()
        """
    ))  # fmt: skip
    p = _torchrun(str(script), cwd=tmp_path, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 0 got 1 item(s) weight 0.5" in p.stdout and "rank 1 got 1 item(s) weight 0.5" in p.stdout
    assert "rank 0 raised ValueError: no more questions" in p.stdout
    assert "rank 1 raised RuntimeError: rank 0's batch source failed: ValueError: no more questions" in p.stdout
