"""Shared set-up of the example scripts (``examples/``): the Tic-Tac-Toe engine and
evaluation, math data, the trainer set-up and summaries (``recipes.training``), the pipeline
monitor (``recipes.pipeline``); samplers with weight pushes come from :mod:`ludic_lab.sampler`
(re-exported here). Scripts read top to bottom; what they would otherwise copy from one
another lives here."""

from ludic_lab.sampler import Backend, Sampler, api_base, direct_sampler

__all__ = ["Backend", "Sampler", "api_base", "direct_sampler"]
