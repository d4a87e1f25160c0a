"""An online difficulty filter: skip prompts the policy always or never solves, revisit later.

A prompt whose recent samples all pass (or all fail) gives a GRPO group equal rewards, hence
no gradient. :class:`DifficultyFilter` wraps the ``requests_fn`` you give a
:class:`~ludic_lab.rollouts.RolloutBatchSource` and keeps, per prompt, the outcomes
of its last ``window`` rollouts. The source hands it every generated rollout
(:meth:`DifficultyFilter.observe`; any ``requests_fn`` with an ``observe(rollouts)`` method
gets them, after rewards are applied). A prompt with at least ``min_samples`` outcomes and a
pass rate of 0 or 1 is *parked*: when the wrapped stream offers it again it is skipped and
another prompt is pulled. After ``revisit_after`` calls a parked prompt is served once more
(the policy may have learnt it, or forgotten it); its new outcomes join its window and decide
whether it stays.

Prompts are told apart by ``key(request)``; the default is the env kind, env kwargs and
``env_seed`` (how the capitals demo, ``DatasetQAEnv`` and the pipeline's tasks pick the
question). Requests without ``env_seed`` have no identity under the default key and pass
through untracked (counted); pass ``key=`` to identify them. The key travels to the rollouts
in ``request.meta["difficulty_key"]``.

Counted (``take_stats()``, which the source puts into ``batch.meta`` each batch):
``difficulty/skipped``, ``difficulty/revisited``, ``difficulty/parked_new`` (prompts parked since
the last batch), ``difficulty/forced`` (skipped prompts served anyway because the stream ran
dry), ``difficulty/untracked``; and the pool sizes ``difficulty/parked``,
``difficulty/parked_solved``, ``difficulty/parked_unsolved``, ``difficulty/tracked``.

Example::

    requests = DifficultyFilter(requests, window=16, min_samples=8, revisit_after=20)
    source = RolloutBatchSource(engine, requests, credit, request_strategy=GRPORequestStrategy(8))
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import Any

from ludic_lab.rollouts.requests import RolloutRequest
from ludic_lab.types import Rollout

KEY_FIELD = "difficulty_key"
"""``request.meta`` / ``rollout.meta`` entry holding a prompt's key (a string)."""


def default_prompt_key(request: RolloutRequest) -> str | None:
    """``(env kind, env kwargs, env_seed)`` as a string; ``None`` when ``env_seed`` is unset."""
    if request.env_seed is None:
        return None
    return json.dumps([request.env.kind, request.env.kwargs, request.env_seed], sort_keys=True, default=repr)


