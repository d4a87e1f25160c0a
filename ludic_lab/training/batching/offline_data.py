"""Turning offline data into :class:`SAWItem` s: saved rollouts, saved items, chat examples.

Accepted ``data``: a list of :class:`Rollout` / :class:`SAWItem` / dict records, a JSONL
path (one record per line), or a ``datasets.Dataset``. A dict record is recognised by its
keys: ``messages`` (chat SFT example, optional ``weight``), ``steps`` (a rollout, as
``Rollout.to_dict``) or ``input_ids`` (a SAWItem, as ``SAWItem.to_dict``).

Weights: rollouts are weighted by the credit assigner (all of them at once, so group
assigners see whole groups); saved SAWItems keep their weights; chat examples get
``weight`` (default 1) times ``ConstantCredit.value`` — any other assigner is an error for
them, since they have no rewards. Rollout steps whose trace has no behaviour logprobs still
become items (logprobs 0, ``meta["has_behaviour_logprobs"] = False``); steps without a trace
are skipped and counted.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ludic_lab.jsonl import is_hf_dataset, read_jsonl
from ludic_lab.rollouts.credit.base import CreditAssigner
from ludic_lab.rollouts.credit.returns import ConstantCredit
from ludic_lab.rollouts.filters import with_sample_meta
from ludic_lab.rollouts.saw import RolloutStepKey, SAWItem
from ludic_lab.training.batching.chat_sft import as_chat_template, sft_item_from_messages
from ludic_lab.types import Rollout


def _is_hf_dataset(data: object) -> bool:
    return is_hf_dataset(data)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path, what="offline data")


def iter_records(data: Any) -> Iterable[Any]:
    """The records of ``data`` (see the module docstring for what ``data`` may be)."""
    if isinstance(data, (str, os.PathLike)):
        return _read_jsonl(Path(data))
    if _is_hf_dataset(data):
        return (dict(row) for row in data)
    if isinstance(data, (Rollout, SAWItem, Mapping)):
        raise TypeError("offline data must be a collection of records; wrap a single record in [...]")
    if isinstance(data, Iterable):
        return data
    raise TypeError(
        f"offline data must be a list of Rollout/SAWItem/dict records, a JSONL path or a datasets.Dataset, "
        f"got {type(data).__name__}"
    )


def _step_weight_items(
    rollouts: list[Rollout], weights: Mapping[RolloutStepKey, float], counts: Counter[str]
) -> list[SAWItem]:
    items: list[SAWItem] = []
    for r in rollouts:
        if r.failed:
            counts["failed_rollouts"] += 1
            continue
        for s in r.steps:
            if (r.id, s.index) not in weights:
                counts["steps_without_weight"] += 1
            elif s.trace is None:
                counts["steps_without_trace"] += 1
            elif not s.trace.completion_token_ids:
                counts["empty_completions"] += 1
            elif s.trace.completion_logprobs is None:
                zeros = (0.0,) * len(s.trace.completion_token_ids)
                step = replace(s, trace=replace(s.trace, completion_logprobs=zeros))
                flag = {"has_behaviour_logprobs": False}
                items.append(SAWItem.from_step(r, step, weights[(r.id, s.index)], meta=flag))
            else:
                items.append(SAWItem.from_step(r, s, weights[(r.id, s.index)]))
    return items


def load_offline_items(
    data: Any,
    credit_assigner: CreditAssigner | None = None,
    *,
    tokenizer: Any = None,
    messages_key: str = "messages",
) -> tuple[list[SAWItem], dict[str, int]]:
    """``(items, counts)`` for ``data``: items in record order (a rollout's steps in step order)
    and the counts of what was skipped and why (plus the assigner's ``credit/...`` counts)."""
    assigner = credit_assigner if credit_assigner is not None else ConstantCredit()
    slots: list[Any] = []  # per record: a Rollout (resolved later) or a list of items
    rollouts: list[Rollout] = []
    template = None
    for n, rec in enumerate(iter_records(data)):
        if isinstance(rec, Rollout):
            rollouts.append(rec)
            slots.append(rec)
        elif isinstance(rec, SAWItem):
            slots.append([rec])
        elif isinstance(rec, Mapping) and messages_key in rec:
            if not isinstance(assigner, ConstantCredit):
                raise ValueError(
                    f"record {n} is a chat example (no rewards) but the credit assigner is "
                    f"{type(assigner).__name__}; use ConstantCredit (SFT) for chat data"
                )
            template = template or as_chat_template(tokenizer)
            w = rec.get("weight")
            weight = (1.0 if w is None else float(w)) * assigner.value
            slots.append(
                [
                    sft_item_from_messages(
                        rec[messages_key], template, weight=weight, rollout_id=f"sft-{n}", meta={"record_index": n}
                    )
                ]
            )
        elif isinstance(rec, Mapping) and "steps" in rec:
            r = Rollout.from_dict(rec)
            rollouts.append(r)
            slots.append(r)
        elif isinstance(rec, Mapping) and "input_ids" in rec:
            slots.append([SAWItem.from_dict(rec)])
        else:
            keys = sorted(rec) if isinstance(rec, Mapping) else type(rec).__name__
            raise ValueError(
                f"offline record {n} is not a rollout ('steps'), a SAWItem ('input_ids') or a chat example "
                f"({messages_key!r}); got {keys}"
            )
    counts: Counter[str] = Counter()
    by_rollout: dict[str, list[SAWItem]] = {}
    if rollouts:
        weights = assigner.compute(rollouts)
        stats = getattr(assigner, "last_stats", None)
        if stats is not None and hasattr(stats, "as_dict"):
            counts.update({f"credit/{k}": v for k, v in stats.as_dict().items() if isinstance(v, int)})
        for it in with_sample_meta(_step_weight_items(rollouts, weights, counts), rollouts):
            by_rollout.setdefault(it.rollout_id, []).append(it)
    items: list[SAWItem] = []
    for slot in slots:
        items.extend(by_rollout.get(slot.id, []) if isinstance(slot, Rollout) else slot)
    return items, dict(counts)
