"""Sample filters: which :class:`SAWItem` s a batch source keeps (the reference's ``training/filters.py``).

A filter is any callable ``item -> bool`` that returns ``True`` to **keep** the item. The
shipped ones read flags a rollout source writes into ``item.meta`` (:func:`sample_meta`):

- :data:`drop_truncated`: the step that was truncated (``max_steps``, an env time limit):
  the episode ended there by a limit, not by the task, so that step never saw an outcome.
  Only that step goes, as in Ludic; the episode's other steps stay (to drop a truncated
  episode whole, filter on ``item.meta["episode_truncated"]``);
- :data:`drop_parse_errors`: the step's reply was rejected by the parser (env not called);
- :data:`drop_incomplete_completions`: the completion was cut at ``max_tokens``
  (``finish_reason == "length"``).

Combine them with ``&`` / ``|`` / ``~`` (``drop_truncated & drop_parse_errors``), with
:func:`combine` / :func:`any_of`, or pass a list (all must keep). :func:`filter_items`
applies one and says *why* each dropped item went (the name of the first filter that
rejected it), so sources count every drop in ``batch.meta`` — nothing disappears silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.types import Rollout, Step

SampleFilter = Callable[[SAWItem], bool]
"""``item -> bool``: ``True`` keeps the item."""

FilterSpec = SampleFilter | Sequence[SampleFilter] | None
"""What ``sample_filter=`` accepts: a filter, a list of filters (all must keep), or ``None``."""


class ItemFilter:
    """A named keep-predicate over :class:`SAWItem` s that composes with ``&``, ``|`` and ``~``.

    ``name`` is what ``batch.meta`` counts its drops under (``skipped/filtered_samples/<name>``).
    """

    def __init__(self, fn: SampleFilter, name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"ItemFilter needs a callable item -> bool, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or filter_name(fn)

    def __call__(self, item: SAWItem) -> bool:
        return bool(self.fn(item))

    def rejected_by(self, item: SAWItem) -> str | None:
        """``None`` when the item is kept, else the name of the filter that dropped it."""
        return None if self(item) else self.name

    def __and__(self, other: SampleFilter) -> ItemFilter:
        return combine(self, other)

    def __rand__(self, other: SampleFilter) -> ItemFilter:
        return combine(other, self)

    def __or__(self, other: SampleFilter) -> ItemFilter:
        return any_of(self, other)

    def __ror__(self, other: SampleFilter) -> ItemFilter:
        return any_of(other, self)

    def __invert__(self) -> ItemFilter:
        return ItemFilter(lambda item: not self(item), name=f"not({self.name})")

    def __repr__(self) -> str:
        return f"ItemFilter({self.name})"


class _AllOf(ItemFilter):
    """Keeps an item only if every part keeps it; a drop is blamed on the first part that rejected."""

    def __init__(self, parts: Sequence[SampleFilter]) -> None:
        self.parts = tuple(_flatten(parts))
        super().__init__(self._keep, name=" & ".join(filter_name(p) for p in self.parts) or "keep_all")

    def _keep(self, item: SAWItem) -> bool:
        return all(p(item) for p in self.parts)

    def rejected_by(self, item: SAWItem) -> str | None:
        for p in self.parts:
            why = p.rejected_by(item) if isinstance(p, ItemFilter) else (None if p(item) else filter_name(p))
            if why is not None:
                return why
        return None


def _flatten(parts: Iterable[SampleFilter]) -> list[SampleFilter]:
    out: list[SampleFilter] = []
    for p in parts:
        if not callable(p):
            raise TypeError(f"a sample filter must be a callable item -> bool, got {type(p).__name__}")
        out.extend(p.parts if isinstance(p, _AllOf) else (p,))
    return out


def filter_name(f: Any) -> str:
    """The name a filter's drops are counted under: ``f.name``, else ``f.__name__``, else its type."""
    name = getattr(f, "name", None) or getattr(f, "__name__", None) or type(f).__name__
    return str(name)


def combine(*filters: SampleFilter) -> ItemFilter:
    """AND: an item is kept only if *all* filters keep it (``combine()`` keeps everything)."""
    return _AllOf(filters)


def any_of(*filters: SampleFilter) -> ItemFilter:
    """OR: an item is kept if *any* filter keeps it."""
    if not filters:
        raise ValueError("any_of needs at least one filter")
    parts = _flatten(filters)
    return ItemFilter(
        lambda item: any(p(item) for p in parts), name="any_of(" + ", ".join(map(filter_name, parts)) + ")"
    )


