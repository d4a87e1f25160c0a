"""Atomic checkpoints: model or adapter, optimizer, schedule, RNG states, step, policy version.

A checkpoint is a folder ``<root>/step-<N>`` written under a temporary name and renamed into
place only when complete, so a killed trainer never leaves a half-written checkpoint that
looks valid. ``<root>/latest`` names the newest one. Tensors are stored as safetensors /
``torch.save`` of plain tensor dicts (loaded with ``weights_only=True``); the rest is JSON.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ludic_lab.training.lora import load_trainable_state_dict, trainable_state_dict

_COMPLETE = "COMPLETE"


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    step: int
    policy_version: int


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states (JSON-ready except the torch tensor)."""
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    root: str | os.PathLike,
    *,
    model: Any,
    optimizer: Optional[torch.optim.Optimizer],
    scheduler: Optional[Any],
    step: int,
    policy_version: int,
    extra_state: Optional[dict[str, Any]] = None,
    config: Optional[dict[str, Any]] = None,
    keep: int = 0,
) -> CheckpointInfo:
    """Write ``<root>/step-<step>`` atomically and point ``<root>/latest`` at it.

    ``extra_state`` must be JSON-serialisable (e.g. a batch source's position). ``keep > 0``
    deletes older ``step-*`` folders beyond the newest ``keep``.
    """
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        sd = {k: v.detach().cpu().clone().contiguous() for k, v in trainable_state_dict(model).items()}
        save_file(sd, str(tmp / "model.safetensors"))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        rng = rng_state()
        torch.save({"torch": rng.pop("torch")}, tmp / "rng_torch.pt")
        state = {
            "step": int(step),
            "policy_version": int(policy_version),
            "rng": rng,
            "extra_state": extra_state or {},
            "config": config or {},
            "peft": bool(hasattr(model, "peft_config")),
        }
        (tmp / "trainer_state.json").write_text(json.dumps(state))
        (tmp / _COMPLETE).write_text("ok")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    latest_tmp = root / f".latest-{uuid.uuid4().hex[:8]}"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    if keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return CheckpointInfo(str(final), int(step), int(policy_version))


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / _COMPLETE).is_file())


def latest_checkpoint(root: str | os.PathLike) -> Optional[Path]:
    """The newest complete checkpoint under ``root`` (or ``root`` itself if it is one)."""
    root = Path(root)
    if (root / _COMPLETE).is_file():
        return root
    ptr = root / "latest"
    if ptr.is_file():
        p = root / ptr.read_text().strip()
        if (p / _COMPLETE).is_file():
            return p
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: Any,
    optimizer: Optional[torch.optim.Optimizer] = None,
    scheduler: Optional[Any] = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint folder (or the latest under a root) into the given objects.

    Returns the trainer state dict (step, policy_version, extra_state, config). Raises
    ``FileNotFoundError`` when there is no complete checkpoint there.
    """
    from safetensors.torch import load_file

    p = latest_checkpoint(path)
    if p is None:
        raise FileNotFoundError(f"no complete checkpoint at {path}")
    state = json.loads((p / "trainer_state.json").read_text())
    if state.get("peft") != bool(hasattr(model, "peft_config")):
        kind = "a LoRA adapter" if state.get("peft") else "full model weights"
        raise ValueError(f"checkpoint {p} holds {kind}; build the model the same way (lora_r) before loading")
    load_trainable_state_dict(model, load_file(str(p / "model.safetensors")))
    if optimizer is not None and (p / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(p / "optimizer.pt", weights_only=True))
    if scheduler is not None and (p / "scheduler.pt").is_file():
        scheduler.load_state_dict(torch.load(p / "scheduler.pt", weights_only=True))
    if restore_rng:
        rng = dict(state["rng"])
        rng["torch"] = torch.load(p / "rng_torch.pt", weights_only=True)["torch"]
        set_rng_state(rng)
    state["path"] = str(p)
    return state
