"""HTML views of SAW items and batches: the per-token weights the loss will see.

Tokens are coloured by ``weights[t] * action_mask[t]`` on a diverging scale centred on 0,
fixed across a group (siblings share ``max |w|``); masked tokens are grey; hover shows token
id, behaviour logprob, ratio (when the current policy's logprobs are given) and advantage.
Siblings (same ``group_id``) are shown side by side with their reward and advantage.
Given the rollouts the items came from (``rollouts=source.last_rollouts``), each card also
shows, under its tokens, one line per reward applied to its step (a judge's score and
verdicts), as the rollout view does; items point at their step by ``(rollout_id, step_index)``.
No torch here: ``logprobs`` are plain per-item float sequences aligned with ``input_ids``.

:func:`saw_item_html` and :func:`saw_batch_html` are the notebook views of
:class:`~ludic_lab.rollouts.saw.SAWItem` and :class:`~ludic_lab.rollouts.saw.SAWBatch`:
``ludic_lab`` registers them (:mod:`ludic_lab.display`) when the package loads;
``ludic_lab.rollouts.saw`` itself imports no HTML.

Example::

    from ludic_lab.lab.saw_html import saw_batch_html
    saw_batch_html(batch, tokenizer=client)                      # str
    saw_batch_html(batch, tokenizer=client, logprobs=current)    # + ratios on hover
    saw_batch_html(batch, tokenizer=client, rollouts=source.last_rollouts)  # + judge lines
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from ludic_lab.lab.rollout_html import CUT_NOTE, rewards_html
from ludic_lab.lab.token_html import fmt, legend_html, resolve_tokenizer, scale_of, sequence_html, view_html
from ludic_lab.rollouts.saw import SAWBatch, SAWItem
from ludic_lab.types import Rollout, Step


def _effective(it: SAWItem) -> list[float]:
    return [w * m for w, m in zip(it.weights, it.action_mask, strict=False)]


def item_ratios(it: SAWItem, logprobs: Sequence[float] | None) -> list[float | None] | None:
    """``exp(logprob - behaviour_logprob)`` on action tokens (``None`` elsewhere), or ``None``
    without ``logprobs``; ``logprobs`` must align with ``it.input_ids``."""
    if logprobs is None:
        return None
    if len(logprobs) != it.num_tokens:
        raise ValueError(f"logprobs has {len(logprobs)} entries for an item of {it.num_tokens} tokens")
    return [
        math.exp(float(lp) - b) if m else None
        for lp, b, m in zip(logprobs, it.behaviour_logprobs, it.action_mask, strict=False)
    ]


def steps_by_key(rollouts: Sequence[Rollout] | None) -> dict[tuple[str, int], Step]:
    """Each step of ``rollouts`` under the key SAW items point at it by:
    ``(rollout_id, step_index)`` (empty without rollouts)."""
    return {(r.id, s.index): s for r in rollouts or () for s in r.steps}


def _card(it: SAWItem, tok: Any, scale: float, logprobs: Sequence[float] | None, step: Step | None = None) -> str:
    adv = it.weight
    bits = [
        f"<b>reward {fmt(it.reward)}</b>",
        f"adv <b>{fmt(adv)}</b>",
        f"{it.num_tokens} tokens ({it.num_action_tokens} action)",
    ]
    if it.meta.get("finish_reason") == "length":
        bits.append("<span class='ll-err' title='cut at max_tokens: see the note above the cards'>cut</span>")
    if it.policy_version is not None:
        bits.append(f"policy v{it.policy_version}")
    if it.rollout_id:
        bits.append(
            f"<span title='{html.escape(it.rollout_id, quote=True)}'>{html.escape(it.rollout_id[:8])}"
            f"/step {it.step_index}</span>"
        )
    body = sequence_html(
        it.input_ids,
        tokenizer=tok,
        mask=it.action_mask,
        weights=it.weights,
        logprobs=[b if m else None for b, m in zip(it.behaviour_logprobs, it.action_mask, strict=False)],
        ratios=item_ratios(it, logprobs),
        advantage=adv,
        scale=scale,
    )
    return (
        f"<div class='ll-card' data-rollout-id='{html.escape(it.rollout_id, quote=True)}' "
        f"data-reward='{it.reward!r}' data-adv='{adv!r}'><div class='ll-head'>{' · '.join(bits)}</div>{body}"
        f"{'' if step is None else rewards_html(step.info)}</div>"
    )


def _grouped(items: Sequence[tuple[int, SAWItem]]) -> list[list[tuple[int, SAWItem]]]:
    groups: dict[Any, list[tuple[int, SAWItem]]] = {}
    for k, it in items:
        groups.setdefault(it.group_id if it.group_id is not None else ("__single__", k), []).append((k, it))
    return list(groups.values())


def _selected(items: list[SAWItem], show: Sequence[SAWItem] | None, max_items: int) -> list[tuple[int, SAWItem]]:
    """``(index, item)`` of the items to draw: the first ``max_items``, or those of ``show``
    (items of ``items``, matched by identity or equality), in the batch's order."""
    if show is None:
        return list(enumerate(items[:max_items]))
    picked = list(show)
    ids = {id(it) for it in picked}
    out = [(k, it) for k, it in enumerate(items) if id(it) in ids or it in picked]
    if len(out) < len({id(it) for it in picked}):
        raise ValueError(
            f"show: {len(picked) - len(out)} of the {len(picked)} items to show are not items of the batch given; "
            "pass the whole batch and the items to show from it, e.g. credit_view(batch, show=batch.items[:4])"
        )
    return out


