"""Weight transports between a trainer and the bundled vLLM server.

- :class:`ShmSender` — same host: a safetensors file in ``/dev/shm`` (CPU and GPU; what the
  tests exercise).
- :class:`NcclSender` — GPU: an NCCL broadcast to every vLLM worker (vLLM's packed
  broadcast when the installed vLLM has it).

Both implement :class:`WeightSender`; :class:`ModelParamSpec` is the server's check of an
update against the served model. Importing this package does not import torch or vLLM.
"""

from ludic_lab.inference.vllm.weight_transfer.base import (
    WIRE_DTYPES as WIRE_DTYPES,
    ParamMeta as ParamMeta,
    WeightSender,
    dtype_name as dtype_name,
    param_metas as param_metas,
    torch_dtype as torch_dtype,
    update_body as update_body,
)
from ludic_lab.inference.vllm.weight_transfer.nccl import (
    NcclReceiver,
    NcclSender,
    packed_nccl_available as packed_nccl_available,
)
from ludic_lab.inference.vllm.weight_transfer.shm import (
    ShmSender,
    default_shm_dir as default_shm_dir,
    iter_safetensors as iter_safetensors,
    read_safetensors_header as read_safetensors_header,
    write_safetensors as write_safetensors,
)
from ludic_lab.inference.vllm.weight_transfer.spec import ModelParamSpec, UpdateRejected

__all__ = [
    "WeightSender",
    "ShmSender",
    "NcclSender",
    "NcclReceiver",
    "ModelParamSpec",
    "UpdateRejected",
]
