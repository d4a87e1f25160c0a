"""``lab.launch_torchrun``: a real ``torchrun --nproc_per_node=2`` launched as a subprocess —
per-rank logs, metrics tailed into a live callback, a crash on one rank reported with that
rank's traceback, ``stop()`` and the owner's ``kill -9`` leaving nothing running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ludic_lab.inference.launch import processes
from ludic_lab.lab.torchrun import TorchrunError, launch_torchrun

pytestmark = pytest.mark.distributed


def _script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def _procs_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains ``text`` (other than this one)."""
    out = []
    for pid in processes.all_pids():
        cmd = processes.cmdline(pid)
        if pid != os.getpid() and cmd and text in " ".join(cmd) and processes.is_alive(pid):
            out.append((pid, " ".join(cmd)))
    return out


def _wait_gone(text: str, timeout: float = 20.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = _procs_mentioning(text)
        if not left:
            return []
        time.sleep(0.2)
    return _procs_mentioning(text)


def test_logs_metrics_and_live_feed(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 99, "loss": 9.0}) + "\n")  # an earlier run's row: not this run's
    script = _script(
        tmp_path,
        "steps.py",
        """
        import json, os, sys, time
        rank = int(os.environ["RANK"])
        print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}", flush=True)
        print(f"warning on rank {rank}", file=sys.stderr, flush=True)
        for step in range(1, 4):
            if rank == 0:  # one writer
                with open(sys.argv[1], "a") as f:
                    f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
            time.sleep(0.2)
        print(f"rank {rank} done", flush=True)
        """,
    )
    seen: list[tuple[int, dict]] = []
    run = launch_torchrun(script, nproc=2, args=[metrics], metrics_path=metrics, live=lambda s, m: seen.append((s, m)),
                          log_dir=tmp_path / "logs")  # fmt: skip
    assert run.status == "running"
    assert run.wait(timeout=180) == 0 and run.status == "succeeded"
    assert [r["step"] for r in run.metrics()] == [1, 2, 3]
    assert [(s, m["loss"]) for s, m in seen] == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
    for r in (0, 1):
        t = run.tail(r)
        assert f"hello from rank {r} of 2" in t and f"warning on rank {r}" in t and f"rank {r} done" in t
        assert f"rank {1 - r} done" not in t
        files = run.rank_log_files()[r]
        assert f"rank {r} done" in files["stdout"].read_text() and "warning" in files["stderr"].read_text()
    html = run._repr_html_()
    assert "succeeded" in html and "rank 1" in html and "hello from rank 1 of 2" in html
    assert not any(p.name.startswith("torchrun-") for p in processes.records_dir().glob(f"*-{run.pid}-*.json"))
    assert _wait_gone(str(script), 10) == []


def test_crash_on_rank_1_names_the_rank_with_its_traceback_and_leaves_nothing(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "crash.py",
        """
        import os, time
        rank = int(os.environ["RANK"])
        def load_shard(r):
            raise ValueError(f"shard {r} is corrupt")
        if rank == 1:
            time.sleep(0.5)
            load_shard(rank)
        time.sleep(300)  # rank 0 would wait forever for its peer
        """,
    )
    t0 = time.monotonic()
    run = launch_torchrun(script, nproc=2, log_dir=tmp_path / "logs")
    with pytest.raises(TorchrunError) as e:
        run.wait(timeout=180)
    assert time.monotonic() - t0 < 120
    msg = str(e.value)
    assert e.value.rank == 1 and run.status == "failed" and run.returncode != 0
    assert "rank 1 failed (exit code 1)" in msg
    assert (
        "Traceback (most recent call last)" in msg
        and "in load_shard" in msg
        and "ValueError: shard 1 is corrupt" in msg
    )
    assert str(tmp_path / "logs") in msg
    assert run.error is e.value and "shard 1 is corrupt" in run._repr_html_()
    assert _wait_gone(str(script)) == []
    assert not any(processes.is_alive(p, s) for p, s in run._tree.items())


