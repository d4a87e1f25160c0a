"""The in-process backend: :class:`~ludic_lab.inference.local.client.LocalChatClient`
(transformers in this process, the embedded default) and the parts it runs on.

- ``client.py``: the ``ChatClient``, weight updates (``sync_weights``), the generation thread;
- ``batcher.py``: requests of concurrent episodes gathered per event loop;
- ``continuous.py``: the running batch that requests join and leave at token boundaries;
  ``rows.py``: its requests and rows; ``static.py``: a batch run to its longest member;
- ``in_flight.py``: weight updates loaded between two decode steps (``weight_update="in_flight"``);
- ``kv_slab.py``: the running batch's KV in preallocated per-layer buffers;
- ``grouped_attention.py``: grouped-query attention without copying KV heads;
- ``prefix_cache.py``: the KV of finished sequences that later prompts extend;
- ``shared_prefix.py``: a prefix the prompts admitted together share, run once;
- ``sampling.py``: logits -> sampled token and its behaviour logprob;
- ``response.py``: one sequence's state and reply.

Everything here imports torch; ``from ludic_lab.inference import LocalChatClient`` loads it
on first access. This ``__init__`` imports nothing.
"""
