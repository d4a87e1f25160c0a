"""``RolloutBatchSource``: online RL batches — generate rollouts, assign credit, build items.

One ``next_batch()``: ``requests_fn()`` gives fresh logical requests, the request strategy
expands them (e.g. into GRPO groups), the engine runs the episodes, the credit assigner
weights every step, ``filter_fn`` (optional) drops rollouts after credit is assigned (so
group baselines still saw every sibling), and each weighted step with a token trace becomes
a :class:`SAWItem` whose ``meta`` carries the step's flags (``truncated``, ``parse_error``,
``incomplete_completion``, ``finish_reason``: :func:`~ludic_lab.rollouts.filters.sample_meta`).
``sample_filter`` (optional; e.g. ``drop_truncated & drop_incomplete_completions`` from
:mod:`ludic_lab.rollouts.filters`, or a list) then drops items, again after credit.
Nothing is lost silently: ``batch.meta`` counts every skipped step by reason
(``skipped/...``; sample-filter drops as ``skipped/filtered_samples`` and
``skipped/filtered_samples/<filter name>``), the credit assigner's own counts
(``credit/...``) and the rollout and item statistics
(:mod:`ludic_lab.rollouts.batch_stats`).

``merge_turns=True`` folds a multi-turn rollout's items into one sequence wherever the next
turn's tokens start with the previous turn's (:mod:`ludic_lab.rollouts.turn_merge`): the
trainer scores the shared context once instead of once per turn (``merge/...`` counts what
was folded and where the prefix broke). Per-token values are unchanged, and the trainer still
counts each merged turn as a sequence of its own: the loss is that of the separate turns.

``release_memory`` (a callable; ``train_env`` passes one for its in-process sampler) runs before
a batch's episodes start and once they are done: what one phase left free (the previous step's
activations, the rollouts' KV and prefix cache) is given back before the other runs on top of it.

Empty batches: when fewer than ``min_items`` items come out, the source tries again with
fresh requests, up to ``max_attempts`` generations in total, accumulating items; if still
short it raises :class:`EmptyBatchError` with the reasons. A batch whose weights are all
zero (e.g. every group had equal rewards) is returned, flagged ``all_zero_weight=True``:
the trainer decides whether to skip the step.

``dynamic_sampling=DynamicSampling(min_groups=N, max_rounds=K)`` (DAPO,
:mod:`ludic_lab.rollouts.dynamic_sampling`) replaces that loop: groups whose members
all scored the same reward are dropped and fresh requests are generated until ``N`` groups
with signal are in the batch or ``K`` rounds have run (``dynamic/...`` in ``batch.meta``; a
short batch goes out as it is and the first one warns). A ``requests_fn`` with an
``observe(rollouts)`` method (e.g. :class:`~ludic_lab.rollouts.difficulty_filter.DifficultyFilter`)
is handed every round's rollouts after rewards are applied, and its ``take_stats()`` join
``batch.meta`` (``difficulty/...``).

``rewards=[...]`` (:class:`~ludic_lab.rewards.RolloutReward` / :class:`~ludic_lab.rewards.GroupReward`,
e.g. judges from :mod:`ludic_lab.judges`) are applied by :func:`~ludic_lab.rewards.apply_rewards`
right after generation, before credit: scores land on each rollout's last step, a judge failure
marks its rollout failed (excluded from group statistics and the batch), and ``rewards/...``
stats join ``batch.meta``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.rewards import GroupReward, RolloutReward, apply_rewards, check_rewards
from ludic_lab.rollouts.batch_parts import BatchParts
from ludic_lab.rollouts.batch_source import EmptyBatchError
from ludic_lab.rollouts.credit.base import CreditAssigner
from ludic_lab.rollouts.difficulty_filter import observe_rollouts, take_stream_stats
from ludic_lab.rollouts.dynamic_sampling import DynamicSampler, DynamicSampling
from ludic_lab.rollouts.engine import RolloutEngine
from ludic_lab.rollouts.filters import FilterSpec, as_filter, filter_items, with_sample_meta
from ludic_lab.rollouts.requests import RolloutRequest
from ludic_lab.rollouts.saw import SAWBatch, saw_items_from_rollouts
from ludic_lab.rollouts.strategies import IdentityStrategy, RequestStrategy
from ludic_lab.rollouts.turn_merge import merge_turns
from ludic_lab.types import Rollout

RequestsFn = Callable[[], Sequence[RolloutRequest]]
RolloutFilter = Callable[[Rollout], bool]


def _check_int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"RolloutBatchSource.{name} must be an int >= {lo}, got {v!r}")
    return v


class RolloutBatchSource:
    """Generates one batch per call from fresh rollouts (see the module docstring).

    ``requests_fn()`` must return new requests each call (new seeds, next questions);
    ``max_steps`` is the turn limit for requests without their own; ``concurrency``
    overrides the engine's. ``filter_fn`` drops whole rollouts, ``sample_filter`` single
    items (see :mod:`ludic_lab.rollouts.filters`). After each call ``last_rollouts`` holds every rollout generated
    for that batch (failed ones included), ``last_weights`` the credit assigner's weights of their steps
    (``{(rollout_id, step_index): weight}``) and ``last_stats`` its ``meta``.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        requests_fn: RequestsFn,
        credit_assigner: CreditAssigner,
        *,
        request_strategy: RequestStrategy | None = None,
        max_steps: int = 1,
        concurrency: int | None = None,
        filter_fn: RolloutFilter | None = None,
        sample_filter: FilterSpec = None,
        min_items: int = 1,
        max_attempts: int = 1,
        merge_turns: bool = False,
        release_memory: Callable[[], object] | None = None,
        progress: bool = False,
        rewards: Sequence[RolloutReward | GroupReward] | None = None,
        dynamic_sampling: DynamicSampling | None = None,
    ) -> None:
        if not callable(getattr(engine, "generate_rollouts", None)):
            raise TypeError(f"engine must be a RolloutEngine (has generate_rollouts), got {type(engine).__name__}")
        if not callable(requests_fn):
            raise TypeError(
                "requests_fn must be a callable returning fresh RolloutRequests each call "
                "(e.g. lambda: [RolloutRequest(...)]), got " + type(requests_fn).__name__
            )
        if not callable(getattr(credit_assigner, "compute", None)):
            raise TypeError(f"credit_assigner must have compute(rollouts), got {type(credit_assigner).__name__}")
        if filter_fn is not None and not callable(filter_fn):
            raise TypeError(f"filter_fn must be a callable Rollout -> bool, got {type(filter_fn).__name__}")
        self.engine = engine
        self.requests_fn = requests_fn
        self.credit_assigner = credit_assigner
        self.request_strategy: RequestStrategy = request_strategy or IdentityStrategy()
        self.max_steps = _check_int("max_steps", max_steps, 1)
        self.concurrency = None if concurrency is None else _check_int("concurrency", concurrency, 1)
        self.filter_fn = filter_fn
        self.sample_filter = as_filter(sample_filter)
        self.min_items = _check_int("min_items", min_items, 1)
        self.max_attempts = _check_int("max_attempts", max_attempts, 1)
        if not isinstance(merge_turns, bool):
            raise TypeError(f"RolloutBatchSource.merge_turns must be a bool, got {merge_turns!r}")
        self.merge_turns = merge_turns
        if release_memory is not None and not callable(release_memory):
            raise TypeError(f"RolloutBatchSource.release_memory must be a callable () -> Any, got {release_memory!r}")
        self.release_memory = release_memory
        self.progress = progress
        self.rewards: list[RolloutReward | GroupReward] = _check_rewards(rewards)
        self.dynamic_sampling = dynamic_sampling
        self._dynamic = None if dynamic_sampling is None else DynamicSampler(dynamic_sampling)
        if self._dynamic is not None and (min_items, max_attempts) != (1, 1):
            raise ValueError(
                "RolloutBatchSource: with dynamic_sampling, DynamicSampling.min_groups / max_rounds take the "
                f"place of min_items / max_attempts; leave those at 1 (got min_items={min_items}, "
                f"max_attempts={max_attempts})"
            )
        self.last_rollouts: list[Rollout] = []
        self.last_weights: dict[tuple[str, int], float] = {}
        self.last_stats: dict[str, Any] = {}
        self.batches_served = 0

    def __repr__(self) -> str:
        return (
            f"RolloutBatchSource(credit={self.credit_assigner!r}, strategy={self.request_strategy!r}, "
            f"max_steps={self.max_steps}, min_items={self.min_items}, max_attempts={self.max_attempts})"
        )

    def _requests(self) -> list[RolloutRequest]:
        logical = self.requests_fn()
        if isinstance(logical, RolloutRequest) or not isinstance(logical, (list, tuple)):
            raise TypeError(f"requests_fn() must return a list of RolloutRequest, got {type(logical).__name__}")
        if not logical:
            raise ValueError("requests_fn() returned no requests; it must return at least one RolloutRequest")
        return self.request_strategy.expand(logical)

    def draw_requests(self) -> list[RolloutRequest]:
        """One round of requests: ``requests_fn()`` expanded by the request strategy (in order)."""
        return self._requests()

    async def generate(
        self, requests: Sequence[RolloutRequest], *, semaphore: asyncio.Semaphore | None = None
    ) -> tuple[list[Rollout], dict[str, Any], float]:
        """Run ``requests`` through the engine, then the rewards: ``(rollouts, reward stats,
        seconds generating)``. ``semaphore`` (optional) bounds episodes across concurrent calls."""
        t0 = time.perf_counter()
        shared: dict[str, Any] = {} if semaphore is None else {"semaphore": semaphore}  # engines without it work
        new = await self.engine.generate_rollouts(
            requests, max_steps=self.max_steps, concurrency=self.concurrency, progress=self.progress, **shared
        )
        gen_s = time.perf_counter() - t0
        reward_stats: dict[str, Any] = {}
        if self.rewards:
            new, reward_stats = await apply_rewards(new, self.rewards)
        return new, reward_stats, gen_s

    def itemise(self, parts: BatchParts, new: list[Rollout], dyn: Any = None) -> None:
        """Add one round's rollouts to ``parts``: observed by ``requests_fn``, credited,
        filtered, itemised (``dyn``: a dynamic-sampling round keeps the groups with signal)."""
        t1 = time.perf_counter()
        parts.attempts += 1
        parts.rollouts.extend(new)
        observe_rollouts(self.requests_fn, new)  # e.g. a DifficultyFilter's pass rates
        weights = self.credit_assigner.compute(new)
        parts.weights.update(weights)
        stats = getattr(self.credit_assigner, "last_stats", None)
        if stats is not None and hasattr(stats, "as_dict"):
            parts.credit.update({k: v for k, v in stats.as_dict().items() if isinstance(v, int)})
        kept = new
        if self.filter_fn is not None:
            kept = [r for r in new if r.failed or self.filter_fn(r)]
            parts.skipped["filtered_rollouts"] += len(new) - len(kept)
        new_items, counts = saw_items_from_rollouts(kept, weights)
        new_items = with_sample_meta(new_items, kept)
        if self.sample_filter is not None:
            new_items, dropped = filter_items(new_items, self.sample_filter)
            parts.skipped["filtered_samples"] += sum(dropped.values())
            parts.skipped.update({f"filtered_samples/{k}": v for k, v in dropped.items()})
        if self.merge_turns:
            new_items, merge_stats = merge_turns(new_items)
            parts.merged.update(merge_stats.as_dict())
        if dyn is not None:  # keep only the groups with signal
            new_items = dyn.add(new_items, kept)
        parts.credit_s += time.perf_counter() - t1
        parts.skipped.update(counts)
        parts.items.extend(new_items)

    async def next_batch(self) -> SAWBatch:
        """Generate, credit and itemise rollouts until ``min_items`` items (or ``max_attempts``).

        Raises :class:`EmptyBatchError` (with ``reasons`` and ``stats``) when still short.
        """
        parts = BatchParts()
        dyn = self._dynamic.start() if self._dynamic is not None else None
        if self.release_memory is not None:
            self.release_memory()  # what the previous step left free, before the rollouts
        while dyn.wants_more() if dyn is not None else self.wants_more(parts):
            new, reward_stats, gen_s = await self.generate(self.draw_requests())
            parts.gen_s += gen_s
            parts.add_rewards(reward_stats)
            self.itemise(parts, new, dyn)
        if self.release_memory is not None:
            self.release_memory()  # what the rollouts left, before the step
        return self.finish(parts, dyn)

    def wants_more(self, parts: BatchParts) -> bool:
        """Without dynamic sampling: whether ``parts`` is short of ``min_items`` with attempts left."""
        return parts.attempts < self.max_attempts and len(parts.items) < self.min_items

    def finish(self, parts: BatchParts, dyn: Any = None, extra: dict[str, Any] | None = None) -> SAWBatch:
        """The batch of ``parts`` (``meta`` with ``extra``); ``last_rollouts`` / ``last_weights`` /
        ``last_stats`` set. Raises :class:`EmptyBatchError` below ``min_items`` (without dynamic sampling)."""
        dyn_meta: dict[str, Any] = {}
        if dyn is not None:
            parts.items, dyn_meta = dyn.finish()
        meta = parts.meta({**dyn_meta, **take_stream_stats(self.requests_fn), **(extra or {})})
        self.last_rollouts = parts.rollouts
        self.last_weights = parts.weights
        self.last_stats = meta
        if self._dynamic is not None:
            self._dynamic.note(meta)  # a short batch goes out as it is (warned once)
        elif len(parts.items) < self.min_items:
            reasons = {k: v for k, v in parts.skipped.items() if v}
            raise EmptyBatchError(
                f"RolloutBatchSource: {len(parts.items)} item(s) after {parts.attempts} attempt(s), need min_items="
                f"{self.min_items}; {len(parts.rollouts)} rollouts generated, {meta['num_failed_rollouts']} failed; "
                f"steps/rollouts lost: {reasons or 'none'}. Look at source.last_rollouts (Rollout.error, "
                f"meta['error_traceback']); raise max_attempts if a filter rejects most rollouts.",
                reasons=reasons,
                stats=meta,
            )
        self.batches_served += 1
        return SAWBatch(items=tuple(parts.items), meta=meta)

    def next_batch_sync(self) -> SAWBatch:
        """Blocking :meth:`next_batch` (scripts and Jupyter cells alike, via ``run_sync``)."""
        return run_sync(self.next_batch())

    def state_dict(self) -> dict[str, Any]:
        """Where the source is, for a checkpoint (the trainer saves it): ``batches_served`` and
        the ``state_dict()`` of ``requests_fn`` (e.g. a :class:`~ludic_lab.task.RequestStream`'s
        cursor) and of the request strategy (its seed RNG), where they have one."""
        out: dict[str, Any] = {"batches_served": self.batches_served}
        for key, part in (("requests", self.requests_fn), ("strategy", self.request_strategy)):
            save = getattr(part, "state_dict", None)
            if callable(save):
                out[key] = save()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next batch asks for the requests the saved run would
        have asked for next (parts without a ``load_state_dict`` start afresh)."""
        self.batches_served = int(state.get("batches_served", 0))
        for key, part in (("requests", self.requests_fn), ("strategy", self.request_strategy)):
            load = getattr(part, "load_state_dict", None)
            if key in state and callable(load):
                load(state[key])


def _check_rewards(rewards: Any) -> list[RolloutReward | GroupReward]:
    if rewards is None:
        return []
    if isinstance(rewards, (RolloutReward, GroupReward)) or not isinstance(rewards, (list, tuple)):
        raise TypeError(
            f"RolloutBatchSource.rewards must be a list of RolloutReward / GroupReward, got {type(rewards).__name__}"
        )
    check_rewards(rewards)
    return list(rewards)
