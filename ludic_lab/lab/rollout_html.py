"""HTML views of rollouts (layer 7, lab): one rollout, or groups of siblings side by side.

A step's prompt tokens are masked (grey, folded); its completion tokens are coloured by the
step's credit when ``weights`` (a credit assigner's ``{(rollout_id, step_index): weight}``)
is given, else left white, with token id and behaviour logprob on hover. Thinking tokens
(``<think>`` blocks) are italic and underlined: sampled and trained like the answer, shown
apart from it, and the step's reasoning is listed under its tokens. Rollouts that
share a ``group_id`` are shown side by side with one colour scale (the group's max ``|w|``).

:func:`rollout_html` is :class:`~ludic_lab.types.Rollout`'s notebook view: ``ludic_lab``
registers it (:mod:`ludic_lab.display`) when the package loads, so ``Rollout._repr_html_``
shows it whatever was imported; ``ludic_lab.types`` itself imports no HTML.

Example::

    from ludic_lab.lab.rollout_html import rollouts_html
    HTMLView(rollouts_html(rollouts, weights=GroupNormalizedReturn()(rollouts), tokenizer=client))
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.lab.token_html import (
    fmt,
    legend_html,
    resolve_tokenizer,
    scale_of,
    sequence_html,
    token_pieces,
    view_html,
)
from ludic_lab.rollout_table import step_reasoning
from ludic_lab.types import Rollout, Step

Weights = Mapping[tuple[str, int], float]
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)

CUT_NOTE = (
    "<b>{n} of {total}</b> replies shown were cut at <code>max_tokens</code> (marked <i>cut</i>). What a cut "
    "reply scores depends on who ends the turn: an agent that rejects incomplete completions (ludic_lab's "
    "<code>Agent</code> by default, as in Ludic) never hands it to the env and scores it with its penalty "
    "(-0.1 by default), so in a right-or-wrong task a right answer that ran on is pushed below a complete "
    "wrong one (0); with <code>reject_incomplete_completions=False</code>, or a harness of another package, "
    "the env judges the cut text. Raise <code>max_tokens</code> to cut fewer."
)
"""What a cut reply's reward means, shown above the cards when any of them was cut."""


def reasoning_mask(ids: Sequence[int], tokenizer: Any) -> list[int] | None:
    """1 for each of ``ids`` inside a ``<think>...</think>`` block (tags included), else 0;
    ``None`` without a tokenizer or without a block."""
    if tokenizer is None:
        return None
    pieces = token_pieces(ids, tokenizer)
    spans = [m.span() for m in _THINK.finditer("".join(p.text for p in pieces))]
    if not spans:
        return None
    out, pos = [0] * len(ids), 0
    for p in pieces:
        end = pos + len(p.text)
        if any(a < end and pos < b for a, b in spans):
            out[p.start : p.stop] = [1] * (p.stop - p.start)
        pos = end
    return out


def _reasoning_html(s: Step) -> str:
    reasoning, answer = step_reasoning(s)
    if reasoning is None:
        return ""
    return (
        f"<details><summary>reasoning · {len(reasoning)} chars (sampled and trained; answer: "
        f"{html.escape(answer[:80])}{'…' if len(answer) > 80 else ''})</summary>"
        f"<div class='ll-msg ll-think' data-reasoning='1'>{html.escape(reasoning)}</div></details>"
    )


