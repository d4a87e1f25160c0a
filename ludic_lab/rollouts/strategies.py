"""Request strategies: how logical requests ("do task X") become the requests the engine runs.

A strategy decouples *what* to practise (the curriculum's list of requests) from *how* the
algorithm needs it sampled. :class:`IdentityStrategy` runs requests as given;
:class:`GRPORequestStrategy` turns each into a group of siblings that share the env seed
(same prompt) but not the sampling seed (different answers), tagged with a group id that
``GroupNormalizedReturn`` uses to normalise rewards within the group.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from ludic_lab.rollouts.requests import RolloutRequest

_SEED_BOUND = 2**31 - 1
"""Drawn seeds stay below this (int32-safe for every backend), leaving room for ``+ i``."""


@runtime_checkable
class RequestStrategy(Protocol):
    """Expands logical requests into the concrete requests the engine runs."""

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        """Return the requests to run, in a deterministic order."""
        ...


class IdentityStrategy:
    """One request in, the same request out (REINFORCE, SFT, evaluation)."""

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        """The requests unchanged, as a new list."""
        return list(requests)


class GRPORequestStrategy:
    """Each episode of each request becomes a group of ``group_size`` sibling requests.

    Members of a group share the env seed (the episode's, see
    :meth:`RolloutRequest.episode_seeds`, or one drawn from this strategy's RNG when the
    request has none), get distinct sampling seeds (``base + i``; ``base`` is the episode's
    sampling seed or a drawn one) and one group id: the request's own when it
    has one (suffixed ``"/<episode>"`` if the request has several episodes), else a fresh
    ``uuid4`` hex — group ids are never derived from ``seed`` so that two actors with the
    same seed cannot merge their groups. Output order: request by request, group by group.
    ``seed`` makes the drawn seeds reproducible (``None``: fresh OS entropy).
    """

    def __init__(self, group_size: int, *, seed: int | None = None) -> None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"GRPORequestStrategy.group_size must be an int >= 1, got {group_size!r}")
        self.group_size = group_size
        self.seed = seed
        self._rng = random.Random(seed)

    def __repr__(self) -> str:
        return f"GRPORequestStrategy(group_size={self.group_size}, seed={self.seed})"

    def _draw_seed(self) -> int:
        return self._rng.randrange(0, _SEED_BOUND - self.group_size)

    def state_dict(self) -> dict[str, Any]:
        """The seed RNG's state (JSON-able), so a resumed run draws the seeds it would have drawn."""
        version, internal, gauss = self._rng.getstate()
        return {"group_size": self.group_size, "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s RNG state."""
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        """``group_size`` requests of one episode per input episode, grouped (see class doc)."""
        out: list[RolloutRequest] = []
        for req in requests:
            if not isinstance(req, RolloutRequest):
                raise TypeError(f"GRPORequestStrategy.expand expects RolloutRequest objects, got {type(req).__name__}")
            shared_draw = self._draw_seed() if req.env_seed is None and req.shares_env_seed else None
            for e in range(req.num_episodes):
                env_seed, sampling_seed = req.episode_seeds(e)
                if env_seed is None:  # one drawn seed per group (per request if its episodes share)
                    env_seed = shared_draw if shared_draw is not None else self._draw_seed()
                if sampling_seed is None:
                    sampling_seed = self._draw_seed()
                if req.group_id is None:
                    gid = uuid.uuid4().hex
                elif req.num_episodes == 1:
                    gid = req.group_id
                else:
                    gid = f"{req.group_id}/{e}"
                meta = dict(req.meta)
                if "group_id" in meta:  # keep meta consistent with the field (validated)
                    meta["group_id"] = gid
                for i in range(self.group_size):
                    out.append(
                        replace(
                            req,
                            num_episodes=1,
                            env_seed=env_seed,
                            sampling_seed=sampling_seed + i,
                            group_id=gid,
                            share_env_seed=None,
                            meta=meta,
                        )
                    )
        return out
