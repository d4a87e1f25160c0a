"""NCCL transport (GPU): the trainer broadcasts the tensors to every vLLM worker.

Group layout (vLLM's own convention): the trainer is rank 0, the server's workers are ranks
``1 .. world_size - 1``. Rendezvous is a ``StatelessProcessGroup`` on ``host:port`` (no
``torch.distributed`` default group involved). Where the installed vLLM ships its packed
broadcast (``vllm.distributed.weight_transfer.packed_tensor``), tensors travel packed into a
few large buffers; otherwise one broadcast per tensor. Both sides use the same mode: the
sender puts ``packed`` into ``/init_communicator``'s body and the workers follow it.

Order of an update: ``POST /validate_param_batch`` (so a refused update never leaves the
sender blocked in a broadcast nobody receives), then ``POST /update_param_batch`` and, while
it is pending, :meth:`NcclSender.send`. This needs CUDA and a vLLM install on the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ludic_lab.inference.vllm.weight_transfer.base import ParamMeta, param_metas, torch_dtype, update_body


def packed_nccl_available() -> bool:
    """Whether the installed vLLM has the packed NCCL broadcast helpers."""
    try:
        from vllm.distributed.weight_transfer import packed_tensor
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return hasattr(packed_tensor, "packed_nccl_broadcast_producer")


def _packed_geometry() -> tuple[int, int]:
    from vllm.distributed.weight_transfer.packed_tensor import (
        DEFAULT_PACKED_BUFFER_SIZE_BYTES,
        DEFAULT_PACKED_NUM_BUFFERS,
    )

    return int(DEFAULT_PACKED_BUFFER_SIZE_BYTES), int(DEFAULT_PACKED_NUM_BUFFERS)


def _join_group(host: str, port: int, rank: int, world_size: int, device: Any) -> Any:
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    pg = StatelessProcessGroup.create(host=host, port=int(port), rank=rank, world_size=int(world_size))
    return PyNcclCommunicator(pg, device=device)


class NcclSender:
    """Trainer side: rank 0 of the weight-update group, on the current CUDA device."""

    transport = "nccl"

    def __init__(self, host: str, port: int, world_size: int, *, packed: bool | None = None) -> None:
        if world_size < 2:
            raise ValueError(f"world_size={world_size}: it is 1 (the trainer) + the number of vLLM workers")
        self.host, self.port, self.world_size = host, int(port), int(world_size)
        self.packed = packed_nccl_available() if packed is None else bool(packed)
        self.comm: Any = None

    def init_body(self) -> dict[str, Any]:
        return {
            "transport": "nccl",
            "host": self.host,
            "port": self.port,
            "world_size": self.world_size,
            "packed": self.packed,
        }

    def connect(self) -> None:
        import torch

        self.comm = _join_group(self.host, self.port, 0, self.world_size, torch.cuda.current_device())

    def stage(self, params: Mapping[str, Any], *, version: int | None = None) -> dict[str, Any]:
        return update_body(param_metas(params), transport="nccl", version=version)

    def send(self, params: Mapping[str, Any]) -> None:
        """Broadcast ``params`` in order; call while ``/update_param_batch`` is pending."""
        import torch

        if self.comm is None:
            raise RuntimeError("NcclSender.send before connect(); POST /init_communicator and connect() first")
        stream = torch.cuda.current_stream()
        dev = self.comm.device  # tensors may live on the CPU or another device: moved here
        if self.packed:
            from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

            size, num = _packed_geometry()
            packed_nccl_broadcast_producer(
                iterator=iter(params.items()),
                group=self.comm,
                src=0,
                post_iter_func=lambda item: item[1].detach().to(dev).contiguous(),
                buffer_size_bytes=size,
                num_buffers=num,
            )
        else:
            for t in params.values():
                self.comm.broadcast(t.detach().to(dev).contiguous(), src=0, stream=stream)
        stream.synchronize()

    def discard(self, body: Mapping[str, Any]) -> None:
        """Nothing is staged outside the broadcast."""

    def release(self, body: Mapping[str, Any]) -> None:
        """Nothing is staged outside the broadcast."""

    def abandon(self, body: Mapping[str, Any]) -> None:
        """Nothing is staged outside the broadcast."""

    def close(self) -> None:
        if self.comm is not None:
            destroy = getattr(self.comm, "destroy", None)
            if callable(destroy):
                destroy()
            self.comm = None


class NcclReceiver:
    """Worker side: joins as rank ``1 + worker_rank`` and hands received tensors to ``load``."""

    def __init__(self, host: str, port: int, world_size: int, worker_rank: int, device: Any, *, packed: bool) -> None:
        self.packed = bool(packed)
        self.device = device
        self.comm = _join_group(host, port, 1 + int(worker_rank), world_size, device)

    def receive(self, metas: Sequence[ParamMeta], load: Callable[[Iterable[tuple[str, Any]]], Any]) -> int:
        """Receive every tensor of ``metas`` (in order), passing ``(name, tensor)`` batches to ``load``."""
        import torch

        if self.packed:
            from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_consumer

            size, num = _packed_geometry()
            packed_nccl_broadcast_consumer(
                iterator=((m.name, (list(m.shape), torch_dtype(m.dtype))) for m in metas),
                group=self.comm,
                src=0,
                post_unpack_func=load,
                buffer_size_bytes=size,
                num_buffers=num,
                device=self.device,
            )
        else:
            stream = torch.cuda.current_stream()
            for m in metas:
                t = torch.empty(m.shape, dtype=torch_dtype(m.dtype), device=self.device)
                self.comm.broadcast(t, src=0, stream=stream)
                load([(m.name, t)])
        return len(metas)

    def close(self) -> None:
        destroy = getattr(self.comm, "destroy", None)
        if callable(destroy):
            destroy()
        self.comm = None
