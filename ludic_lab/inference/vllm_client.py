"""The vLLM client's reference module path (Ludic's ``inference/vllm_client.py``).

The client lives in :mod:`ludic_lab.inference.vllm.client` (``client.py``: the
``ChatClient``; ``http.py``: pools, timeouts, retries and the errors; ``sampling.py``: the
``/v1/completions`` exchange; ``weight_sync.py``: weight pushes); this module re-exports
its public names.
"""

from ludic_lab.inference.vllm.client.client import (
    POLICY_VERSION_HEADER as POLICY_VERSION_HEADER,
    VLLMChatClient as VLLMChatClient,
)
from ludic_lab.inference.vllm.client.http import (
    RequestTimeout as RequestTimeout,
    VLLMError as VLLMError,
    VLLMServerUnavailable as VLLMServerUnavailable,
    WeightUpdateRejected as WeightUpdateRejected,
)