def _step_html(r: Rollout, s: Step, weights: Weights | None, tok: Any, scale: float) -> str:
    w = None if weights is None else weights.get((r.id, s.index))
    flags = [f for f, on in (("terminated", s.terminated), ("truncated", s.truncated)) if on]
    if s.info.get("incomplete_completion"):
        rejected = s.parsed_action is None and bool(s.info.get("parse_error"))
        flags.append(
            "<span class='ll-err'>cut</span> at max_tokens: "
            + ("the agent's penalty, not judged by the env" if rejected else "the env judged the cut reply")
        )
    elif s.info.get("parse_error"):
        flags.append("parse error")
    observed = bool(s.info.get("observation_only"))
    if observed:
        flags.append("observation only: what the env told the agent after its rejected reply")
    tools = (s.info.get("agent") or {}).get("tools") if isinstance(s.info.get("agent"), dict) else None
    if isinstance(tools, dict) and tools.get("calls"):
        failed = f", {tools.get('failed', 0)} failed" if tools.get("failed") else ""
        flags.append(f"{tools['calls']} tool call(s){failed} (results grey: context, not trained)")
    head = (
        f"<div class='ll-head'><b>step {s.index}</b> · reward {fmt(s.reward)} "
        f"(env {fmt(s.env_reward)}, format {fmt(s.format_reward)})"
        + ("" if w is None else f" · weight <b>{fmt(w)}</b>")
        + ("" if not flags else " · " + ", ".join(flags))
        + "</div>"
    )
    tr = s.trace
    if observed:
        body = f"<div class='ll-msg'>{html.escape(s.prev_obs)}</div><div class='ll-head'>(no action: not trained)</div>"
    elif tr is None:
        body = (
            f"<div class='ll-msg'>{html.escape(s.action)}</div>"
            "<div class='ll-head'>(no token trace: sampled without token ids)</div>"
        )
    else:
        P = len(tr.prompt_token_ids)
        sampled = list(tr.sampled_mask)  # a tool turn's inserted results are 0: context, grey
        lps = tr.completion_logprobs
        thinking = reasoning_mask(tr.completion_token_ids, tok)
        body = sequence_html(
            tr.input_ids,
            tokenizer=tok,
            mask=[0] * P + sampled,
            weights=None if w is None else [0.0] * P + [float(w) * m for m in sampled],
            logprobs=None
            if lps is None
            else [None] * P + [lp if m else None for m, lp in zip(sampled, lps, strict=False)],
            advantage=w,
            scale=scale,
            prompt_label=f"prompt ({tr.prompt_source})",
            reasoning=None if thinking is None else [0] * P + thinking,
        )
    parsed = (
        "(none)"
        if observed
        else "<span class='ll-err'>parse error</span>"
        if s.parsed_action is None
        else html.escape(repr(s.parsed_action))
    )
    tail = f"<div class='ll-head'>parsed: {parsed}"
    if s.next_obs is not None:
        tail += f" · next obs: <span class='ll-msg' style='display:inline'>{html.escape(s.next_obs)}</span>"
    elif isinstance(s.info.get("final_obs"), str):  # the episode ended here: next_obs is None
        tail += f" · final obs: <span class='ll-msg' style='display:inline'>{html.escape(s.info['final_obs'])}</span>"
    return head + body + ("" if observed else _reasoning_html(s)) + tail + "</div>" + rewards_html(s.info)


def rewards_html(info: Mapping[str, Any]) -> str:
    """One line per reward applied to the step (:mod:`ludic_lab.rewards`): its score and
    weight, a judge's verdicts and reasoning, or why it failed."""
    scores = info.get("rewards") or {}
    weights = info.get("reward_weights") or {}
    details = info.get("reward_info") or {}
    failures = info.get("reward_failures") or {}
    lines = []
    for name in dict.fromkeys([*scores, *failures]):
        raw = details.get(name)
        d: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if name in failures:
            what = f"<span class='ll-err'>failed: {html.escape(str(failures[name]))}</span>"
        else:
            what = f"<b>{fmt(float(scores[name]))}</b> (weight {float(weights.get(name, 1.0)):g})"
        verdicts = d.get("verdicts")
        if isinstance(verdicts, dict):
            what += " · " + html.escape(", ".join(f"{k}: {v}" for k, v in verdicts.items()))
        for key in ("rank", "judge_score"):
            if key in d:
                what += f" · {key} {html.escape(str(d[key]))}"
        if isinstance(d.get("reasoning"), str) and d["reasoning"]:
            what += f" · <i>{html.escape(d['reasoning'])}</i>"
        lines.append(f"<div class='ll-head'>{html.escape(str(name))}: {what}</div>")
    return "".join(lines)


def _card_html(r: Rollout, weights: Weights | None, tok: Any, scale: float) -> str:
    ws = [weights[(r.id, s.index)] for s in r.steps if weights is not None and (r.id, s.index) in weights]
    adv = ""
    if ws:
        adv = f" · adv <b>{fmt(ws[0])}</b>" if len(set(ws)) == 1 else " · adv per step"
    meta = " · ".join(
        f"{k} {v}"
        for k, v in (("env_seed", r.env_seed), ("sampling_seed", r.sampling_seed), ("policy v", r.policy_version))
        if v is not None
    )
    head = (
        f"<div class='ll-head'><b>reward {fmt(r.total_reward)}</b>{adv} · {r.length} step(s)"
        + (f" · {html.escape(meta)}" if meta else "")
        + f" · <span title='{html.escape(r.id, quote=True)}'>id {html.escape(r.id[:8])}</span></div>"
    )
    err = f"<div class='ll-err'>failed: {html.escape(r.error)}</div>" if r.error else ""
    steps = "".join(_step_html(r, s, weights, tok, scale) for s in r.steps)
    return (
        f"<div class='ll-card' data-rollout-id='{html.escape(r.id, quote=True)}' data-reward='{r.total_reward!r}'>"
        f"{head}{err}{steps}</div>"
    )


