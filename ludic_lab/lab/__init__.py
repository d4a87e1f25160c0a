"""ludic_lab.lab: the notebook layer (layer 7).

Importing it inside IPython registers the ``%%ludic_export`` cell magic (``%load_ext
ludic_lab.lab`` does the same explicitly) and reaps background processes (vLLM servers,
torchrun runs) left behind by a kernel that died or was restarted.
"""

from __future__ import annotations

from typing import Any

from ludic_lab.jupyter import ipython_shell
from ludic_lab.lab.export import ExportedScript, ExportError, export_cells, export_notebook
from ludic_lab.lab.live import LivePlot, plot_metrics_jsonl
from ludic_lab.lab.servers import VLLMServer
from ludic_lab.lab.stepper import RolloutStepper, StepperWidget, Turn
from ludic_lab.lab.tasks import BackgroundTask, enable_nested_asyncio, run_sync, show, start_background
from ludic_lab.lab.torchrun import TorchrunError, TorchrunRun, launch_torchrun
from ludic_lab.lab.views import (
    credit_view,
    log_html_to_wandb,
    plot_group_distributions,
    plot_ratio_kl,
    policy_logprobs,
    ratio_kl_stats,
)
from ludic_lab.token_html import HTMLView, save_html, set_display_tokenizer

__all__ = [
    "BackgroundTask",
    "HTMLView",
    "LivePlot",
    "RolloutStepper",
    "StepperWidget",
    "Turn",
    "credit_view",
    "enable_nested_asyncio",
    "log_html_to_wandb",
    "plot_group_distributions",
    "plot_metrics_jsonl",
    "plot_ratio_kl",
    "policy_logprobs",
    "ratio_kl_stats",
    "run_sync",
    "save_html",
    "set_display_tokenizer",
    "show",
    "start_background",
    "ExportError",
    "ExportedScript",
    "TorchrunError",
    "TorchrunRun",
    "VLLMServer",
    "export_cells",
    "export_notebook",
    "launch_torchrun",
    "load_ipython_extension",
]


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
