"""What ``save_policy`` leaves and what it may delete (issue 47), on the tiny model.

A save killed with SIGKILL while it writes leaves its hidden full copy (``.policy.tmp-*``);
the next save into that folder removes it, as it removes copies of other dead processes, and
puts back a policy that a save killed between its two renames had moved aside; copies of live
processes or of other hosts stay. ``overwrite=True`` replaces a saved policy's own files and
refuses a folder that also holds the user's files or another saved policy, naming them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from trainer_helpers import load_model

from ludic_lab.saving import save_policy
from ludic_lab.saving.policy import MARKER, remove_stale_copies

pytestmark = pytest.mark.timeout(240)

# a save in a child process that stops (and waits to be killed) once the merged weights are written
_KILLED_MID_SAVE = textwrap.dedent(
    """
    import sys, time
    from transformers import AutoModelForCausalLM
    import ludic_lab.saving.policy as policy

    write = policy._write_merged

    def write_then_wait(*args, **kwargs):
        write(*args, **kwargs)
        print("weights written", flush=True)
        time.sleep(600)

    policy._write_merged = write_then_wait
    policy.save_policy(AutoModelForCausalLM.from_pretrained(sys.argv[1]), sys.argv[2])
    """
)


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_save_killed_mid_write_leaves_a_copy_the_next_save_removes(tiny_model_dir: str, tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_SAVE, tiny_model_dir, str(tmp_path / "policy")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "weights written"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    (left,) = _hidden(tmp_path)
    assert left.startswith(".policy.tmp-") and f"-{child.pid}-" in left
    assert (tmp_path / left / "model.safetensors").stat().st_size > 0 and not (tmp_path / "policy").exists()

    # a live process's copy and another host's stay; the dead process's copy goes
    alive, elsewhere = tmp_path / f".policy.tmp-{os.getpid()}-7", tmp_path / ".other.tmp-otherhost-12-7"
    for d in (alive, elsewhere):
        d.mkdir()
    model = load_model(tiny_model_dir)
    saved = save_policy(model, tmp_path / "step_2")  # another folder in the same parent
    assert _hidden(tmp_path) == sorted([alive.name, elsewhere.name])
    assert (saved.path / "model.safetensors").is_file() and not (tmp_path / "policy").exists()


def test_a_policy_moved_aside_by_a_killed_save_is_put_back(tiny_model_dir: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = load_model(tiny_model_dir)
    save_policy(model, tmp_path / "policy")
    earlier = load_file(str(tmp_path / "policy" / "model.safetensors"))["model.norm.weight"]
    # killed between the swap's two renames: the earlier policy aside, the new copy complete beside it
    pid = _dead_pid()
    aside, new = tmp_path / f".policy.old-{pid}-1", tmp_path / f".policy.tmp-{pid}-2"
    os.rename(tmp_path / "policy", aside)
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    save_policy(model, tmp_path / "elsewhere" / "p")  # (a save into tmp_path would clean up already)
    os.rename(tmp_path / "elsewhere" / "p", new)
    assert remove_stale_copies(tmp_path) == [aside, new]
    assert _hidden(tmp_path) == [] and (tmp_path / "policy" / MARKER).is_file()
    assert torch.equal(load_file(str(tmp_path / "policy" / "model.safetensors"))["model.norm.weight"], earlier)


def test_overwrite_refuses_a_folder_holding_other_files_or_another_saved_policy(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    model = load_model(tiny_model_dir)
    dest = tmp_path / "policy"
    save_policy(model, dest)
    files = json.loads((dest / MARKER).read_text())["files"]
    assert "model.safetensors" in files and "config.json" in files and MARKER not in files
    save_policy(model, dest, overwrite=True)  # its own files only: replaced

    (dest / "notes.txt").write_text("mine")
    (dest / "evals").mkdir()
    (dest / "evals" / "results.json").write_text("{}")
    save_policy(model, dest / "best")  # another saved policy inside
    with pytest.raises(FileExistsError) as e:
        save_policy(model, dest, overwrite=True)
    assert str(e.value) == (
        f"{dest} holds a saved policy and also best/ (a saved policy), evals/, notes.txt, which save_policy did not "
        "write there: overwrite=True replaces only a saved policy's own files and would delete these; move them "
        "out, or pass another path"
    )
    assert (dest / "notes.txt").read_text() == "mine" and (dest / "best" / MARKER).is_file()

    # a folder saved before the marker listed its files: judged by what a save writes
    old = tmp_path / "old"
    save_policy(model, old)
    info = json.loads((old / MARKER).read_text())
    del info["files"]
    (old / MARKER).write_text(json.dumps(info))
    save_policy(model, old, overwrite=True)
    (old / "mine.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"also mine.txt, which save_policy did not write"):
        save_policy(model, old, overwrite=True)
