"""Checkpoints survive a kill at any instant of a save: a forked child saves and is killed
(``os._exit``, no cleanup) just before its k-th filesystem change (rename or delete), for
every k; loading afterwards must find a complete checkpoint of every step that existed."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import ludic_lab.training.checkpoint as ckpt_mod
from ludic_lab.training.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    recover_checkpoints,
    save_checkpoint,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _model(value: float) -> torch.nn.Linear:
    m = torch.nn.Linear(3, 2)
    with torch.no_grad():
        m.weight.fill_(value)
        m.bias.fill_(value)
    return m


def _save(root: Path, step: int, value: float, keep: int = 0) -> None:
    save_checkpoint(
        root, model=_model(value), optimizer=None, scheduler=None, step=step, policy_version=step, keep=keep
    )


def _killed_at(k: int, save: Callable[[], None]) -> bool:
    """Run ``save`` in a forked child killed before its k-th rename/delete; True if it was killed."""
    pid = os.fork()
    if pid == 0:  # child
        calls = {"n": 0}

        def fault(real: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(*a: Any, **kw: Any) -> Any:
                calls["n"] += 1
                if calls["n"] == k:
                    os._exit(17)  # a SIGKILL: no finally, no except, no cleanup
                return real(*a, **kw)

            return wrapped

        code = 0
        try:
            ckpt_mod.os.replace = fault(os.replace)  # type: ignore[attr-defined]
            ckpt_mod.shutil.rmtree = fault(shutil.rmtree)  # type: ignore[attr-defined]
            save()
        except BaseException:  # noqa: BLE001
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 17), f"the child's save failed (exit {code})"
    return code == 17


def _loaded_value(path: Path) -> tuple[float, int]:
    m = _model(0.0)
    state = load_checkpoint(path, model=m, restore_rng=False)
    assert torch.all(m.weight == m.weight.flatten()[0])  # one whole checkpoint, not a mix
    return float(m.weight.detach().flatten()[0]), state["step"]


@pytest.mark.parametrize("keep", [0, 1])
def test_resaving_a_step_survives_a_kill_at_any_point(tmp_path: Path, keep: int) -> None:
    k, killed = 0, True
    while killed:
        k += 1
        root = tmp_path / f"k{k}"
        _save(root, 5, 1.0, keep=keep)
        killed = _killed_at(k, lambda root=root: _save(root, 5, 2.0, keep=keep))
        value, step = _loaded_value(root)
        assert step == 5 and value in (1.0, 2.0), (k, value)
        if not killed:
            assert value == 2.0
        assert [p.name for p in list_checkpoints(root)] == ["step-00000005"]
        assert not [p.name for p in root.iterdir() if p.name.startswith((".old-", ".del-"))]
    assert k >= 3  # the save made at least a move aside, a rename in and a delete


def test_saving_a_new_step_with_pruning_survives_a_kill_at_any_point(tmp_path: Path) -> None:
    k, killed = 0, True
    while killed:
        k += 1
        root = tmp_path / f"k{k}"
        _save(root, 1, 1.0, keep=1)
        killed = _killed_at(k, lambda root=root: _save(root, 2, 2.0, keep=1))
        value, step = _loaded_value(root)
        assert (step, value) in ((1, 1.0), (2, 2.0)), (k, step, value)
        if not killed:
            assert [p.name for p in list_checkpoints(root)] == ["step-00000002"]
        for p in list_checkpoints(root):  # everything that looks complete loads
            _loaded_value(p)


def test_recovery_of_the_old_layout_leftover(tmp_path: Path) -> None:
    """What the previous save left after a kill between deleting step-N and renaming the new
    copy in: only a complete ``.tmp-step-N-*``. It is renamed into place on load."""
    _save(tmp_path, 3, 4.0)
    (tmp_path / "step-00000003").rename(tmp_path / ".tmp-step-00000003-dead1234")
    assert list_checkpoints(tmp_path) == []
    assert latest_checkpoint(tmp_path).name == "step-00000003"
    assert _loaded_value(tmp_path) == (4.0, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000003"]


def test_recovery_prefers_the_new_copy_and_ignores_incomplete_and_pruned_ones(tmp_path: Path) -> None:
    _save(tmp_path, 3, 1.0)
    _save(tmp_path / "b", 3, 2.0)
    (tmp_path / "step-00000003").rename(tmp_path / ".old-step-00000003-aaaa0000")
    (tmp_path / "b" / "step-00000003").rename(tmp_path / ".tmp-step-00000003-bbbb0000")
    (tmp_path / ".tmp-step-00000004-cccc0000").mkdir()  # a writer still filling it: left alone
    half = tmp_path / ".del-step-00000002-dddd0000"  # pruned, half deleted: never restored
    half.mkdir()
    (half / "COMPLETE").write_text("ok")
    assert recover_checkpoints(tmp_path) == [tmp_path / "step-00000003"]
    assert _loaded_value(tmp_path / "step-00000003") == (2.0, 3)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".tmp-step-00000004-cccc0000", "b", "latest", "step-00000003"]


def test_loading_a_checkpoint_folder_by_its_path_recovers_it(tmp_path: Path) -> None:
    _save(tmp_path, 7, 3.0)
    (tmp_path / "step-00000007").rename(tmp_path / ".old-step-00000007-eeee0000")
    assert _loaded_value(tmp_path / "step-00000007") == (3.0, 7)
