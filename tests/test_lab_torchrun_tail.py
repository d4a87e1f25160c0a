"""The torchrun view's log tail as a terminal shows it: a tqdm bar (``\\r`` updates) is one line in
its latest state, with no blank lines where torchrun's tee turned its carriage returns into line
ends, no other rank's header inside a line, and a nested bar (tqdm's cursor-up moves) shown as a
terminal shows it. The pure readers on the text torchrun writes, then a
real ``torchrun --nproc-per-node=2`` whose ranks draw real tqdm bars, watched while they run."""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path

import pytest

from ludic_lab.lab.torchrun_logs import overwritten_states, rank_lines, screen_line, traceback_tail

# what torchrun 2.x tees for one rank running a 3-step tqdm bar around two prints: a bar state read
# before its "\r" came ends at the next header (torchrun wrote both reads on one line), the "\r"
# itself is teed as an empty line, and the other tee thread's (stdout's) line lands in between
RANK0_STDERR = "\rsteps:   0%|     | 0/3\rsteps:  33%|#    | 1/3\rsteps:  67%|###  | 2/3\rsteps: 100%|#####| 3/3\rsteps: 100%|#####| 3/3\n"
CONSOLE = (
    "[default0]:starting\n[default0]:\n[default0]:steps:   0%|     | 0/3[default0]:\n"
    "[default0]:steps:  33%|#    | 1/3[default1]:rank 1 says hi\n[default0]:\n"
    "[default0]:steps:  67%|###  | 2/3[default0]:done\n[default0]:\n"
    "[default0]:steps: 100%|#####| 3/3\n[default0]:steps: 100%|#####| 3/3\n"
    "I1206 torchrun's own line\n"
)  # fmt: skip


def test_a_line_shows_its_last_carriage_return_state() -> None:
    assert screen_line("\rsteps: 10%\rsteps: 20%  ") == "steps: 20%"
    assert screen_line("plain text") == "plain text" and screen_line("\r") == "" and screen_line("   ") == ""
    assert screen_line("\rsteps: 30%\r   \r") == "steps: 30%"  # blank states (a cleared line) do not count
    assert overwritten_states(RANK0_STDERR) == {"steps:   0%|     | 0/3", "steps:  33%|#    | 1/3",
                                                "steps:  67%|###  | 2/3"}  # fmt: skip
    assert overwritten_states("a\nb\n") == set()  # no "\r": nothing overwritten


def test_the_tail_has_the_bars_last_state_and_no_blank_lines() -> None:
    tail = rank_lines(CONSOLE, 0, 8, overwritten_states(RANK0_STDERR))
    assert tail.splitlines() == ["starting", "done", "steps: 100%|#####| 3/3"]
    assert rank_lines(CONSOLE, 1, 8) == "rank 1 says hi"  # cut from rank 0's line, not lost
    assert rank_lines(CONSOLE, None, 8) == "I1206 torchrun's own line"
    assert rank_lines(CONSOLE, 0, 2, overwritten_states(RANK0_STDERR)).splitlines() == [
        "done",
        "steps: 100%|#####| 3/3",
    ]
    # mid-run: the rank's file is ahead of what torchrun teed; the latest teed state still shows
    running = CONSOLE.split("[default0]:done")[0]
    assert rank_lines(running, 0, 8, overwritten_states(RANK0_STDERR)).splitlines() == [
        "starting", "steps:  67%|###  | 2/3"]  # fmt: skip
    # a literal "\r" in a teed line (a tee that keeps them) shows the last state too
    assert rank_lines("[default0]:\rsteps: 5%\rsteps: 9%\n[default0]:x[1]: y\n", 0, 8) == "steps: 9%\nx[1]: y"


def test_a_traceback_after_a_bar_shows_the_bars_last_state() -> None:
    stderr = RANK0_STDERR.replace("\rsteps: 100%|#####| 3/3\n", "\n") + (
        'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n'
    )
    assert traceback_tail(stderr).splitlines()[0] == "Traceback (most recent call last):"
    assert traceback_tail(RANK0_STDERR + "plain\n").splitlines() == ["steps: 100%|#####| 3/3", "plain"]


BARS = """
import os, sys, time
from tqdm import tqdm
rank = int(os.environ["RANK"])
print(f"start rank {rank}", flush=True)
for _ in tqdm(range(8), desc=f"bar{rank}", mininterval=0):
    for _ in tqdm(range(2), desc=f"inner{rank}", position=1, leave=False, mininterval=0):  # a nested bar
        time.sleep(0.15)
print(f"rank {rank} done", flush=True)
"""


@pytest.mark.distributed
def test_a_real_torchrun_with_tqdm_bars_tails_one_line_per_bar(tmp_path: Path) -> None:
    from ludic_lab.lab.torchrun import launch_torchrun

    script = tmp_path / "bars.py"
    script.write_text(textwrap.dedent(BARS))
    run = launch_torchrun(script, nproc=2, live=False, log_dir=tmp_path / "logs")
    snapshots: dict[int, list[str]] = {0: [], 1: []}
    deadline = time.monotonic() + 180
    while not run.done() and time.monotonic() < deadline:
        for r in (0, 1):
            snapshots[r].append(run.tail(r, 8))
        time.sleep(0.1)
    assert run.wait(timeout=60) == 0
    raw = (tmp_path / "logs" / "torchrun.log").read_text()
    assert re.search(r"\[default\d\]:\n", raw), "torchrun no longer tees a bar's \\r as an empty line"
    for r in (0, 1):
        mid = [s for s in snapshots[r] if re.search(rf"bar{r}: +\d+%", s) and "done" not in s]
        assert mid, snapshots[r][-5:]  # the bar was seen while it ran
        for snap in [*snapshots[r], run.tail(r, 8)]:
            lines = snap.splitlines()
            assert all(ln.strip() for ln in lines), snap  # no blank lines
            assert "[default" not in snap and f"bar{1 - r}" not in snap, snap  # no other header, no other rank
            assert sum(f"bar{r}:" in ln for ln in lines) <= 1, snap  # one line per bar
            assert sum(f"inner{r}:" in ln for ln in lines) <= 1 and "\x1b" not in snap, snap  # no cursor moves
        assert any(f"inner{r}:" in s for s in snapshots[r]), snapshots[r][-5:]  # the nested bar was seen
        final = run.tail(r, 8).splitlines()
        assert f"start rank {r}" in final and f"rank {r} done" in final, final
        assert not any(f"inner{r}:" in ln for ln in final), final  # cleared at its end (leave=False), as on a terminal
        (bar,) = [ln for ln in final if f"bar{r}:" in ln]
        assert bar.startswith(f"bar{r}: 100%") and "8/8" in bar, final
