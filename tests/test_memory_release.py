"""``TrainerConfig.release_host_memory``: glibc's free pages go back between steps, never inside one,
and only once resident memory outgrows its limit.

The trainer asks :class:`HostMemory` once a step, after publishing, and changes nothing on the hot
path (no process-wide mmap threshold, which made a step 1.3-1.4x slower; a trim every step,
1.1-1.2x: ``bench/memory_speed.py``). Checked on the real trainer and real glibc: where the trims
run, that the off switch turns them off, that a trim hands back what a thread's arena kept after
its tensors were freed, and, in a fresh process, that steps which reuse malloc's pool never trim
while a step that outgrows the limit does, and resident memory falls back under it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

import ludic_lab.training.host_memory as host_memory
import ludic_lab.training.trainer as trainer_mod

MB = 2**20


def _train(model_dir: str, monkeypatch: pytest.MonkeyPatch, **config: Any) -> tuple[list[str], Any]:
    """Two steps of GRPO on the digits task; the order of the host-memory checks, the trims and the
    optimizer work, and the run. Step 2 ends over the limit (as if resident memory had grown)."""
    from ludic_lab.env_training import train_env
    from ludic_lab.task.digits import digits_task

    events: list[str] = []
    real_release, real_check = host_memory.release_free_memory, host_memory.HostMemory.step_ended
    real_optimize = trainer_mod.Trainer._optimize

    def release() -> bool:
        events.append(f"trim in {threading.current_thread().name}")
        return real_release()

    def step_ended(self: host_memory.HostMemory) -> bool:
        events.append(f"check in {threading.current_thread().name}")
        if self.limit is not None:
            self.limit = 0
        return real_check(self)

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
    monkeypatch.setattr(host_memory.HostMemory, "step_ended", step_ended)
    monkeypatch.setattr(trainer_mod.Trainer, "_optimize", optimize)
    run = train_env(digits_task(), steps=2, model=model_dir, max_tokens=4, group_size=2, prompts_per_step=2,
                    progress=False, out=None, check=False, config=config)  # fmt: skip
    return events, run


@pytest.mark.skipif(host_memory._glibc() is None, reason="malloc_trim is glibc's")
def test_trims_run_between_steps_never_inside_one(tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    events, run = _train(tiny_model_dir, monkeypatch)
    assert len(run.history) == 2
    # one check a step, after its optimizer step and its publish, on the loop's thread: step 1's
    # sets the limit, step 2's finds resident memory over it and trims
    short = [e.split(" in ")[0] for e in events]
    assert short == ["optimize", "optimized", "check", "optimize", "optimized", "check", "trim"], events
    assert not any("ludic-trainer" in e for e in events if " in " in e), events
    assert run.trainer._host_memory.releases == 1 and run.trainer._host_memory.limit is None


def test_the_off_switch_turns_the_trims_off(tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    events, run = _train(tiny_model_dir, monkeypatch, release_host_memory=False)
    assert len(run.history) == 2
    assert [e.split(" in ")[0] for e in events] == ["optimize", "optimized", "check"] * 2, events
    assert run.trainer._host_memory.releases == 0 and not run.trainer._host_memory.enabled


@pytest.mark.skipif(host_memory._glibc() is None, reason="malloc_trim is glibc's")
def test_the_limit_is_a_tenth_over_a_steps_end_and_bad_growth_is_refused() -> None:
    memory = host_memory.HostMemory(True)
    assert not memory.step_ended()  # the first step's end sets the limit
    assert memory.limit is not None
    assert abs(memory.limit - 1.1 * host_memory.resident_bytes()) < 0.02 * memory.limit
    for bad in (-0.1, float("nan"), "0.1", True, 10):
        with pytest.raises(ValueError, match="growth"):
            host_memory.HostMemory(True, growth=bad)  # type: ignore[arg-type]


ARENA_SCRIPT = r"""
import json, threading
import psutil, torch
from ludic_lab.training import host_memory

MB, proc, rss = 2**20, psutil.Process(), {}


def work():
    big = torch.ones(8 * MB, dtype=torch.uint8)  # mapped, and freed: glibc's threshold rises above 2 MiB
    del big
    rss["start"] = proc.memory_info().rss
    blocks = [torch.ones(2 * MB, dtype=torch.uint8) for _ in range(120)]  # 240 MB from this thread's arena
    rss["allocated"] = proc.memory_info().rss
    kept = blocks[1::2]  # every other block lives on: the freed ones cannot merge into the top
    del blocks
    rss["freed"] = proc.memory_info().rss
    host_memory.release_free_memory()
    rss["trimmed"] = proc.memory_info().rss
    rss["kept_intact"] = all(int(b[0]) == 1 and int(b[-1]) == 1 for b in kept)  # what lives is untouched


