"""Shared set-up of the example scripts (``examples/``): samplers with weight pushes, the
Tic-Tac-Toe engine and evaluation, math data, the trainer set-up and summaries
(``recipes.training``), the pipeline monitor (``recipes.pipeline``). Scripts read top to
bottom; what they would otherwise copy from one another lives here."""

from ludic_lab.recipes.sampler import Backend, Sampler, api_base, direct_sampler

__all__ = ["Backend", "Sampler", "api_base", "direct_sampler"]
