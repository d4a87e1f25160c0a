"""Atomic checkpoints: model or adapter, optimizer, schedule, RNG states, step, policy version.

A checkpoint is a folder ``<root>/step-<N>`` written under a temporary name and renamed into
place only when complete, so a killed trainer never leaves a half-written checkpoint that
looks valid. ``<root>/latest`` names the newest one. Every change is a rename, so a kill at
any instant leaves a complete copy of every checkpoint: re-saving a step moves the old
folder aside (``.old-step-<N>-*``) before the new one is renamed in, and pruning moves a
folder aside (``.del-step-<N>-*``) before deleting it. :func:`recover_checkpoints` (run by
:func:`latest_checkpoint` and :func:`load_checkpoint`) puts a complete copy back where a
kill left ``step-<N>`` missing and removes leftovers. Tensors are stored as safetensors /
``torch.save`` of plain tensor dicts (loaded with ``weights_only=True``); the rest is JSON.

Under FSDP2 (``sharded_root`` given) every rank takes part in gathering the full weights and
optimizer state onto rank 0, rank 0 alone writes the very same files a single process would
(the optimizer state keyed by parameter name instead of index), and loading scatters them
back into the shards. So a checkpoint moves freely between one process and N ranks.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ludic_lab.distributed.dist_utils import barrier, get_rank
from ludic_lab.training.lora import (
    load_trainable_state_dict,
    trainable_from_full_state_dict,
    trainable_state_dict,
    trainable_to_model_names,
)

_COMPLETE = "COMPLETE"


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    step: int
    policy_version: int


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states (JSON-ready except the torch tensors). ``"cuda"``:
    the current GPU's generator, when CUDA is in use (dropout on a GPU draws from it; only
    the current device, so that rank 0 creates no context on its neighbours' GPUs)."""
    py = random.getstate()
    np_state: Any = np.random.get_state()  # the legacy tuple (numpy types it as tuple | dict)
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`. The CUDA state goes to the current GPU when there is
    one (a checkpoint written on a GPU loads on a CPU too)."""
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(
    root: str | os.PathLike,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    step: int,
    policy_version: int,
    extra_state: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    keep: int = 0,
    sharded_root: Any = None,
) -> CheckpointInfo:
    """Write ``<root>/step-<step>`` atomically and point ``<root>/latest`` at it.

    ``extra_state`` must be JSON-serialisable (e.g. a batch source's position). ``keep > 0``
    deletes older ``step-*`` folders beyond the newest ``keep``. With ``sharded_root`` (the
    FSDP2 root of ``model``) every rank must call this; rank 0 writes, all return the same info.
    """
    if sharded_root is not None:
        from ludic_lab.distributed.fsdp import gather_full_optimizer_state, gather_full_state_dict

        full = gather_full_state_dict(sharded_root)
        osd = gather_full_optimizer_state(sharded_root, optimizer) if optimizer is not None else None
        info = CheckpointInfo(str(Path(root) / f"step-{step:08d}"), int(step), int(policy_version))
        if get_rank() == 0:
            info = _write_checkpoint(
                root,
                model,
                trainable_from_full_state_dict(model, full),
                osd,
                scheduler,
                step,
                policy_version,
                extra_state,
                config,
                keep,
            )
        barrier()  # nobody reads the checkpoint before it is complete
        return info
    model_sd = trainable_state_dict(model)
    return _write_checkpoint(
        root,
        model,
        model_sd,
        optimizer.state_dict() if optimizer is not None else None,
        scheduler,
        step,
        policy_version,
        extra_state,
        config,
        keep,
    )


def _write_checkpoint(
    root: str | os.PathLike,
    model: Any,
    model_sd: dict[str, torch.Tensor],
    optimizer_sd: dict[str, Any] | None,
    scheduler: Any | None,
    step: int,
    policy_version: int,
    extra_state: dict[str, Any] | None,
    config: dict[str, Any] | None,
    keep: int,
) -> CheckpointInfo:
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        sd = {k: v.detach().cpu().clone().contiguous() for k, v in model_sd.items()}
        save_file(sd, str(tmp / "model.safetensors"))
        if optimizer_sd is not None:
            torch.save(optimizer_sd, tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        rng = rng_state()
        torch.save({k: rng.pop(k) for k in ("torch", "cuda") if k in rng}, tmp / "rng_torch.pt")
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # a re-save of an existing step: the old folder is renamed aside, never deleted first,
    # so a kill between the two renames leaves two complete copies (recover_checkpoints)
    aside = _move_aside(final) if final.exists() else None
    os.replace(tmp, final)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    latest_tmp = root / f".latest-{uuid.uuid4().hex[:8]}"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    if keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(_move_aside(old, ".del-"), ignore_errors=True)  # never a half-deleted step-*
    return CheckpointInfo(str(final), int(step), int(policy_version))


def _move_aside(folder: Path, prefix: str = ".old-") -> Path:
    """Rename ``folder`` to ``<prefix><name>-<id>`` next to it (atomic) and return the new path."""
    aside = folder.parent / f"{prefix}{folder.name}-{uuid.uuid4().hex[:8]}"
    os.replace(folder, aside)
    return aside


def _stray_step(name: str) -> str | None:
    """``step-<N>`` of a ``.tmp-``/``.old-``/``.del-step-<N>-<id>`` folder name, else None."""
    for prefix in (".tmp-", ".old-", ".del-"):
        if name.startswith(prefix + "step-"):
            return name[len(prefix) :].rsplit("-", 1)[0]
    return None


def recover_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Repair what a trainer killed mid-save left under ``root``; returns the recovered folders.

    Where ``step-<N>`` is missing but a complete copy of it exists, the copy is renamed into
    place: the new one (``.tmp-step-<N>-*``) if complete, else the old one (``.old-step-<N>-*``).
    ``.old-*`` leftovers of steps that are in place, and ``.del-*`` folders (pruned, maybe
    half deleted: never restored), are deleted. Incomplete ``.tmp-*``
    folders are left alone (a writer may still be filling them). Best effort: an
    unwritable ``root`` is left as it is.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    stray: dict[str, list[Path]] = {}
    for p in root.iterdir():
        step = _stray_step(p.name)
        if step is not None and p.is_dir():
            stray.setdefault(step, []).append(p)
    recovered: list[Path] = []
    for step, copies in sorted(stray.items()):
        final = root / step
        try:
            if not (final / _COMPLETE).is_file():
                complete = [c for c in copies if not c.name.startswith(".del-") and (c / _COMPLETE).is_file()]
                # the newer copy (.tmp-) first; among equals, the latest written
                complete.sort(key=lambda c: (c.name.startswith(".tmp-"), (c / _COMPLETE).stat().st_mtime))
                if complete:
                    if final.exists():  # an incomplete folder under the final name (never written by us)
                        _move_aside(final)
                    os.replace(complete[-1], final)
                    recovered.append(final)
            for c in copies:
                if c.exists() and c.name.startswith((".old-", ".del-")):
                    shutil.rmtree(c, ignore_errors=True)
        except OSError:  # read-only or racing another process: leave it
            continue
    return recovered


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / _COMPLETE).is_file())


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under ``root`` (or ``root`` itself if it is one),
    after :func:`recover_checkpoints` repaired an interrupted save."""
    root = Path(root)
    if (root / _COMPLETE).is_file():
        return root
    if root.name.startswith("step-") and not root.exists():  # a checkpoint folder a kill moved aside
        recover_checkpoints(root.parent)
        return root if (root / _COMPLETE).is_file() else None
    recover_checkpoints(root)
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
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
    sharded_root: Any = None,
) -> dict[str, Any]:
    """Load a checkpoint folder (or the latest under a root) into the given objects.

    Returns the trainer state dict (step, policy_version, extra_state, config). Raises
    ``FileNotFoundError`` when there is no complete checkpoint there. With ``sharded_root``
    (the FSDP2 root of ``model``) every rank calls this and reads the files itself (they must
    see the same folder), keeping its own shards of the weights and optimizer state.
    """
    from safetensors.torch import load_file

    p = latest_checkpoint(path)
    if p is None:
        raise FileNotFoundError(f"no complete checkpoint at {path}")
    state = json.loads((p / "trainer_state.json").read_text())
    if state.get("peft") != bool(hasattr(model, "peft_config")):
        kind = "a LoRA adapter" if state.get("peft") else "full model weights"
        raise ValueError(f"checkpoint {p} holds {kind}; build the model the same way (lora_r) before loading")
    model_sd = load_file(str(p / "model.safetensors"))
    if sharded_root is not None:
        _load_sharded_model(sharded_root, model, model_sd)
    else:
        load_trainable_state_dict(model, model_sd)
    if optimizer is not None and (p / "optimizer.pt").is_file():
        # map_location: a checkpoint written on a GPU holds CUDA tensors; the optimizer moves
        # its state to its parameters' device when loading
        osd = torch.load(p / "optimizer.pt", weights_only=True, map_location="cpu")
        _load_optimizer(model, optimizer, osd, sharded_root)
    if scheduler is not None and (p / "scheduler.pt").is_file():
        scheduler.load_state_dict(torch.load(p / "scheduler.pt", weights_only=True, map_location="cpu"))
    if restore_rng:
        rng = dict(state["rng"])
        rng.update(torch.load(p / "rng_torch.pt", weights_only=True, map_location="cpu"))
        set_rng_state(rng)
    state["path"] = str(p)
    return state


def _load_sharded_model(root: Any, model: Any, sd: dict[str, torch.Tensor]) -> None:
    """:func:`load_trainable_state_dict` for an FSDP2-sharded model (same checks)."""
    from ludic_lab.distributed.fsdp import load_full_state_dict

    missing, unexpected = load_full_state_dict(root, trainable_to_model_names(model, sd), strict=False)
    if unexpected:
        raise KeyError(f"checkpoint has weights the model lacks: {unexpected[:5]}")
    if not hasattr(model, "peft_config"):
        real_missing = [k for k in missing if not k.endswith("lm_head.weight")]
        if real_missing:
            raise KeyError(f"checkpoint lacks weights: {real_missing[:5]}")


def _name_keyed(osd: dict[str, Any]) -> bool:
    """True for an optimizer state keyed by parameter name (written under FSDP2)."""
    groups = osd.get("param_groups") or [{}]
    params = groups[0].get("params", [])
    return bool(params) and isinstance(params[0], str)


def _by_name(osd: dict[str, Any], model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An index-keyed optimizer state (``optimizer.state_dict()``) keyed by parameter name:
    index ``i`` is the ``i``-th parameter of ``optimizer.param_groups``, as torch numbers them."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    state = {order[int(i)]: v for i, v in osd.get("state", {}).items()}
    groups = [{**g, "params": [order[int(i)] for i in g["params"]]} for g in osd.get("param_groups", [])]
    return {"state": state, "param_groups": groups}


def _load_optimizer(model: Any, optimizer: torch.optim.Optimizer, osd: dict[str, Any], sharded_root: Any) -> None:
    """Load an index- or name-keyed optimizer state into a plain or sharded model's optimizer."""
    if sharded_root is not None:
        from ludic_lab.distributed.fsdp import load_full_optimizer_state

        load_full_optimizer_state(sharded_root, optimizer, osd if _name_keyed(osd) else _by_name(osd, model, optimizer))
    elif _name_keyed(osd):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(osd)
