"""What every weight transport shares: parameter metadata, dtype names, the sender interface.

A weight update has two planes. The *control plane* is one HTTP call,
``POST /update_param_batch``, whose body lists every parameter (name, dtype, shape) and says
which transport carries the bytes. The *data plane* is the transport: a safetensors file in
shared memory (:mod:`.shm`, same host, CPU or GPU) or an NCCL broadcast (:mod:`.nccl`, GPU).
A :class:`WeightSender` is the trainer side of one transport; the server side lives in the
vLLM worker extension (:mod:`ludic_lab.inference.vllm.server.worker`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

# dtype names used on the wire (torch attribute names) <-> safetensors header codes
_SAFETENSORS_CODES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
WIRE_DTYPES = frozenset(_SAFETENSORS_CODES.values())
"""Every dtype name a parameter may declare (``"float32"``, ``"bfloat16"``, ...)."""
ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "int16": 2}
ITEMSIZE.update({"int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1})
"""Bytes per element of each wire dtype."""


def dtype_name(dtype: Any) -> str:
    """Wire name of a dtype: ``torch.bfloat16`` / ``"torch.bfloat16"`` / ``"bfloat16"`` -> ``"bfloat16"``."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name in _SAFETENSORS_CODES:  # a safetensors code such as "BF16"
        name = _SAFETENSORS_CODES[name]
    return name


def torch_dtype(name: str) -> Any:
    """The ``torch.dtype`` for a wire name; ``ValueError`` for an unknown one."""
    import torch

    key = dtype_name(name)
    if key not in WIRE_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(WIRE_DTYPES)}")
    return getattr(torch, key)


@dataclass(frozen=True)
class ParamMeta:
    """One parameter of an update, as the control plane describes it."""

    name: str
    """Checkpoint (Hugging Face state-dict) name, e.g. ``model.layers.0.self_attn.q_proj.weight``."""
    dtype: str
    """Wire dtype name, e.g. ``"float32"``; the tensor travels in exactly this dtype."""
    shape: tuple[int, ...]
    """Full (unsharded) shape."""

    @property
    def nbytes(self) -> int:
        """Size of the tensor's bytes; ``ValueError`` for a dtype not in :data:`ITEMSIZE`."""
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"param {self.name!r}: unknown dtype {self.dtype!r}")
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * ITEMSIZE[self.dtype]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, obj: Any) -> ParamMeta:
        """Parse one ``params`` entry of a request body; ``ValueError`` says what is malformed."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"each params entry must be an object with name/dtype/shape, got {obj!r}")
        name, dtype, shape = obj.get("name"), obj.get("dtype"), obj.get("shape")
        if not isinstance(name, str) or not name:
            raise ValueError(f"params entry without a string 'name': {dict(obj)!r}")
        if not isinstance(dtype, str):
            raise ValueError(f"param {name!r}: 'dtype' must be a string such as 'float32', got {dtype!r}")
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"param {name!r}: 'shape' must be a list of non-negative ints, got {shape!r}")
        return cls(name, dtype_name(dtype), tuple(int(d) for d in shape))


def param_metas(params: Mapping[str, Any]) -> list[ParamMeta]:
    """Metadata of a state dict, in its iteration order (the order the bytes travel in)."""
    return [ParamMeta(k, dtype_name(v.dtype), tuple(int(d) for d in v.shape)) for k, v in params.items()]


def update_body(
    metas: Sequence[ParamMeta], *, transport: str, version: int | None = None, **extra: Any
) -> dict[str, Any]:
    """JSON body of ``POST /update_param_batch`` (``extra`` holds transport fields such as ``location``)."""
    return {"version": version, "transport": transport, "params": [m.to_json() for m in metas], **extra}


@runtime_checkable
class WeightSender(Protocol):
    """Trainer side of one transport. A client drives an update like this::

        body = sender.stage(params, version=v)        # shm: writes the file; nccl: metadata only
        start POST /update_param_batch with body       # the server loads (shm) or receives (nccl)
        sender.send(params)                            # nccl: broadcast while the POST is pending
        wait for the POST, then exactly one of:
            sender.release(body)   # the server answered (applied or refused)
            sender.abandon(body)   # no answer, the server may still read the staged bytes
            sender.discard(body)   # the request surely never arrived (shm: a one-shot file is removed)

    ``init_body()`` is the body of ``POST /init_communicator`` and ``connect()`` joins the
    transport's group; for NCCL both must run concurrently (the rendezvous needs both sides).
    """

    transport: str

    def init_body(self) -> dict[str, Any]: ...

    def connect(self) -> None: ...

    def stage(self, params: Mapping[str, Any], *, version: int | None = None) -> dict[str, Any]: ...

    def send(self, params: Mapping[str, Any]) -> None: ...

    def release(self, body: Mapping[str, Any]) -> None: ...

    def abandon(self, body: Mapping[str, Any]) -> None: ...

    def discard(self, body: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...
