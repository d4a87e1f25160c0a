"""Inference (layer 1): the ChatClient protocol, request types and backends.

``LocalChatClient`` (in-process transformers) and the model helpers import torch, so they
are loaded on first access.
"""

from __future__ import annotations

from typing import Any

from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.client import ChatClient, VersionedClient
from ludic_lab.inference.request import (
    ChatCompletionRequest,
    InferenceSpec,
    ReturnSpec,
    SamplingConfig,
    ToolRequest,
)

_LAZY = {
    "LocalChatClient": "ludic_lab.inference.local.client",
    "default_model_path": "ludic_lab.inference.models",
    "tiny_model_path": "ludic_lab.inference.models",
    "build_tiny_model": "ludic_lab.inference.models",
    "resolve_model": "ludic_lab.inference.models",
    "start_vllm_server": "ludic_lab.inference.launch.server",
    "wait_for_vllm_health": "ludic_lab.inference.launch.server",
    "wait_for_vllm_health_sync": "ludic_lab.inference.launch.server",
    "VLLMServerProcess": "ludic_lab.inference.launch.server",
    "PortInUseError": "ludic_lab.inference.launch.server",
    "VLLMChatClient": "ludic_lab.inference.vllm.client.client",
}

__all__ = [
    "ChatClient",
    "VersionedClient",
    "ChatTemplate",
    "ChatCompletionRequest",
    "InferenceSpec",
    "ReturnSpec",
    "SamplingConfig",
    "ToolRequest",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ludic_lab.inference' has no attribute {name!r}")