class DifficultyFilter:
    """A ``requests_fn`` that skips prompts whose recent pass rate is 0 or 1 (module docstring).

    ``passed(rollout)`` decides a pass (default: ``total_reward >= pass_threshold``; failed
    rollouts are not counted). Each call returns as many requests as the wrapped stream's
    first call of it did: due revisits first, then fresh prompts, pulling the stream up to
    ``max_pulls`` times; fresh prompts left over wait for the next call.
    """

    def __init__(
        self,
        requests_fn: Callable[[], Sequence[RolloutRequest]],
        *,
        key: Callable[[RolloutRequest], Hashable | None] | None = None,
        window: int = 16,
        min_samples: int = 8,
        revisit_after: int = 20,
        pass_threshold: float = 1.0,
        passed: Callable[[Rollout], bool] | None = None,
        max_pulls: int = 4,
    ) -> None:
        if not callable(requests_fn):
            raise TypeError(f"DifficultyFilter wraps a callable returning RolloutRequests, got {type(requests_fn)}")
        for name, v in (("window", window), ("min_samples", min_samples), ("revisit_after", revisit_after)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"DifficultyFilter.{name} must be an int >= 1, got {v!r}")
        if min_samples > window:
            raise ValueError(
                f"DifficultyFilter.min_samples={min_samples} > window={window}: a prompt could never be judged; "
                "keep min_samples <= window (e.g. one group's worth of samples)"
            )
        if isinstance(max_pulls, bool) or not isinstance(max_pulls, int) or max_pulls < 1:
            raise ValueError(f"DifficultyFilter.max_pulls must be an int >= 1, got {max_pulls!r}")
        if passed is not None and not callable(passed):
            raise TypeError(f"DifficultyFilter.passed must be a callable Rollout -> bool, got {type(passed)}")
        self.requests_fn = requests_fn
        self.key = key or default_prompt_key
        self.window, self.min_samples, self.revisit_after = window, min_samples, revisit_after
        self.pass_threshold = float(pass_threshold)
        self.passed = passed or (lambda r: r.total_reward >= self.pass_threshold)
        self.max_pulls = max_pulls
        self.calls = 0
        self.history: dict[str, deque[bool]] = {}
        """Per prompt key: the outcomes (pass / fail) of its last ``window`` rollouts."""
        self.parked: dict[str, tuple[int, RolloutRequest]] = {}
        """Per parked prompt key: (the call it was parked at, the request to revisit it with)."""
        self._last_request: dict[str, RolloutRequest] = {}
        self._backlog: deque[RolloutRequest] = deque()
        self._counts: Counter[str] = Counter()
        self._batch_size: int | None = None

    def __repr__(self) -> str:
        return (
            f"DifficultyFilter(window={self.window}, min_samples={self.min_samples}, "
            f"revisit_after={self.revisit_after}, tracked={len(self.history)}, parked={len(self.parked)})"
        )

    # -- the stream ---------------------------------------------------------------------
    def __call__(self) -> list[RolloutRequest]:
        """The next requests: due revisits, then fresh prompts that are not parked."""
        self.calls += 1
        out: list[RolloutRequest] = []
        skipped: list[RolloutRequest] = []
        pulls = 0
        if self._batch_size is None:
            self._backlog.extend(self._pull())
            pulls = 1
            self._batch_size = len(self._backlog)
        n = self._batch_size
        for k, (since, req) in list(self.parked.items()):
            if len(out) < n and self.calls - since >= self.revisit_after:
                del self.parked[k]
                out.append(req)
                self._counts["revisited"] += 1
        while len(out) < n:
            if not self._backlog:
                if pulls >= self.max_pulls:
                    break
                self._backlog.extend(self._pull())
                pulls += 1
                if not self._backlog:
                    break
            req = self._backlog.popleft()
            stamped = self._stamp(req)
            sk = stamped.meta.get(KEY_FIELD)
            if sk is not None and sk in self.parked:
                skipped.append(stamped)
                self._counts["skipped"] += 1
            else:
                out.append(stamped)
        forced = skipped[: max(0, n - len(out))]  # the stream ran dry: serve parked prompts rather than none
        self._counts["forced"] += len(forced)
        out.extend(forced)
        for req in out:
            rk = req.meta.get(KEY_FIELD)
            if isinstance(rk, str):
                self._last_request[rk] = req
        return out

    def _pull(self) -> list[RolloutRequest]:
        got = self.requests_fn()
        if isinstance(got, RolloutRequest) or not isinstance(got, (list, tuple)):
            raise TypeError(f"the wrapped requests_fn must return a list of RolloutRequest, got {type(got).__name__}")
        return list(got)

    def _stamp(self, req: RolloutRequest) -> RolloutRequest:
        """``req`` with its prompt key in ``meta`` (or unchanged and counted when it has none)."""
        k = self.key(req)
        if k is None:
            self._counts["untracked"] += 1
            return req
        key = k if isinstance(k, str) else json.dumps(k, sort_keys=True, default=repr)
        return req if req.meta.get(KEY_FIELD) == key else replace(req, meta={**req.meta, KEY_FIELD: key})

    # -- what the source tells us -------------------------------------------------------
    def observe(self, rollouts: Sequence[Rollout]) -> None:
        """Record each rollout's pass / fail under its prompt key; park prompts that settled."""
        touched: set[str] = set()
        for r in rollouts:
            k = r.meta.get(KEY_FIELD)
            if r.failed or not isinstance(k, str):
                continue
            self.history.setdefault(k, deque(maxlen=self.window)).append(bool(self.passed(r)))
            touched.add(k)
        for k in touched:
            if self.settled(k) and k not in self.parked and k in self._last_request:
                self.parked[k] = (self.calls, self._last_request[k])
                self._counts["parked_new"] += 1

    def pass_rate(self, key: str) -> float | None:
        """The recent pass rate of a prompt (``None`` before any outcome)."""
        h = self.history.get(key)
        return sum(h) / len(h) if h else None

    def settled(self, key: str) -> bool:
        """At least ``min_samples`` recent outcomes, all passes or all failures."""
        h = self.history.get(key)
        return h is not None and len(h) >= self.min_samples and (all(h) or not any(h))

    def take_stats(self) -> dict[str, float]:
        """Counts since the last call (``difficulty/...``) and the pool sizes now."""
        counts, self._counts = self._counts, Counter()
        solved = sum(1 for k in self.parked if all(self.history.get(k, ())))
        out = {f"difficulty/{k}": float(counts.get(k, 0)) for k in _COUNTS}
        out.update(
            {
                "difficulty/parked": float(len(self.parked)),
                "difficulty/parked_solved": float(solved),
                "difficulty/parked_unsolved": float(len(self.parked) - solved),
                "difficulty/tracked": float(len(self.history)),
            }
        )
        return out


_COUNTS = ("skipped", "revisited", "parked_new", "forced", "untracked")


def observe_rollouts(requests_fn: Any, rollouts: Sequence[Rollout]) -> None:
    """Hand ``rollouts`` to ``requests_fn.observe`` when it has one (a batch source calls this)."""
    observe = getattr(requests_fn, "observe", None)
    if callable(observe):
        observe(rollouts)


def take_stream_stats(requests_fn: Any) -> dict[str, float]:
    """``requests_fn.take_stats()`` when it has one, else ``{}`` (for ``batch.meta``)."""
    take = getattr(requests_fn, "take_stats", None)
    return dict(take()) if callable(take) else {}
