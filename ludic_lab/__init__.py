"""ludic_lab: a Jupyter-first research toolkit for reinforcement learning on LLM agents.

``ludic_lab.train_env(MyEnv, steps=20)`` trains a policy on an env in one call (the short
path, :mod:`ludic_lab.env_training`); ``run_sync`` runs a coroutine from sync code.

Loading the package registers the notebook views of the data classes (:func:`_register_views`),
so a ``Rollout``, ``SAWItem`` or ``SAWBatch`` displays the same whatever else was imported,
and installs the finder of :mod:`ludic_lab.compat`, so module paths that moved still import
(with a ``DeprecationWarning`` naming the new path).
"""

from collections.abc import Callable
from typing import Any

from ludic_lab import compat as _compat
from ludic_lab.aio import run_sync
from ludic_lab.display import register_html

__version__ = "0.1.0"
"""The release of this package (the version pyproject.toml declares)."""
__all__ = ["run_sync", "train_env", "train_env_async", "__version__"]

_LAZY = {"train_env": "ludic_lab.env_training", "train_env_async": "ludic_lab.env_training"}


def __getattr__(name: str) -> Any:
    """The short path is imported on first use, so ``import ludic_lab`` stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ludic_lab' has no attribute {name!r}")


def _view(module: str, function: str) -> Callable[[Any], str]:
    """``function`` of the view module ``module``, imported on the first display."""

    def render(obj: Any) -> str:
        import importlib

        out: str = getattr(importlib.import_module(module), function)(obj)
        return out

    return render


def _register_views() -> None:
    """The one place the data classes get their notebook views (the lab layer's HTML),
    named by path so that neither the data modules nor the views are imported here."""
    register_html("ludic_lab.types.Rollout", _view("ludic_lab.lab.rollout_html", "rollout_html"))
    register_html("ludic_lab.rollouts.saw.SAWItem", _view("ludic_lab.lab.saw_html", "saw_item_html"))
    register_html("ludic_lab.rollouts.saw.SAWBatch", _view("ludic_lab.lab.saw_html", "saw_batch_html"))


_register_views()
_compat.install()
