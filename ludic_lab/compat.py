"""Module paths that moved, in one table, and the import hook that keeps them working.

``MOVED`` maps each ``ludic_lab`` module path that a refactor moved or removed (issue 25's
second floor plan, and the splits before it) to the module that holds its code now. The
reference's own paths (``training/loss.py``, ``inference/vllm_client.py``, ...) are not here:
they stay files that re-export. :func:`install` (run by ``ludic_lab/__init__.py``) puts a
finder first on ``sys.meta_path`` that answers only for the old paths: ``import`` of one
imports the new module, warns once (``DeprecationWarning``) and binds the very same module
object, so ``from old.path import Name`` works and ``old.path is new.path``. Every other
name goes on to the ordinary finders (``ludic_lab.nonexistent`` still fails as usual).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    # the rollout side left training/ for rollouts/ (torch-free)
    "ludic_lab.training.rollout_engine": "ludic_lab.rollouts.engine",
    "ludic_lab.training.request_strategies": "ludic_lab.rollouts.strategies",
    "ludic_lab.training.saw": "ludic_lab.rollouts.saw",
    "ludic_lab.training.turn_merge": "ludic_lab.rollouts.turn_merge",
    "ludic_lab.training.filters": "ludic_lab.rollouts.filters",
    "ludic_lab.training.group_signal": "ludic_lab.rollouts.group_signal",
    "ludic_lab.training.difficulty_filter": "ludic_lab.rollouts.difficulty_filter",
    "ludic_lab.training.rejection_sampling": "ludic_lab.rollouts.rejection_sampling",
    "ludic_lab.training.signal_check": "ludic_lab.rollouts.signal_check",
    "ludic_lab.training.credit": "ludic_lab.rollouts.credit",
    "ludic_lab.training.credit.base": "ludic_lab.rollouts.credit.base",
    "ludic_lab.training.credit.group_relative": "ludic_lab.rollouts.credit.group_relative",
    "ludic_lab.training.credit.groups": "ludic_lab.rollouts.credit.groups",
    "ludic_lab.training.credit.returns": "ludic_lab.rollouts.credit.returns",
    "ludic_lab.training.batching.base": "ludic_lab.rollouts.batch_source",
    "ludic_lab.training.batching.batch_stats": "ludic_lab.rollouts.batch_stats",
    "ludic_lab.training.batching.dynamic_sampling": "ludic_lab.rollouts.dynamic_sampling",
    "ludic_lab.training.batching.rollout_source": "ludic_lab.rollouts.rollout_source",
    # the batch sources under one import: the reference's batching package holds them all
    "ludic_lab.training.batch_sources": "ludic_lab.training.batching",
    # the in-process backend: inference/local/
    "ludic_lab.inference.local_client": "ludic_lab.inference.local.client",
    "ludic_lab.inference.local_batcher": "ludic_lab.inference.local.batcher",
    "ludic_lab.inference.local_response": "ludic_lab.inference.local.response",
    "ludic_lab.inference.continuous": "ludic_lab.inference.local.continuous",
    "ludic_lab.inference.prefix_cache": "ludic_lab.inference.local.prefix_cache",
    "ludic_lab.inference.kv_slab": "ludic_lab.inference.local.kv_slab",
    "ludic_lab.inference.grouped_attention": "ludic_lab.inference.local.grouped_attention",
    "ludic_lab.inference.shared_prefix": "ludic_lab.inference.local.shared_prefix",
    # vLLM: client, server and the weight transfer they agree on, under inference/vllm/
    "ludic_lab.inference.vllm_http": "ludic_lab.inference.vllm.client.http",
    "ludic_lab.inference.vllm_sampling": "ludic_lab.inference.vllm.client.sampling",
    "ludic_lab.inference.vllm_weight_sync": "ludic_lab.inference.vllm.client.weight_sync",
    "ludic_lab.inference.vllm_admission": "ludic_lab.inference.vllm.server.admission",
    "ludic_lab.inference.vllm_control": "ludic_lab.inference.vllm.server.control",
    "ludic_lab.inference.vllm_options": "ludic_lab.inference.vllm.server.options",
    "ludic_lab.inference.vllm_patches": "ludic_lab.inference.vllm.server.patches",
    "ludic_lab.inference.vllm_routes": "ludic_lab.inference.vllm.server.routes",
    "ludic_lab.inference.vllm_version": "ludic_lab.inference.vllm.server.version",
    "ludic_lab.inference.vllm_worker": "ludic_lab.inference.vllm.server.worker",
    "ludic_lab.inference.weight_transfer": "ludic_lab.inference.vllm.weight_transfer",
    "ludic_lab.inference.weight_transfer.base": "ludic_lab.inference.vllm.weight_transfer.base",
    "ludic_lab.inference.weight_transfer.inplace": "ludic_lab.inference.vllm.weight_transfer.inplace",
    "ludic_lab.inference.weight_transfer.inplace_plan": "ludic_lab.inference.vllm.weight_transfer.inplace_plan",
    "ludic_lab.inference.weight_transfer.nccl": "ludic_lab.inference.vllm.weight_transfer.nccl",
    "ludic_lab.inference.weight_transfer.safetensors_file": "ludic_lab.inference.vllm.weight_transfer.safetensors_file",
    "ludic_lab.inference.weight_transfer.shm": "ludic_lab.inference.vllm.weight_transfer.shm",
    # starting servers and process trees: inference/launch/
    "ludic_lab.inference.vllm_process": "ludic_lab.inference.launch.server",
    "ludic_lab.inference.processes": "ludic_lab.inference.launch.processes",
    "ludic_lab.lab.processes": "ludic_lab.inference.launch.processes",
    # tool calls: the rendering layer
    "ludic_lab.inference.tool_calls": "ludic_lab.rendering",
    # the views: lab/
    "ludic_lab.types_html": "ludic_lab.lab.rollout_html",
    "ludic_lab.training.saw_html": "ludic_lab.lab.saw_html",
    "ludic_lab.token_html": "ludic_lab.lab.token_html",
    "ludic_lab.reports": "ludic_lab.lab.reports",
    "ludic_lab.lab.tasks": "ludic_lab.lab.background",
    # tasks, the sampler and the demos
    "ludic_lab.pipeline.tasks": "ludic_lab.task.builtin",
    "ludic_lab.demos.capitals": "ludic_lab.task.capitals",
    "ludic_lab.recipes.sampler": "ludic_lab.sampler",
    "ludic_lab.demo_tools": "ludic_lab.demos.tool_demo",
    "ludic_lab.tool_task": "ludic_lab.demos.tool_task",
}


class _MovedLoader(importlib.abc.Loader):
    """Loads an old path as the module that replaced it: ``create_module`` imports and returns
    the new module, ``exec_module`` only puts back the new module's own ``__spec__`` (the
    import system sets the old path's spec on whatever ``create_module`` returned)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        warnings.warn(
            f"{self.old} moved to {self.new}; import it from there",
            DeprecationWarning,
            stacklevel=_importer_stacklevel(),
        )
        return module

    def exec_module(self, module: ModuleType) -> None:
        if self._spec is not None:
            module.__spec__ = self._spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers ``find_spec`` for the old paths of :data:`MOVED` only (``None`` for any other
    name, so the ordinary finders run)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(fullname, new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finder, which would
    otherwise load a moved package's submodule a second time under its old name."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())


def _importer_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised in ``create_module`` at the code that
    wrote the import. ``warnings`` itself steps over the import system's ``_bootstrap`` frames;
    the frames of ``importlib.import_module`` and of this module are counted here."""
    frame = sys._getframe(1)  # create_module, which calls warnings.warn: stacklevel 1
    level = 1
    while frame.f_back is not None:
        frame = frame.f_back
        if _is_bootstrap(frame.f_code.co_filename):
            continue
        level += 1
        if not _is_machinery(frame.f_code.co_filename):
            break
    return level


def _is_bootstrap(filename: str) -> bool:
    return "importlib" in filename and "_bootstrap" in filename  # what warnings skips on its own


def _is_machinery(filename: str) -> bool:
    return filename == __file__ or filename.replace("\\", "/").endswith("importlib/__init__.py")
