"""The bundled vLLM server, the process side: everything here runs inside the server process
(or its vLLM workers), never in a client's.

- :mod:`~ludic_lab.inference.vllm.server.main`: the command line and the hand-over to vLLM's
  own ``run_server`` (``python -m ludic_lab.inference.vllm_server`` runs it);
- :mod:`~ludic_lab.inference.vllm.server.options`: ``LudicServerOptions`` and the
  ``--ludic-*`` flags generated from it, the bind rule;
- :mod:`~ludic_lab.inference.vllm.server.version`: the vLLM version gate;
- :mod:`~ludic_lab.inference.vllm.server.routes`: the HTTP routes (an ``APIRouter`` with
  pydantic bodies) over :mod:`~ludic_lab.inference.vllm.server.control`, the control
  plane's state and logic (no FastAPI, no vLLM);
- :mod:`~ludic_lab.inference.vllm.server.admission`: the admission gate, version header and
  token check;
- :mod:`~ludic_lab.inference.vllm.server.patches`: every reach into vLLM internals;
- :mod:`~ludic_lab.inference.vllm.server.worker`: ``LudicWorkerExtension``, the worker side
  (``--worker-extension-cls``).

This ``__init__`` imports nothing: vLLM's workers import the worker extension through it.
"""
