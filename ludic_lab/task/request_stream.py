"""``RequestStream``: the requests of each training step, as an object with a cursor.

A batch source calls ``requests_fn()`` once per batch and expects fresh requests each time.
A closure with a counter does that but cannot be saved or resumed; a :class:`RequestStream`
is a dataset of env seeds (questions ``0..size-1``, or an unbounded count) walked by a
cursor, and ``state_dict()`` / ``load_state_dict()`` save and restore where it is, so a
checkpointed run resumes on the next question instead of the first.

``stats`` (a task's :attr:`~ludic_lab.task.Task.stats`) counts each batch's rollouts: the batch
source hands every round's rollouts to :meth:`RequestStream.observe` and puts
:meth:`RequestStream.take_stats` into ``batch.meta``, so the task's counts (e.g.
``textarena/format_reward_mean``) are in every training step's metrics.

Which seed the ``c``-th request gets (``c``: the cursor, counting requests handed out):

- ``shuffle=False`` (default): ``(seed * 7919 + c) % size`` — consecutive rows, a different
  starting row per ``seed`` (``size=None``: ``seed * 7919 + c``, unbounded);
- ``shuffle=True``: row ``order[c % size]`` of a ``seed``-shuffled order of the rows.

No torch here: a pipeline actor imports it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic_lab.inference import InferenceSpec
from ludic_lab.rollouts.requests import EnvSpec, ProtocolSpec, RolloutRequest
from ludic_lab.types import Rollout

SEED_STRIDE = 7919
"""A prime: ``seed * SEED_STRIDE`` spreads the starting rows of runs with different seeds."""


class RequestStream:
    """``per_step`` fresh logical requests per call (see the module docstring).

    ``env`` / ``protocol``: the registry kinds (or specs) of the engine that runs them;
    ``inference``: the sampling of every request; ``max_steps``: the turn limit per request
    (``None``: the batch source's); ``stats``: ``stats(rollouts) -> {name: value}`` of each
    batch's rollouts (None: nothing). Expand the requests into groups with a request strategy.
    """

    def __init__(
        self,
        env: str | EnvSpec,
        protocol: str | ProtocolSpec = "single_agent",
        *,
        per_step: int = 8,
        size: int | None = None,
        seed: int = 0,
        shuffle: bool = False,
        inference: InferenceSpec | None = None,
        max_steps: int | None = None,
        stats: Callable[[Sequence[Rollout]], Mapping[str, float]] | None = None,
    ) -> None:
        if isinstance(per_step, bool) or not isinstance(per_step, int) or per_step < 1:
            raise ValueError(f"RequestStream.per_step must be an int >= 1, got {per_step!r}")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"RequestStream.size must be None or an int >= 1 (rows in the dataset), got {size!r}")
        if shuffle and size is None:
            raise ValueError("RequestStream(shuffle=True) needs size= (the number of rows to shuffle)")
        if stats is not None and not callable(stats):
            raise TypeError(f"RequestStream.stats must be None or a callable rollouts -> {{name: value}}: {stats!r}")
        self.env = env if isinstance(env, EnvSpec) else EnvSpec(env)
        self.protocol = protocol if isinstance(protocol, ProtocolSpec) else ProtocolSpec(protocol)
        self.per_step, self.size, self.seed, self.shuffle = per_step, size, seed, shuffle
        self.inference, self.max_steps, self.stats = inference, max_steps, stats
        self._observed: list[Rollout] = []
        self.cursor = 0
        self._order: list[int] | None = None
        if shuffle:
            self._order = list(range(size or 0))
            random.Random(seed).shuffle(self._order)

    def __repr__(self) -> str:
        return (
            f"RequestStream(env={self.env.kind!r}, per_step={self.per_step}, size={self.size}, seed={self.seed}, "
            f"shuffle={self.shuffle}, cursor={self.cursor})"
        )

    def env_seed(self, c: int) -> int:
        """The env seed of the ``c``-th request (the rule in the module docstring)."""
        if self._order is not None:
            return self._order[c % len(self._order)]
        n = self.seed * SEED_STRIDE + c
        return n % self.size if self.size else n

    def request(self, env_seed: int) -> RolloutRequest:
        """The logical request for ``env_seed`` (no group, no sampling seed: the strategy adds them)."""
        return RolloutRequest(
            env=self.env, protocol=self.protocol, env_seed=env_seed, inference=self.inference, max_steps=self.max_steps
        )

    def __call__(self) -> list[RolloutRequest]:
        """The next ``per_step`` requests; the cursor moves past them."""
        out = [self.request(self.env_seed(self.cursor + i)) for i in range(self.per_step)]
        self.cursor += self.per_step
        return out

    def observe(self, rollouts: Sequence[Rollout]) -> None:
        """Keep a round's ``rollouts`` for :meth:`take_stats` (a batch source calls this; nothing
        is kept without ``stats``)."""
        if self.stats is not None:
            self._observed.extend(rollouts)

    def take_stats(self) -> dict[str, float]:
        """``stats`` of the rollouts observed since the last call (then forgotten); ``{}`` when
        none were, or without ``stats``."""
        observed, self._observed = self._observed, []
        if self.stats is None or not observed:
            return {}
        return dict(self.stats(observed))

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is, as JSON-able data (save it with a checkpoint)."""
        return {"cursor": self.cursor, "seed": self.seed, "size": self.size, "shuffle": self.shuffle}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state["cursor"]``; a state saved from a stream over other data (seed,
        size or order) is refused, since its cursor would point at other questions."""
        mine = self.state_dict()
        other = {k: state.get(k) for k in ("seed", "size", "shuffle")}
        if other != {k: mine[k] for k in other}:
            raise ValueError(f"RequestStream.load_state_dict: state {dict(state)} is of another stream ({mine})")
        cursor = state.get("cursor")
        if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
            raise ValueError(f"RequestStream.load_state_dict: cursor must be an int >= 0, got {cursor!r}")
        self.cursor = cursor
