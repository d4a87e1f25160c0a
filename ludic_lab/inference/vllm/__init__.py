"""The vLLM backend, by side of the HTTP wire.

- :mod:`ludic_lab.inference.vllm.client`: ``VLLMChatClient``, the client of any vLLM server
  (``ludic_lab.inference.vllm_client`` re-exports it);
- :mod:`ludic_lab.inference.vllm.server`: the bundled server process (vLLM's OpenAI API plus
  weight-update routes and policy versions; ``python -m ludic_lab.inference.vllm_server``)
  and the worker extension that runs inside vLLM's workers.
- :mod:`ludic_lab.inference.vllm.weight_transfer`: what both sides agree on to move weights
  (parameter specs, the safetensors file in shared memory, NCCL groups, the in-place load).

Starting the server as a child process is :mod:`ludic_lab.inference.launch`. Nothing here is
imported by ``import ludic_lab.inference``.
"""