t = threading.Thread(target=work)
t.start()
t.join()
print(json.dumps(rss))
"""


def test_a_trim_hands_back_what_a_threads_arena_kept() -> None:
    """Tensors freed in a thread stay resident in its arena (glibc keeps them for reuse); the trim
    gives them back while the tensors still live stay. In a fresh process: a test worker's other
    threads (servers, clients of earlier tests) allocate and free beside the measured one."""
    pytest.importorskip("psutil")
    proc = subprocess.run([sys.executable, "-c", ARENA_SCRIPT], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rss = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rss.pop("kept_intact") is True
    table = {k: round(v / MB) for k, v in rss.items()}
    assert rss["allocated"] - rss["start"] > 150 * MB, table  # of 240 MB
    assert rss["allocated"] - rss["freed"] < 40 * MB, f"glibc kept the freed blocks resident before the trim: {table}"
    assert rss["freed"] - rss["trimmed"] > 90 * MB, f"the trim gave back the ~120 MB freed: {table}"


STEPS_SCRIPT = r"""
import json, threading
import torch
from ludic_lab.training.host_memory import HostMemory, resident_bytes

MB = 2**20
hm, out = HostMemory(True), []


def step(mb, keep_every=0):
    # a step: `mb` of 1 MiB tensors from this thread's arena, all freed at its end but every
    # `keep_every`-th (and the last: the freed ones stay holes, resident, not the arena's top)
    blocks = [torch.ones(MB, dtype=torch.uint8) for _ in range(mb)]
    kept = [b for i, b in enumerate(blocks) if keep_every and (i % keep_every == 0 or i == mb - 1)]
    peak = resident_bytes()
    del blocks
    trimmed = hm.step_ended()
    out.append({"peak": peak, "end": resident_bytes(), "trimmed": trimmed, "limit": hm.limit})
    return kept


def run():
    big = torch.ones(8 * MB, dtype=torch.uint8)  # mapped and freed: glibc's threshold rises above 1 MiB
    del big
    live = [step(200, keep_every=8)]  # the first step leaves a pool of ~175 MB free; the limit is set
    for _ in range(3):
        step(150)  # steps that reuse the pool: no growth, no trim
    limit = hm.limit
    grow = (limit - resident_bytes()) // MB + 400  # the ~175 MB pool is reused first, then the arena grows
    live.append(step(grow, keep_every=8))  # a step that allocates past the pool: over the limit
    step(150)  # the first step after the trim sets the limit again
    step(150)
    out.append({"first_limit": limit})


t = threading.Thread(target=run)
t.start()
t.join()
print(json.dumps(out))
"""


@pytest.mark.skipif(host_memory._glibc() is None, reason="malloc_trim is glibc's")
def test_steps_that_reuse_the_pool_never_trim_and_growth_past_the_limit_does() -> None:
    """Real glibc in a fresh process (this one's arenas hold what earlier tests freed): the limit is
    resident memory at the end of the first step, a tenth over; steps that reuse malloc's pool stay
    under it with no trim; a step that grows past it ends with a trim that brings resident memory
    back under the limit; the step after it sets the limit anew."""
    proc = subprocess.run([sys.executable, "-c", STEPS_SCRIPT], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    *steps, tail = json.loads(proc.stdout.strip().splitlines()[-1])
    table = [{k: (round(v / MB) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in s.items()}
             for s in steps]  # fmt: skip
    first, reuse, grown, after = steps[0], steps[1:4], steps[4], steps[5:]
    assert not first["trimmed"] and first["limit"] == tail["first_limit"], table
    assert first["end"] - first["peak"] < 20 * MB, f"the freed blocks stayed resident for reuse: {table}"
    assert not any(s["trimmed"] for s in reuse), f"a step that reuses the pool must not trim: {table}"
    assert all(s["end"] <= first["limit"] for s in reuse), table
    assert grown["peak"] > first["limit"] and grown["trimmed"], f"growth past the limit must trim: {table}"
    assert grown["end"] < first["limit"], f"the trim brings resident memory back under the limit: {table}"
    assert grown["peak"] - grown["end"] > 300 * MB, f"the trim gave back the step's freed blocks: {table}"
    assert not after[0]["trimmed"] and after[0]["limit"] is not None, f"the next step sets the limit: {table}"
    assert not after[1]["trimmed"], table
