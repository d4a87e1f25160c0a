"""Shared set-up of the example scripts (``examples/``): samplers with weight pushes, the
Tic-Tac-Toe engine and evaluation, math data. Scripts read top to bottom; what they would
otherwise copy from one another lives here."""

from ludic_lab.recipes.sampler import Backend, Sampler, api_base

__all__ = ["Backend", "Sampler", "api_base"]
