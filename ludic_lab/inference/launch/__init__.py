"""Starting servers as child processes and stopping them without leftovers.

- :mod:`~ludic_lab.inference.launch.server`: :func:`start_vllm_server` runs the bundled vLLM
  server (``python -m ludic_lab.inference.vllm_server``) in its own process group and returns
  a :class:`VLLMServerProcess` handle; :func:`wait_for_vllm_health` waits for it to serve.
- :mod:`~ludic_lab.inference.launch.processes`: process trees (identified by pid and start
  time), PID records, orphan reaping and the watchdog that outlives its owner's ``kill -9``;
  also used for torchrun (:mod:`ludic_lab.lab.torchrun`).

Imports no vLLM.
"""

from ludic_lab.inference.launch.server import (
    PortInUseError,
    VLLMServerProcess,
    start_vllm_server,
    wait_for_vllm_health,
    wait_for_vllm_health_sync,
)

__all__ = [
    "PortInUseError",
    "VLLMServerProcess",
    "start_vllm_server",
    "wait_for_vllm_health",
    "wait_for_vllm_health_sync",
]