def _group_scale(rollouts: Sequence[Rollout], weights: Weights | None) -> float:
    if weights is None:
        return 1.0
    return scale_of([weights.get((r.id, s.index), 0.0) for r in rollouts for s in r.steps])


def _groups(rollouts: Sequence[Rollout]) -> list[tuple[str | None, list[Rollout]]]:
    order: dict[Any, list[Rollout]] = {}
    for r in rollouts:
        key = r.group_id if r.group_id is not None else ("__single__", r.id)
        order.setdefault(key, []).append(r)
    return [(rs[0].group_id, rs) for rs in order.values()]


def rollouts_html(
    rollouts: Sequence[Rollout] | Rollout,
    *,
    weights: Weights | None = None,
    tokenizer: Any = None,
    max_rollouts: int = 64,
    title: str | None = None,
    show: Sequence[Rollout] | None = None,
) -> str:
    """The token view of ``rollouts``: groups (by ``group_id``) of sibling cards side by side,
    each with reward, advantage and its steps' tokens; one colour scale per group.

    ``weights`` colours completion tokens by each step's credit; ``tokenizer`` (or the
    display tokenizer) decodes token ids. ``show``: the rollouts of ``rollouts`` to draw
    (default the first ``max_rollouts``, saying how many more); a group's header, mean reward and
    scale are always the whole group's, with how many of its siblings are shown.
    """
    rs = [rollouts] if isinstance(rollouts, Rollout) else list(rollouts)
    tok = resolve_tokenizer(tokenizer)
    if show is None:
        shown, rest = rs[:max_rollouts], len(rs) - max_rollouts
    else:
        wanted = {id(r) for r in show} | {r.id for r in show}
        shown, rest = [r for r in rs if id(r) in wanted or r.id in wanted], 0
        if len(shown) < len({r.id for r in show}):
            raise ValueError(
                f"show: {len({r.id for r in show}) - len(shown)} of the rollouts to show are not among the "
                "rollouts given; pass them all and the ones to show, e.g. credit_view(rollouts, show=rollouts[:2])"
            )
    whole = {r.id: g for _, g in _groups(rs) for r in g}
    parts = []
    if title:
        parts.append(f"<h3>{html.escape(title)}</h3>")
    if tok is None:
        parts.append(
            "<div class='ll-head'>token ids shown: call "
            "<code>ludic_lab.lab.token_html.set_display_tokenizer(tokenizer)</code> "
            "or pass <code>tokenizer=</code> to see text</div>"
        )
    overall = _group_scale(shown, weights)
    if weights is not None:
        parts.append(legend_html(overall))
    cut = sum(1 for r in shown for s in r.steps if s.info.get("incomplete_completion"))
    if cut:
        n_steps = sum(len(r.steps) for r in shown)
        parts.append(f"<div class='ll-head ll-cut-note'>{CUT_NOTE.format(n=cut, total=n_steps)}</div>")
    for gid, group in _groups(shown):
        full = whole[group[0].id]  # every sibling given, shown or not
        scale = _group_scale(full, weights)
        if len(full) > 1 or gid is not None:
            rewards = [r.total_reward for r in full]
            n, k = len(full), len(group)
            size = f"{n} rollout{'s' if n != 1 else ''}" + ("" if k == n else f", {k} shown")
            mean = f"reward mean {fmt(sum(rewards) / n)}" + ("" if k == n else f" (all {n})")
            parts.append(
                f"<div class='ll-ghead' data-group-size='{n}' data-shown='{k}'>group "
                f"<b>{html.escape(str(gid)[:12])}</b> · {size} · {mean}"
                + ("" if weights is None else f" · scale ±{scale:.3g}")
                + "</div>"
            )
        cards = "".join(_card_html(r, weights, tok, scale) for r in group)
        parts.append(
            f"<div class='ll-group' data-group-id='{html.escape(str(gid), quote=True)}' "
            f"data-scale='{scale!r}'>{cards}</div>"
        )
    if rest > 0:
        parts.append(f"<div class='ll-head'>… {rest} more rollout(s) not shown (max_rollouts={max_rollouts})</div>")
    return view_html("".join(parts))


def rollout_html(rollout: Rollout, **kw: Any) -> str:
    """The token view of one rollout (see :func:`rollouts_html`); what ``Rollout._repr_html_`` shows."""
    return rollouts_html([rollout], **kw)
