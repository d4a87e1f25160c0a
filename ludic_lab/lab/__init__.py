"""ludic_lab.lab: the notebook layer (layer 7).

Importing it inside IPython registers the ``%%ludic_export`` cell magic (``%load_ext
ludic_lab.lab`` does the same explicitly) and reaps background processes (vLLM servers,
torchrun runs) left behind by a kernel that died or was restarted.
"""

from __future__ import annotations

from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.jupyter import ipython_shell
from ludic_lab.lab.background import BackgroundTask, enable_nested_asyncio as enable_nested_asyncio, start_background
from ludic_lab.lab.export import ExportedScript, ExportError, export_cells, export_notebook
from ludic_lab.lab.live import LivePlot, plot_metrics_jsonl
from ludic_lab.lab.servers import VLLMServer
from ludic_lab.lab.stepper import RolloutStepper, StepperWidget, Turn as Turn
from ludic_lab.lab.task_output import show
from ludic_lab.lab.token_html import HTMLView, save_html, set_display_tokenizer
from ludic_lab.lab.torchrun import TorchrunError, TorchrunRun, launch_torchrun
from ludic_lab.lab.views import (
    credit_view,
    log_html_to_wandb,
    plot_group_distributions,
    plot_ratio_kl,
    policy_logprobs,
    ratio_kl_stats as ratio_kl_stats,
)

__all__ = [
    "BackgroundTask",
    "start_background",
    "run_sync",
    "show",
    "LivePlot",
    "plot_metrics_jsonl",
    "RolloutStepper",
    "StepperWidget",
    "VLLMServer",
    "TorchrunRun",
    "TorchrunError",
    "launch_torchrun",
    "export_cells",
    "export_notebook",
    "ExportedScript",
    "ExportError",
    "credit_view",
    "policy_logprobs",
    "plot_group_distributions",
    "plot_ratio_kl",
    "log_html_to_wandb",
    "HTMLView",
    "save_html",
    "set_display_tokenizer",
]


def __getattr__(name: str) -> Any:
    if name == "run_episodes":  # on first use: it brings ludic_lab.eval (a second to import)
        from ludic_lab.lab.episodes import run_episodes

        return run_episodes
    raise AttributeError(f"module 'ludic_lab.lab' has no attribute {name!r}")


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext ludic_lab.lab``: register the lab's magics in this IPython shell."""
    from ludic_lab.lab import export

    export.register(ip)


def _on_import() -> None:
    from ludic_lab.inference.launch.processes import reap_orphans

    try:
        reap_orphans()
    except OSError:
        pass  # an unwritable cache: nothing recorded, nothing to reap
    ip = ipython_shell()
    if ip is not None:
        load_ipython_extension(ip)


_on_import()
