"""ludic_lab: a Jupyter-first research toolkit for reinforcement learning on LLM agents."""

from ludic_lab.aio import run_sync

__version__ = "0.1.0"
__all__ = ["run_sync", "__version__"]