def as_filter(spec: FilterSpec) -> ItemFilter | None:
    """Normalise a ``sample_filter=`` argument: ``None``, a callable, or a list/tuple (AND)."""
    if spec is None:
        return None
    if isinstance(spec, ItemFilter):
        return spec
    if isinstance(spec, (list, tuple)):
        return combine(*spec)
    if callable(spec):
        return ItemFilter(spec)
    raise TypeError(
        "sample_filter must be a callable SAWItem -> bool (True keeps), a list of them, or None; "
        f"got {type(spec).__name__}"
    )


def filter_items(items: Sequence[SAWItem], spec: FilterSpec) -> tuple[list[SAWItem], dict[str, int]]:
    """``(kept, dropped)``: the items ``spec`` keeps, and how many were dropped per filter name."""
    f = as_filter(spec)
    if f is None:
        return list(items), {}
    kept: list[SAWItem] = []
    dropped: dict[str, int] = {}
    for it in items:
        why = f.rejected_by(it)
        if why is None:
            kept.append(it)
        else:
            dropped[why] = dropped.get(why, 0) + 1
    return kept, dropped


def apply_filter(items: Sequence[SAWItem], sample_filter: SampleFilter) -> list[SAWItem]:
    """The items ``sample_filter`` keeps (the reference's name; :func:`filter_items` also counts)."""
    return filter_items(items, sample_filter)[0]


# -- the flags the shipped filters read ------------------------------------------------------


def sample_meta(rollout: Rollout, step: Step) -> dict[str, Any]:
    """Flags of one step that the shipped filters read, for ``item.meta`` (Ludic's keys).

    ``truncated`` / ``terminated``: this step's own flags; ``episode_truncated``: the episode
    ended truncated (its last step is truncated and not terminated) and ``truncation_reason``
    why (``"max_steps"``, ``"agent_inactive"``, ... from the step's info, else ``"env"``;
    ``None`` when it did not); ``step_truncated``: an alias of ``truncated``; ``parse_error``:
    the reply was rejected; ``incomplete_completion`` / ``finish_reason``: cut at ``max_tokens``.
    """
    last = rollout.steps[-1] if rollout.steps else step
    finish = step.trace.finish_reason if step.trace is not None else None
    info = step.info or {}
    agent = info.get("agent")
    agent_info = agent if isinstance(agent, Mapping) else {}
    finish = finish or agent_info.get("finish_reason")
    episode_truncated = bool(last.truncated and not last.terminated)
    reason = (last.info or {}).get("truncation_reason", "env") if episode_truncated else None
    return {
        "truncated": bool(step.truncated),
        "terminated": bool(step.terminated),
        "episode_truncated": episode_truncated,
        "truncation_reason": reason,
        "step_truncated": bool(step.truncated),
        "parse_error": bool(info.get("parse_error", False)),
        "incomplete_completion": bool(info.get("incomplete_completion", False)) or finish == "length",
        "finish_reason": finish,
    }


def with_sample_meta(items: Sequence[SAWItem], rollouts: Sequence[Rollout]) -> list[SAWItem]:
    """``items`` with their step's flags (:func:`sample_meta`) in
    ``meta``; keys the item already has win."""
    steps = {(r.id, s.index): (r, s) for r in rollouts for s in r.steps}
    out: list[SAWItem] = []
    for it in items:
        found = steps.get((it.rollout_id, it.step_index))
        out.append(it if found is None else replace(it, meta={**sample_meta(*found), **it.meta}))
    return out


def _keep_all(item: SAWItem) -> bool:
    return True


def _drop_truncated(item: SAWItem) -> bool:
    return not item.meta.get("truncated", False)


def _drop_parse_errors(item: SAWItem) -> bool:
    return not item.meta.get("parse_error", False)


def _drop_incomplete_completions(item: SAWItem) -> bool:
    return not (item.meta.get("incomplete_completion", False) or item.meta.get("finish_reason") == "length")


keep_all = ItemFilter(_keep_all, "keep_all")
"""Keeps every item."""
drop_truncated = ItemFilter(_drop_truncated, "drop_truncated")
"""Drops the items of truncated steps (``item.meta["truncated"]``: the step's own flag); the
episode's earlier steps stay. Whole truncated episodes: ``item.meta["episode_truncated"]``."""
drop_parse_errors = ItemFilter(_drop_parse_errors, "drop_parse_errors")
"""Drops items whose reply the parser rejected (``item.meta["parse_error"]``)."""
drop_incomplete_completions = ItemFilter(_drop_incomplete_completions, "drop_incomplete_completions")
"""Drops items whose completion was cut at ``max_tokens`` (``finish_reason == "length"``)."""
