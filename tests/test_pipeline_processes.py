"""Actor and trainer as separate processes (``actor_main`` / ``trainer_main``) on the tiny
model against a real redis-server: the trainer is ``kill -9``-ed in the middle of a batch and
restarted, Redis is ``kill -9``-ed and restarted twice (AOF on) while they run, and still
every pushed item is trained exactly once.

"Trained" is what each trainer process appends to its audit file when it commits a step's
items (after the optimizer step); the actor appends every pushed id to its own file.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis_helpers import RedisServer, python_cmd, redis_server_fixture, subprocess_env

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROUNDS, PER_ROUND, BATCH = 10, 16, 16  # 160 items = 10 optimizer steps of 16
STEPS = ROUNDS * PER_ROUND // BATCH


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from redis_server_fixture(tmp_path_factory)


def _lines(p: Path) -> list[str]:
    return p.read_text().split() if p.exists() else []


def _tail(p: Path, n: int = 3000) -> str:
    return p.read_text(errors="replace")[-n:] if p.exists() else "(no log)"


class Proc:
    def __init__(self, name: str, cmd: list[str], log: Path) -> None:
        self.name, self.log = name, log
        with open(log, "ab") as f:
            self.p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=subprocess_env())

    def check_alive(self) -> None:
        if self.p.poll() is not None and self.p.returncode != 0:
            pytest.fail(f"{self.name} exited with {self.p.returncode}:\n{_tail(self.log)}")

    def wait(self, timeout: float) -> int:
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not finish within {timeout} s:\n{_tail(self.log)}")

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=10)

    def last_json(self, key: str) -> dict:
        for line in reversed(self.log.read_text().splitlines()):
            if line.startswith("{") and key in line:
                return json.loads(line)[key]
        raise AssertionError(f"{self.name} printed no {key}:\n{_tail(self.log)}")


def _wait(pred: Callable[[], bool], timeout: float, what: str, procs: list[Proc]) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        for p in procs:
            p.check_alive()
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout} s waiting for {what}:\n" + "\n".join(_tail(p.log, 1500) for p in procs)
            )
        time.sleep(0.01)


def test_kill_trainer_and_restart_redis_every_item_trained_exactly_once(server: RedisServer, tmp_path: Path) -> None:
    queue = "q-procs"
    pushed_f, trained_f, ckpt = tmp_path / "pushed.txt", tmp_path / "trained.txt", tmp_path / "ckpt"
    actor_cmd = python_cmd(
        "ludic_lab.pipeline.actor_main",
        "--redis-url",
        server.url,
        "--queue-key",
        queue,
        "--task",
        "digits",
        "--model",
        "tiny",
        "--prompts-per-round",
        "4",
        "--group-size",
        "4",
        "--max-tokens",
        "12",
        "--max-rounds",
        str(ROUNDS),
        "--max-queue-items",
        "32",
        "--threads",
        "1",
        "--pushed-ids-path",
        str(pushed_f),
    )
    trainer_cmd = python_cmd(
        "ludic_lab.pipeline.trainer_main",
        "--redis-url",
        server.url,
        "--queue-key",
        queue,
        "--model",
        "tiny",
        "--steps",
        str(STEPS),
        "--batch-size",
        str(BATCH),
        "--lr",
        "1e-3",
        "--max-lag",
        "-1",
        "--max-seq-len",
        "256",
        "--micro-token-budget",
        "4096",
        "--threads",
        "1",
        "--trained-ids-path",
        str(trained_f),
        "--metrics-path",
        str(tmp_path / "metrics.jsonl"),
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "1",
        "--batch-timeout-s",
        "150",
    )
    r = server.client()
    actor = Proc("actor", actor_cmd, tmp_path / "actor.log")
    trainer = Proc("trainer", trainer_cmd, tmp_path / "trainer1.log")
    procs = [actor, trainer]
    try:
        # 1. let the trainer commit two steps, then kill -9 it while it holds an uncommitted batch
        def held_by_trainer() -> list[bytes]:
            try:
                rows = r.xpending_range(queue, "trainers", "-", "+", 1000, consumername="trainer-0")
            except Exception:  # noqa: BLE001 - the group does not exist yet
                return []
            return [row["message_id"] for row in rows]

        killed_holding: list[bytes] = []
        deadline = time.monotonic() + 180
        while not killed_holding:
            _wait(
                lambda: len(_lines(trained_f)) >= 2 * BATCH and bool(held_by_trainer()),
                180,
                "the trainer to commit 2 steps and hold the next batch",
                procs,
            )
            trainer.p.send_signal(signal.SIGSTOP)  # frozen: it can no longer acknowledge anything
            held = held_by_trainer()
            if held:
                killed_holding = [f[b"id"].decode() for sid in held for _, f in r.xrange(queue, sid, sid)]
                trainer.p.kill()  # kill -9 mid-batch
                trainer.p.wait(timeout=10)
            else:  # it committed in between: let it go on and try again
                trainer.p.send_signal(signal.SIGCONT)
            assert time.monotonic() < deadline, "never caught the trainer holding a batch"
        trained_at_kill = _lines(trained_f)
        assert len(trained_at_kill) < ROUNDS * PER_ROUND
        procs = [actor]

        # 2. kill -9 Redis while the actor runs (AOF with fsync always keeps every write)
        server.restart(hard=True, down_s=1.0)

        # 3. restart the trainer: it resumes from its checkpoint and re-reads its pending batch
        trainer2 = Proc("trainer (restarted)", trainer_cmd, tmp_path / "trainer2.log")
        procs = [actor, trainer2]
        _wait(
            lambda: len(_lines(trained_f)) >= len(trained_at_kill) + 2 * BATCH,
            180,
            "the restarted trainer to commit 2 steps",
            procs,
        )

        # 4. and Redis once more, with both running
        server.restart(hard=True, down_s=1.0)
        assert actor.wait(180) == 0, _tail(actor.log)
        assert trainer2.wait(180) == 0, _tail(trainer2.log)
    finally:
        for p in procs + [trainer]:
            p.kill()

    pushed, trained = _lines(pushed_f), _lines(trained_f)
    assert len(pushed) == len(set(pushed)) == ROUNDS * PER_ROUND
    assert len(trained) == len(set(trained)), "an item was trained twice"
    assert set(trained) == set(pushed), f"{len(set(pushed) - set(trained))} pushed items were never trained"
    # the items the killed trainer held were trained after the restart (once: see above)
    assert set(killed_holding) <= set(trained) and not set(killed_holding) & set(trained_at_kill)
    # nothing is left behind in Redis, and the done set has every item once
    assert r.xlen(queue) == 0 and r.xpending(queue, "trainers")["pending"] == 0
    assert r.zcard(f"{queue}:done") == ROUNDS * PER_ROUND and r.xlen(f"{queue}:dead") == 0

    stats = actor.last_json("actor_stats")
    assert stats["rounds"] == ROUNDS and stats["reconnects"] >= 1  # it rode through both Redis restarts
    assert stats["weight_updates"] >= 1 and max(stats["policy_versions"]) >= 1  # it sampled with trained weights
    summary = trainer2.last_json("trainer_summary")
    assert summary["steps"] == STEPS and summary["policy_version"] == STEPS
    resumed = re.search(r"resumed from \S+ at step (\d+)", trainer2.log.read_text())
    assert resumed is not None and summary["steps_this_run"] == STEPS - int(resumed.group(1))
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sorted({m["step"] for m in metrics}) == list(range(1, STEPS + 1))
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert sum(m["grad_norm"] > 0 for m in metrics) >= STEPS // 2  # (a step whose groups all tie has no signal)
    assert os.path.isdir(ckpt)


@pytest.mark.distributed
def test_trainer_under_torchrun_each_rank_consumes_its_own_share(server: RedisServer, tmp_path: Path) -> None:
    """The deployment recipe in miniature: ``torchrun --nproc_per_node=2`` trainer (FSDP2, gloo)
    against one actor; every item is trained exactly once, by one of the two ranks."""
    from redis_helpers import free_port

    queue, rounds = "q-torchrun", 4  # 64 items = 2 steps x 2 ranks x 16
    pushed_f, trained_f, ckpt = tmp_path / "pushed.txt", tmp_path / "trained.txt", tmp_path / "ckpt"
    actor = Proc(
        "actor",
        python_cmd(
            "ludic_lab.pipeline.actor_main",
            "--redis-url",
            server.url,
            "--queue-key",
            queue,
            "--task",
            "digits",
            "--model",
            "tiny",
            "--prompts-per-round",
            "4",
            "--group-size",
            "4",
            "--max-tokens",
            "12",
            "--max-rounds",
            str(rounds),
            "--max-queue-items",
            "64",
            "--threads",
            "1",
            "--pushed-ids-path",
            str(pushed_f),
        ),
        tmp_path / "actor.log",
    )
    trainer = Proc(
        "torchrun trainer",
        python_cmd(
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_port",
            str(free_port()),
            "-m",
            "ludic_lab.pipeline.trainer_main",
            "--redis-url",
            server.url,
            "--queue-key",
            queue,
            "--model",
            "tiny",
            "--steps",
            "2",
            "--batch-size",
            str(BATCH),
            "--lr",
            "1e-3",
            "--max-lag",
            "-1",
            "--max-seq-len",
            "256",
            "--micro-token-budget",
            "4096",
            "--threads",
            "1",
            "--trained-ids-path",
            str(trained_f),
            "--checkpoint-dir",
            str(ckpt),
            "--checkpoint-every",
            "1",
            "--batch-timeout-s",
            "150",
        ),
        tmp_path / "trainer.log",
    )
    try:
        assert trainer.wait(300) == 0, _tail(trainer.log)
        assert actor.wait(120) == 0, _tail(actor.log)
    finally:
        trainer.kill()
        actor.kill()
    pushed = _lines(pushed_f)
    per_rank = [_lines(Path(f"{trained_f}.rank{r}")) for r in (0, 1)]
    assert [len(t) for t in per_rank] == [2 * BATCH, 2 * BATCH]  # each rank consumed its own 2 x 16
    trained = per_rank[0] + per_rank[1]
    assert len(trained) == len(set(trained)) and set(trained) == set(pushed) and len(pushed) == rounds * PER_ROUND
    # the checkpoint (written by rank 0) knows both consumers' uncommitted items
    state = json.loads((sorted(ckpt.glob("step-*"))[-1] / "trainer_state.json").read_text())
    assert set(state["extra_state"]["batch_source"]["consumers"]) == {"trainer-0", "trainer-1"}
    summaries = [
        json.loads(line)["trainer_summary"]
        for line in trainer.log.read_text().splitlines()
        if line.startswith('{"trainer_summary"')
    ]
    assert len(summaries) == 2 and all(s["steps"] == 2 and s["policy_version"] == 2 for s in summaries)
