"""ludic_lab: a Jupyter-first research toolkit for reinforcement learning on LLM agents.

``ludic_lab.train_env(MyEnv, steps=20)`` trains a policy on an env in one call (the short
path, :mod:`ludic_lab.env_training`); ``run_sync`` runs a coroutine from sync code.
"""

from typing import Any

from ludic_lab.aio import run_sync

__version__ = "0.1.0"
__all__ = ["run_sync", "train_env", "train_env_async", "__version__"]

_LAZY = {"train_env": "ludic_lab.env_training", "train_env_async": "ludic_lab.env_training"}


def __getattr__(name: str) -> Any:
    """The short path is imported on first use, so ``import ludic_lab`` stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ludic_lab' has no attribute {name!r}")
