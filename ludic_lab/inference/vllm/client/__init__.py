"""The vLLM backend's client side: :class:`~ludic_lab.inference.vllm.client.client.VLLMChatClient`
(OpenAI-compatible HTTP with token ids, policy versions and weight updates), composed of

- ``http.py``: connection pools, timeouts, retries, and the client's errors;
- ``sampling.py``: the ``/v1/completions`` exchange (request body, reply parsing);
- ``weight_sync.py``: pushing weights to the bundled server (shared memory or NCCL).

``ludic_lab.inference.vllm_client`` (the reference path) and ``ludic_lab.inference``
re-export the client. This ``__init__`` imports nothing.
"""
