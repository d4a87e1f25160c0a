"""Weight transports between a trainer and the bundled vLLM server.

- :class:`ShmSender` — same host: a safetensors file in ``/dev/shm`` (CPU and GPU; what the
  tests exercise).
- :class:`NcclSender` — GPU: an NCCL broadcast to every vLLM worker (vLLM's packed
  broadcast when the installed vLLM has it).

Both implement :class:`WeightSender`; :class:`ModelParamSpec` is the server's check of an
update against the served model. Importing this package does not import torch or vLLM.
"""

from ludic_lab.inference.vllm.weight_transfer.base import (
    WIRE_DTYPES,
    ParamMeta,
    WeightSender,
    dtype_name,
    param_metas,
    torch_dtype,
    update_body,
)
from ludic_lab.inference.vllm.weight_transfer.nccl import NcclReceiver, NcclSender, packed_nccl_available
from ludic_lab.inference.vllm.weight_transfer.shm import (
    ShmSender,
    default_shm_dir,
    iter_safetensors,
    read_safetensors_header,
    write_safetensors,
)
from ludic_lab.inference.vllm.weight_transfer.spec import ModelParamSpec, UpdateRejected

__all__ = [
    "WIRE_DTYPES",
    "ParamMeta",
    "WeightSender",
    "dtype_name",
    "param_metas",
    "torch_dtype",
    "update_body",
    "ShmSender",
    "default_shm_dir",
    "iter_safetensors",
    "read_safetensors_header",
    "write_safetensors",
    "NcclSender",
    "NcclReceiver",
    "packed_nccl_available",
    "ModelParamSpec",
    "UpdateRejected",
]
