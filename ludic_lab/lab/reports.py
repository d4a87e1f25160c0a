"""Standalone reports: a rollout table as HTML, and metric curves as a PNG.

Plain functions over :class:`~ludic_lab.types.Rollout` and metric dicts; matplotlib is
imported inside the plotting function, so importing this module costs nothing.
:func:`format_number` and :func:`format_metrics` give the short forms of numbers and metric
dicts that the reports and the demos' terminal lines print.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.lab.token_html import COLOUR_NAMES, NEG_RGB, POS_RGB, _style, weight_rgb as _token_rgb
from ludic_lab.types import Rollout, Step

Weights = Mapping[tuple[str, int], float]

ROW_TINT = 0.3
"""A row's tint: this share of its step's colour over white (the weight cell and the sampled
tokens get the whole colour), so the row's text stays readable."""

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 6px;vertical-align:top;text-align:left}
th{background:#f4f4f4;position:sticky;top:0}
td.txt{white-space:pre-wrap;font-family:ui-monospace,Menlo,monospace;max-width:48em}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.grp td{border-top:2px solid #888}
.err{color:#b00}.dim{color:#777;font-style:italic}
.ctx{color:#888;font-style:italic}
.meta{color:#444;margin:.2em 0 .8em 0}
.legend{margin:.4em 0 1em 0;font-size:12.5px}
.legend span.sw{display:inline-block;padding:1px 7px;margin-right:2px;border-radius:2px;
  font-family:ui-monospace,monospace;border:1px solid #ccc}
table.summary{width:auto;margin-bottom:1em}
ul.kv{margin:0;padding-left:1.1em}
"""


# -- numbers and dicts ---------------------------------------------------------------------
def format_number(x: Any, digits: int = 3) -> str:
    """``x`` short: floats to ``digits`` significant digits (``0.123``, ``12.3``, ``1235``),
    ints and everything else as ``str``; ``nan`` / ``inf`` spelt out."""
    if isinstance(x, bool) or not isinstance(x, float):
        return str(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if x == 0:
        return "0"
    if abs(x) < 10**-(digits):
        return f"{x:.{max(0, digits - 1)}e}"
    s = f"{x:.{digits}g}"
    return f"{x:.0f}" if "e" in s else s


def _key(k: Any) -> str:
    return str(k).replace("_", " ")


def format_metrics(d: Mapping[str, Any] | Any, digits: int = 3) -> str:
    """A metric dict as one readable line: ``greedy accuracy 0.15, pass@4 0.312``; nested
    dicts as ``greedy: accuracy 0.25, tool call rate 0.5; sampled: ...``; numbers by
    :func:`format_number`."""
    if isinstance(d, Mapping):
        nested = any(isinstance(v, Mapping) for v in d.values())
        sep = "; " if nested else ", "
        return sep.join(
            f"{_key(k)}{':' if isinstance(v, Mapping) else ''} {format_metrics(v, digits)}" for k, v in d.items()
        )
    if isinstance(d, (list, tuple)):
        return ", ".join(format_metrics(v, digits) for v in d)
    return format_number(d, digits)


def _value_html(v: Any) -> str:
    """A summary value: nested dicts as ``key value`` lists, numbers short, text escaped."""
    if isinstance(v, Mapping):
        items = "".join(
            f"<li>{html.escape(_key(k))} "
            + (_value_html(x) if isinstance(x, Mapping) else f"<b>{html.escape(format_metrics(x))}</b>")
            + "</li>"
            for k, x in v.items()
        )
        return f"<ul class='kv'>{items}</ul>"
    return html.escape(format_metrics(v))


# -- weight colours ------------------------------------------------------------------------
def weight_rgb(w: float, scale: float, strength: float = 1.0) -> tuple[int, int, int]:
    """Background of a step with weight ``w`` when the batch's largest ``|w|`` is ``scale``: the
    notebook views' palette (:func:`ludic_lab.lab.token_html.weight_rgb`: blue > 0, red < 0, white
    for 0, deeper the larger ``|w|``); ``strength`` < 1 lightens it toward white (rows)."""
    rgb = _token_rgb(w, scale)
    r, g, b = (round(255 + (c - 255) * strength) for c in rgb)
    return r, g, b


def _bg(w: float, scale: float, strength: float = 1.0) -> str:
    """The style of a cell or token run of weight ``w``: its background, with white text on a deep one."""
    rgb = weight_rgb(w, scale, strength)
    return _style(rgb) if strength == 1.0 else "background:rgb({}, {}, {})".format(*rgb)


def _sign(w: float) -> str:
    return "pos" if w > 0 else "neg" if w < 0 else "zero"


def legend_html(scale: float) -> str:
    """The colour key of the weights, for a batch whose largest ``|w|`` is ``scale``, with the
    colours' names the notebook views use (:data:`~ludic_lab.lab.token_html.COLOUR_NAMES`)."""
    c = COLOUR_NAMES
    marks = [-scale, -scale / 2, 0.0, scale / 2, scale] if scale > 0 else [0.0]
    sw = "".join(f"<span class='sw' style='{_bg(w, scale)}'>{_signed(w)}</span>" for w in marks)
    if scale == 0:
        sw += " <b>every weight of this batch is 0</b>: each group's samples scored alike, so this step changed nothing"
    return (
        f"<div class='legend'><b>weight</b> (the credit the loss gave each step; every token the model "
        f"sampled in it gets this weight) {sw}<br>"
        f"<b style='color:rgb{POS_RGB}'>{c['positive']}</b>: pushed up (made more likely) · "
        f"<b style='color:rgb{NEG_RGB}'>{c['negative']}</b>: pushed down (made less likely) · "
        f"{c['zero']}: weight 0, no signal (e.g. every sample of the question scored the same) · "
        f"deeper colour = larger |weight| · <span class='ctx'>{c['masked']} italic text</span> in a completion: "
        "tool results and template tokens the model did not write (context, not trained)</div>"
    )


def _signed(w: float | None) -> str:
    if w is None:
        return ""
    s = format_number(float(w))
    return s if s.startswith("-") or s in ("0", "nan") else "+" + s


# -- the table -----------------------------------------------------------------------------
def _completion_html(s: Step, w: float | None, scale: float, tok: Any) -> str:
    """The step's completion: with a tokenizer and a token trace, every token the trainer
    sees (sampled runs tinted by ``w``, inserted tool results grey italic); else the text."""
    style = "" if w is None else f" style='{_bg(w, scale)}'"
    tr = s.trace
    if tok is None or tr is None or not tr.completion_token_ids:
        text = f"<span class='act'{style}>{html.escape(s.action)}</span>"
    else:
        runs: list[tuple[int, list[int]]] = []
        for tid, m in zip(tr.completion_token_ids, tr.sampled_mask, strict=False):
            if runs and runs[-1][0] == m:
                runs[-1][1].append(tid)
            else:
                runs.append((m, [tid]))
        parts = []
        for m, ids in runs:
            piece = html.escape(_decode(tok, ids))
            if m:
                parts.append(f"<span class='act'{style}>{piece}</span>")
            else:
                parts.append(f"<span class='ctx' title='context the model did not write: not trained'>{piece}</span>")
        text = "".join(parts)
    agent = s.info.get("agent")
    tools = agent.get("tools") if isinstance(agent, dict) else None
    if isinstance(tools, dict) and tools.get("calls"):
        failed = f", {tools.get('failed', 0)} failed" if tools.get("failed") else ""
        text += f"<div class='dim'>{tools['calls']} tool call(s){failed}</div>"
    return text


def _decode(tok: Any, ids: list[int]) -> str:
    """``ids`` as text, special tokens (the chat template's glue around tool results) kept."""
    inner = getattr(tok, "tokenizer", None)  # a ChatTemplate's decode skips special tokens
    tok = inner if callable(getattr(inner, "decode", None)) else tok
    try:
        return str(tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
    except TypeError:  # tokenizers without these keywords
        return str(tok.decode(ids))


def _parsed_html(s: Step) -> str:
    """What the parser sent to the env (not the completion again), or why it sent nothing."""
    if s.info.get("observation_only"):
        return "<span class='dim'>(no action)</span>"
    if s.parsed_action is None:
        why = (s.next_obs or "")[:200]
        return "<span class='err'>parse error</span>" + (f": {html.escape(why)}" if why else "")
    parsed = str(s.parsed_action)
    if parsed in (s.action, s.action.strip()):
        return (
            "<span class='dim' title='the parser sent the whole reply, stripped, to the env'>(the whole reply)</span>"
        )
    return html.escape(parsed) if parsed.strip() else "<span class='dim'>(empty)</span>"


def _num(x: Any) -> str:
    return f"<td class='num'>{html.escape(format_number(x))}</td>"


def rollouts_html(
    rollouts: Sequence[Rollout],
    *,
    title: str = "rollouts",
    weights: Weights | None = None,
    summary: Mapping[str, Any] | None = None,
    training_step: int | None = None,
    tokenizer: Any = None,
) -> str:
    """A self-contained HTML page: one row per step, grouped by ``group_id``, with the
    observation, the completion, the parsed action (or the parse error), the target, the
    rewards and, given ``weights`` (a credit assigner's ``{(rollout_id, step_index): weight}``),
    each step's weight, rows and sampled tokens coloured by it (legend on the page).

    ``training_step`` goes in the header; the turn column shows only when some episode has
    more than one step. ``tokenizer`` (or a model path / client) shows the completion's tokens
    as the trainer sees them, tool results included; ``summary`` values (dicts too) are
    formatted short."""
    tok = None
    if tokenizer is not None:
        from ludic_lab.lab.token_html import resolve_tokenizer

        tok = resolve_tokenizer(tokenizer)
    ordered = sorted(rollouts, key=lambda r: (str(r.group_id), r.sampling_seed or 0))
    multi_turn = any(len(r.steps or ()) > 1 for r in ordered)
    ws = [float(w) for w in (weights or {}).values() if math.isfinite(float(w))]
    scale = max((abs(w) for w in ws), default=0.0)
    ncol = 9 + multi_turn
    rows = []
    last_group: Any = object()
    for r in ordered:
        for s in r.steps or ():
            w = None if weights is None else weights.get((r.id, s.index))
            w = None if w is None else float(w)
            cls = ["grp"] if r.group_id != last_group else []
            last_group = r.group_id
            attrs = ""
            if w is not None:
                cls.append(f"w-{_sign(w)}")
                attrs = f" data-weight='{w!r}' style='{_bg(w, scale, ROW_TINT)}'"
            wcell = (
                "<td class='num'>-</td>"
                if w is None
                else f"<td class='num' style='{_bg(w, scale)}'><b>{_signed(w)}</b></td>"
            )
            rows.append(
                f"<tr class='{' '.join(cls)}'{attrs}><td>{html.escape(str(r.group_id or '')[:8])}</td>"
                + (f"<td class='num'>{s.index}</td>" if multi_turn else "")
                + f"<td class='txt'>{html.escape(s.prev_obs)}</td>"
                f"<td class='txt'>{_completion_html(s, w, scale, tok)}</td>"
                f"<td class='txt parsed'>{_parsed_html(s)}</td>"
                f"<td>{html.escape(str(s.info.get('target', '')))}</td>"
                f"{_num(s.env_reward)}{_num(s.format_reward)}{_num(s.reward)}{wcell}</tr>"
            )
        if r.error:
            err = f"rollout {html.escape(r.id)} failed: {html.escape(r.error)}"
            rows.append(f"<tr><td colspan='{ncol}' class='err'>{err}</td></tr>")
    cols = ["group", *(["turn"] if multi_turn else []), "observation", "completion", "parsed action", "target",
            "env r", "format r", "reward", "weight"]  # fmt: skip
    head = "".join(f"<th>{h}</th>" for h in cols)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h2>{html.escape(title)}</h2>"
        f"{_meta_html(ordered, training_step)}{'' if weights is None else legend_html(scale)}{_summary_html(summary)}"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></body></html>"
    )


def _meta_html(rollouts: Sequence[Rollout], training_step: int | None) -> str:
    groups = {r.group_id if r.group_id is not None else r.id for r in rollouts}
    rewards = [r.total_reward for r in rollouts if not r.failed]
    versions = sorted({r.policy_version for r in rollouts if r.policy_version is not None})
    parts = [] if training_step is None else [f"<b>training step {training_step}</b>"]
    parts.append(f"{len(rollouts)} rollout(s) in {len(groups)} group(s)")
    if rewards:
        parts.append(f"mean reward {format_number(sum(rewards) / len(rewards))}")
    if versions:
        parts.append("sampled by policy version " + ", ".join(str(v) for v in versions))
    return f"<div class='meta'>{' · '.join(parts)}</div>"


def _summary_html(summary: Mapping[str, Any] | None) -> str:
    if not summary:
        return ""
    body = "".join(f"<tr><th>{html.escape(_key(k))}</th><td>{_value_html(v)}</td></tr>" for k, v in summary.items())
    return f"<table class='summary'>{body}</table>"


def write_rollouts_html(path: str | os.PathLike, rollouts: Sequence[Rollout], **kw: Any) -> str:
    """Write :func:`rollouts_html` to ``path`` and return the path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(rollouts_html(rollouts, **kw))
    return str(path)


def plot_metrics(
    history: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    keys: Sequence[str] = ("reward_mean", "loss"),
    title: str = "",
    hlines: Mapping[str, float] | None = None,
) -> str:
    """One panel per metric key against ``step``; ``hlines`` draws labelled reference
    levels (e.g. evaluation before/after) on the first panel. Saves a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    keys = [k for k in keys if any(isinstance(h.get(k), (int, float)) for h in history)]
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(5 * max(1, len(keys)), 3.6), squeeze=False)
    for ax, k in zip(axes[0], keys, strict=False):  # one blank panel when no key is numeric
        pts = [(h["step"], h[k]) for h in history if isinstance(h.get(k), (int, float)) and "step" in h]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
        ax.set_xlabel("step")
        ax.set_title(k)
        ax.grid(alpha=0.3)
    if hlines and keys:
        for label, y in hlines.items():
            axes[0][0].axhline(y, ls="--", lw=1, color="gray")
            ax0 = axes[0][0]
            ax0.text(
                0.01,
                y,
                f" {label} = {y:.2f}",
                transform=ax0.get_yaxis_transform(),
                fontsize=8,
                color="gray",
                va="bottom",
            )
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