def test_stop_kills_ranks_and_their_children(tmp_path: Path) -> None:
    marker = f"ludic-grandchild-{os.getpid()}-{time.time_ns()}"
    script = _script(
        tmp_path,
        "forever.py",
        f"""
        import os, subprocess, sys, time
        rank = int(os.environ["RANK"])
        # a child in a session of its own, as a data loader or server might start
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"], start_new_session=True)
        print(f"rank {{rank}} up", flush=True)
        while True:
            time.sleep(1)
        """,
    )
    run = launch_torchrun(script, nproc=2, log_dir=tmp_path / "logs")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ("rank 0 up" in run.tail(0) and "rank 1 up" in run.tail(1)):
        time.sleep(0.2)
    assert "rank 1 up" in run.tail(1), run.tail(None)
    assert len(_procs_mentioning(marker)) == 2
    t0 = time.monotonic()
    run.stop(grace_s=5.0)
    assert time.monotonic() - t0 < 40
    assert run.status == "stopped" and run.done() and run.error is None
    run.wait(timeout=1)  # a stopped run is not a failure
    assert _procs_mentioning(str(script)) == [] and _procs_mentioning(marker) == []
    run.stop()  # idempotent


def test_kill_9_of_the_owner_leaves_nothing(tmp_path: Path) -> None:
    """A kernel killed with SIGKILL runs no exit handler: the watchdog ends the run."""
    script = _script(tmp_path, "sleeper.py", "import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    owner_code = textwrap.dedent(
        f"""
        import sys, time
        from ludic_lab.lab.torchrun import launch_torchrun
        run = launch_torchrun({str(script)!r}, nproc=2, log_dir={str(tmp_path / "logs")!r})
        while "up" not in run.tail(1):
            time.sleep(0.2)
        print("ready", run.pid, flush=True)
        time.sleep(600)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        assert line.startswith("ready"), line
        assert len(_procs_mentioning(str(script))) >= 3  # torchrun + 2 ranks
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert _wait_gone(str(script), 30) == []
    finally:
        if owner.poll() is None:
            owner.kill()


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no script at"):
        launch_torchrun(tmp_path / "missing.py")
    (tmp_path / "s.py").write_text("")
    with pytest.raises(ValueError, match="nproc must be an int >= 1"):
        launch_torchrun(tmp_path / "s.py", nproc=0)


@pytest.mark.notebook
def test_in_a_real_kernel_status_live_plot_and_crash_message(tmp_path: Path) -> None:
    """In a notebook: the status view updates in place to "succeeded", the metrics reach a
    LivePlot, and a crash on rank 1 fails the cell with that rank's traceback."""
    import nbformat
    from nbclient import NotebookClient

    _script(
        tmp_path,
        "ok.py",
        """
        import json, os, time
        if os.environ["RANK"] == "0":
            for step in (1, 2):
                with open("m.jsonl", "a") as f:
                    f.write(json.dumps({"step": step, "loss": 1.0 / step, "reward_mean": 0.25 * step}) + "\\n")
                time.sleep(0.3)
        print("rank", os.environ["RANK"], "finished", flush=True)
        """,
    )
    _script(
        tmp_path, "bad.py", "import os\nif os.environ['RANK'] == '1':\n    raise KeyError('no such column: reward')\n"
    )
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from ludic_lab import lab"),
        nbformat.v4.new_code_cell('run = lab.launch_torchrun("ok.py", nproc=2, metrics_path="m.jsonl")\nrun.wait(180)'),
        nbformat.v4.new_code_cell(
            "print(run.status, [r['step'] for r in run.metrics()], run._live.history[-1]['reward_mean'])"
        ),
        nbformat.v4.new_code_cell(
            'lab.launch_torchrun("bad.py", nproc=2).wait(180)', metadata={"tags": ["raises-exception"]}
        ),
    ]
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = [o for o in nb.cells[1].outputs if o.get("output_type") == "display_data"]
    htmls = [o["data"].get("text/html", "") for o in shown]
    assert any("succeeded" in h and "rank 1 finished" in h for h in htmls), htmls  # updated in place
    assert any("image/png" in o["data"] or "loss" in str(o["data"]) for o in shown)  # the live plot
    assert nb.cells[2].outputs[0]["text"].strip() == "succeeded [1, 2] 0.5"
    err = nb.cells[3].outputs[-1]
    assert err["ename"] == "TorchrunError"
    text = err["evalue"]
    assert "rank 1 failed (exit code 1)" in text and "KeyError: 'no such column: reward'" in text
