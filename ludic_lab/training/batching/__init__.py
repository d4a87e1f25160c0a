"""Batching (the reference's ``training/batching``): the rollout engine and request strategies.

Re-exports :mod:`ludic_lab.training.rollout_engine` and
:mod:`ludic_lab.training.request_strategies` under the reference's path.
"""

from ludic_lab.training.request_strategies import GRPORequestStrategy, IdentityStrategy, RequestStrategy
from ludic_lab.training.rollout_engine import RolloutEngine, UnknownKindError

__all__ = ["GRPORequestStrategy", "IdentityStrategy", "RequestStrategy", "RolloutEngine", "UnknownKindError"]