def _group_head(gid: str, group: Sequence[SAWItem], n_shown: int, scale: float) -> str:
    """A group's header from the whole group: its size (and how many are shown), mean reward, scale."""
    rewards = [it.reward for it in group]
    n = len(group)
    size = f"{n} sibling{'s' if n != 1 else ''}" + ("" if n_shown == n else f", {n_shown} shown")
    mean = f"reward mean {fmt(sum(rewards) / n)}" + ("" if n_shown == n else f" (all {n})")
    return (
        f"<div class='ll-ghead' data-group-size='{n}' data-shown='{n_shown}'>group "
        f"<b>{html.escape(gid[:12])}</b> · {size} · {mean} · scale ±{scale:.3g}</div>"
    )


def _cut_note(items: Sequence[SAWItem]) -> str:
    """A note on the shown items whose reply was cut at ``max_tokens`` (finish reason ``length``):
    what such a reward means, next to the cards that carry it."""
    cut = [it for it in items if it.meta.get("finish_reason") == "length"]
    if not cut:
        return ""
    return f"<div class='ll-head ll-cut-note'>{CUT_NOTE.format(n=len(cut), total=len(items))}</div>"


def saw_batch_html(
    batch: SAWBatch | Sequence[SAWItem] | SAWItem,
    *,
    tokenizer: Any = None,
    logprobs: Sequence[Sequence[float]] | None = None,
    max_items: int = 64,
    title: str | None = None,
    rollouts: Sequence[Rollout] | None = None,
    show: Sequence[SAWItem] | None = None,
) -> str:
    """The credit view of a batch (or items, or one item): groups of siblings side by side,
    one colour scale per group; ``logprobs[i]`` (current policy, aligned with item ``i``'s
    ``input_ids``) adds ratios; ``rollouts`` (those the items came from) adds each step's
    reward lines under its card. ``show``: the items of ``batch`` to draw (default all, at most
    ``max_items``); a group's header, mean reward and colour scale are always the whole group's,
    with how many of its siblings are shown."""
    if isinstance(batch, SAWItem):
        items: list[SAWItem] = [batch]
        meta: dict[str, Any] = {}
    elif isinstance(batch, SAWBatch):
        items, meta = list(batch.items), dict(batch.meta)
    else:
        items, meta = list(batch), {}
    if logprobs is not None and len(logprobs) != len(items):
        raise ValueError(f"logprobs has {len(logprobs)} sequences for {len(items)} items")
    tok = resolve_tokenizer(tokenizer)
    steps = steps_by_key(rollouts)
    if rollouts is not None and items and not any((it.rollout_id, it.step_index) in steps for it in items):
        raise ValueError(
            f"rollouts: none of the {len(rollouts)} rollouts given is one the items came from (matched by "
            "rollout_id and step_index); pass the rollouts of this batch, e.g. rollouts=source.last_rollouts "
            "right after source.next_batch()"
        )
    shown = _selected(items, show, max_items)
    parts = []
    if title:
        parts.append(f"<h3>{html.escape(title)}</h3>")
    if len(items) > 1 or meta:
        n_tok = sum(it.num_tokens for it in items)
        n_act = sum(it.num_action_tokens for it in items)
        summ = [f"<b>{len(items)} item(s)</b>", f"{n_tok} tokens", f"{n_act} action tokens"]
        summ += [
            f"{html.escape(str(k))} {v:.4g}"
            for k, v in list(meta.items())[:6]
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        parts.append(f"<div class='ll-head'>{' · '.join(summ)}</div>")
    if tok is None:
        parts.append(
            "<div class='ll-head'>token ids shown: call "
            "<code>ludic_lab.lab.token_html.set_display_tokenizer(tokenizer)</code> "
            "or pass <code>tokenizer=</code> to see text</div>"
        )
    whole = {id(g[0][1]): g for g in _grouped(list(enumerate(items)))}
    of_group = {id(it): whole[id(g[0][1])] for g in whole.values() for _, it in g}
    parts.append(legend_html(scale_of([w for _, it in shown for w in _effective(it)])))
    parts.append(_cut_note([it for _, it in shown]))
    for group in _grouped(shown):
        full = of_group[id(group[0][1])]  # every sibling in the batch, shown or not
        scale = scale_of([w for _, it in full for w in _effective(it)])
        gid = group[0][1].group_id
        if gid is not None:
            parts.append(_group_head(str(gid), [it for _, it in full], len(group), scale))
        cards = "".join(
            _card(it, tok, scale, None if logprobs is None else logprobs[k], steps.get((it.rollout_id, it.step_index)))
            for k, it in group
        )
        parts.append(
            f"<div class='ll-group' data-group-id='{html.escape(str(gid), quote=True)}' "
            f"data-scale='{scale!r}'>{cards}</div>"
        )
    if show is None and len(items) > max_items:
        parts.append(
            f"<div class='ll-head'>… {len(items) - max_items} more item(s) not shown (max_items={max_items})</div>"
        )
    return view_html("".join(parts))


def saw_item_html(item: SAWItem, **kw: Any) -> str:
    """The credit view of one item (what ``SAWItem._repr_html_`` shows); see :func:`saw_batch_html`."""
    return saw_batch_html(item, **kw)
