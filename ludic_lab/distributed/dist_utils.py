"""torch.distributed plumbing: start from the torchrun environment, small collectives.

Under ``torchrun`` every rank finds ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``
in its environment; :func:`init_distributed` turns that into a process group (gloo on CPU,
NCCL on GPU) with a timeout, so a collective that waits for a dead rank fails instead of
hanging forever. torchrun's agent also stops every other rank as soon as one exits non-zero.

The helpers below move a handful of numbers (step counts, loss sums) between ranks in
float64 tensors, and bytes (e.g. a JSON-encoded batch) without pickle.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch

DEFAULT_TIMEOUT_S = 600.0
"""Process-group timeout: the longest a collective waits for a rank that never arrives."""


def env_world_size() -> int:
    """``WORLD_SIZE`` from the environment (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def is_distributed() -> bool:
    """True when a process group with more than one rank is initialised."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    """This process's global rank (0 without a process group)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    """Number of ranks (1 without a process group)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """True on global rank 0 (and in a single process)."""
    return get_rank() == 0


def local_device(device: str | torch.device) -> torch.device:
    """The device this rank trains on: ``cuda`` / ``cuda:N`` becomes ``cuda:LOCAL_RANK`` under
    torchrun (one GPU per rank); anything else is returned unchanged."""
    dev = torch.device(device)
    if dev.type == "cuda" and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return dev


def init_distributed(device: str | torch.device = "cpu", *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Initialise the default process group from torchrun's environment (``env://``).

    gloo for a CPU ``device``, NCCL for CUDA (and the CUDA device set to ``LOCAL_RANK``).
    Returns True if this call created the group; False when there is nothing to do (already
    initialised, or ``WORLD_SIZE`` <= 1). Raises a clear error when torchrun's variables are missing.
    """
    import torch.distributed as dist

    if not dist.is_available():
        if env_world_size() > 1:
            raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
        return False
    if dist.is_initialized() or env_world_size() <= 1:
        return False
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={env_world_size()} but {missing} are not set: launch with "
            "`torchrun --nproc_per_node=N script.py` (or set them as torchrun does)"
        )
    dev = local_device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        backend = "nccl"
    else:
        backend = "gloo"
    kw: dict[str, Any] = {"device_id": dev} if dev.type == "cuda" else {}
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=float(timeout_s)), **kw)
    return True


def destroy_distributed() -> None:
    """Destroy the default process group if there is one (safe to call twice)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    import torch.distributed as dist

    if is_distributed():
        dist.barrier()


def _collective_device() -> torch.device:
    """Where small collective tensors live: the current CUDA device under NCCL, else CPU."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_floats(values: Sequence[float], op: str = "sum") -> list[float]:
    """Element-wise ``sum`` / ``max`` / ``min`` of ``values`` over ranks (float64; identity
    in a single process). Every rank must call it with the same number of values."""
    if not is_distributed():
        return [float(v) for v in values]
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops:
        raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=ops[op])
    return t.cpu().tolist()


def all_gather_bytes(data: bytes) -> list[bytes]:
    """Every rank's ``data``, in rank order (``[data]`` in a single process). No pickle."""
    if not is_distributed():
        return [data]
    import torch.distributed as dist

    dev = _collective_device()
    world = dist.get_world_size()
    n = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    longest = max(int(s) for s in sizes)
    buf = torch.zeros(max(longest, 1), dtype=torch.uint8, device=dev)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    out = [torch.zeros_like(buf) for _ in range(world)]
    dist.all_gather(out, buf)
    return [bytes(o[: int(s)].cpu().numpy().tobytes()) for o, s in zip(out, sizes, strict=True)]


def broadcast_bytes(data: bytes | None, src: int = 0) -> bytes:
    """``data`` from rank ``src`` on every rank (others pass ``None``). No pickle."""
    if not is_distributed():
        if data is None:
            raise ValueError("broadcast_bytes in a single process needs the data")
        return data
    import torch.distributed as dist

    dev = _collective_device()
    mine = dist.get_rank() == src
    if mine and data is None:
        raise ValueError(f"rank {src} is the broadcast source and must pass the data")
    n = torch.tensor([len(data) if mine else 0], dtype=torch.int64, device=dev)  # type: ignore[arg-type]  # data is set on the source rank
    dist.broadcast(n, src=src)
    buf = torch.zeros(max(int(n), 1), dtype=torch.uint8, device=dev)
    if mine and data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    dist.broadcast(buf, src=src)
    return bytes(buf[: int(n)].cpu().numpy().tobytes())


def all_reduce_dict(values: Mapping[str, float]) -> dict[str, float]:
    """Sum of named numbers over ranks; a name missing on a rank counts 0 there (the key
    sets are exchanged first, as JSON). Identity in a single process."""
    if not is_distributed():
        return {k: float(v) for k, v in values.items()}
    names: set[str] = set()
    for raw in all_gather_bytes(json.dumps(sorted(values)).encode()):
        names.update(json.loads(raw.decode()))
    keys = sorted(names)
    summed = all_reduce_floats([float(values.get(k, 0.0)) for k in keys], "sum")
    return dict(zip(keys, summed, strict=True))


def split_balanced(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Deal indices ``0..len(sizes)-1`` to ``world_size`` shares with about equal total size.

    Largest first, each to the share with the least total so far (ties: lowest share);
    each share lists its indices in increasing order. Deterministic: every rank computes the
    same split from the same sizes.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    shares: list[list[int]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world_size), key=lambda r: (totals[r], r))
        shares[r].append(i)
        totals[r] += int(sizes[i])
    return [sorted(s) for s in shares]
