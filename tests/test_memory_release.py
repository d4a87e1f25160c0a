"""``TrainerConfig.release_host_memory``: glibc's free pages go back between steps, never inside one.

The trainer trims malloc's arenas (``malloc_trim``) after each step's rollouts and after each
optimizer step, and changes nothing on the hot path (no process-wide mmap threshold, which made
a step 1.3-1.4x slower: ``bench/memory_speed.py``). Checked on the real trainer and real glibc:
where the trims run, that the off switch turns them off, and that a trim hands back what a
thread's arena kept after its tensors were freed.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import ludic_lab.training.host_memory as host_memory
import ludic_lab.training.trainer as trainer_mod

MB = 2**20


def _train(model_dir: str, monkeypatch: pytest.MonkeyPatch, **config: Any) -> tuple[list[str], Any]:
    """Two steps of GRPO on the digits task; the order of trims and optimizer work, and the run."""
    from ludic_lab.env_training import train_env
    from ludic_lab.task.digits import digits_task

    events: list[str] = []
    real_release, real_optimize = host_memory.release_free_memory, trainer_mod.Trainer._optimize

    def release() -> bool:
        events.append(f"trim in {threading.current_thread().name}")
        return real_release()

    def optimize(self: Any, batches: Any) -> Any:
        events.append("optimize")
        try:
            return real_optimize(self, batches)
        finally:
            events.append("optimized")

    def no_map(*_: Any, **__: Any) -> bool:
        raise AssertionError("the trainer must not change malloc's mmap threshold (the hot path)")

    monkeypatch.setattr(host_memory, "release_free_memory", release)
    monkeypatch.setattr(host_memory, "map_large_blocks", no_map)
    monkeypatch.setattr(trainer_mod.Trainer, "_optimize", optimize)
    run = train_env(digits_task(), steps=2, model=model_dir, max_tokens=4, group_size=2, prompts_per_step=2,
                    progress=False, out=None, check=False, config=config)  # fmt: skip
    return events, run


@pytest.mark.skipif(host_memory._glibc() is None, reason="malloc_trim is glibc's")
def test_trims_run_between_steps_never_inside_one(tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    events, run = _train(tiny_model_dir, monkeypatch)
    assert len(run.history) == 2
    trims = [e for e in events if e.startswith("trim")]
    # after the rollouts (before the activations), after the optimizer step (before publishing) and
    # after publishing, on the loop's thread
    steps = [e if not e.startswith("trim") else "trim" for e in events]
    assert steps == ["trim", "optimize", "optimized", "trim", "trim"] * 2, events
    assert not any("ludic-trainer" in e for e in trims), events
    assert run.trainer._host_memory.releases == 6


def test_the_off_switch_turns_the_trims_off(tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    events, run = _train(tiny_model_dir, monkeypatch, release_host_memory=False)
    assert len(run.history) == 2
    assert events == ["optimize", "optimized"] * 2
    assert run.trainer._host_memory.releases == 0 and not run.trainer._host_memory.enabled


@pytest.mark.skipif(host_memory._glibc() is None, reason="malloc_trim is glibc's")
def test_a_trim_hands_back_what_a_threads_arena_kept() -> None:
    """Tensors freed in a thread stay resident in its arena (glibc keeps them for reuse); the trim
    gives them back while the tensors still live stay."""
    psutil = pytest.importorskip("psutil")
    import torch

    proc = psutil.Process()
    rss: dict[str, int] = {}

    def work() -> None:
        big = torch.ones(8 * MB, dtype=torch.uint8)  # mapped, and freed: glibc's threshold rises above 2 MiB
        del big
        rss["start"] = proc.memory_info().rss
        blocks = [torch.ones(2 * MB, dtype=torch.uint8) for _ in range(120)]  # 240 MB from this thread's arena
        rss["allocated"] = proc.memory_info().rss
        kept = blocks[1::2]  # every other block lives on: the freed ones cannot merge into the top
        del blocks
        rss["freed"] = proc.memory_info().rss
        host_memory.HostMemory(True).release()
        rss["trimmed"] = proc.memory_info().rss
        assert all(int(b[0]) == 1 and int(b[-1]) == 1 for b in kept)  # what lives is untouched
        del kept

    t = threading.Thread(target=work)
    t.start()
    t.join()
    table = {k: round(v / MB) for k, v in rss.items()}
    assert rss["allocated"] - rss["start"] > 200 * MB, table
    assert rss["allocated"] - rss["freed"] < 40 * MB, f"glibc kept the freed blocks resident before the trim: {table}"
    assert rss["freed"] - rss["trimmed"] > 90 * MB, f"the trim gave back the ~120 MB freed: {table}"
