"""Training (layer 5): rollout requests, the rollout engine, request strategies, and more."""

from ludic_lab.training.request_strategies import GRPORequestStrategy, IdentityStrategy, RequestStrategy
from ludic_lab.training.rollout_engine import RolloutEngine, UnknownKindError
from ludic_lab.training.types import EnvSpec, ProtocolSpec, RolloutRequest

__all__ = [
    "EnvSpec",
    "GRPORequestStrategy",
    "IdentityStrategy",
    "ProtocolSpec",
    "RequestStrategy",
    "RolloutEngine",
    "RolloutRequest",
    "UnknownKindError",
]
