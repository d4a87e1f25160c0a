"""Rollout requests and the ``BatchSource`` protocol under the reference's path
(``ludic.training.types``); they live in :mod:`ludic_lab.rollouts.requests` and
:mod:`ludic_lab.rollouts.batch_source`."""

from ludic_lab.rollouts.batch_source import BatchSource as BatchSource
from ludic_lab.rollouts.requests import (
    EnvSpec as EnvSpec,
    ProtocolSpec as ProtocolSpec,
    RolloutRequest as RolloutRequest,
)
