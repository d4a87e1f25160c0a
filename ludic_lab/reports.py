"""Standalone reports: a rollout table as HTML, and metric curves as a PNG.

Plain functions over :class:`~ludic_lab.types.Rollout` and metric dicts; matplotlib is
imported inside the plotting function, so importing this module costs nothing.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.types import Rollout

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 6px;vertical-align:top;text-align:left}
th{background:#f4f4f4;position:sticky;top:0}
td.txt{white-space:pre-wrap;font-family:ui-monospace,Menlo,monospace;max-width:48em}
tr.grp td{border-top:2px solid #888}
.pos{background:#e6f4e6}.neg{background:#fbe9e9}.err{color:#b00}
"""


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:+.3f}"
    return html.escape(str(x))


def rollouts_html(
    rollouts: Sequence[Rollout],
    *,
    title: str = "rollouts",
    weights: Mapping[tuple[str, int], float] | None = None,
    summary: Mapping[str, Any] | None = None,
) -> str:
    """A self-contained HTML page: one row per step, grouped by ``group_id``, with the
    observation, the completion, parse/env/format rewards and (if given) the step's weight."""
    rows = []
    ordered = sorted(rollouts, key=lambda r: (str(r.group_id), r.sampling_seed or 0))
    last_group = object()
    for r in ordered:
        for s in r.steps or ():
            w = weights.get((r.id, s.index)) if weights else None
            cls = "grp" if r.group_id != last_group else ""
            last_group = r.group_id
            shade = "" if w is None or w == 0 else (" pos" if w > 0 else " neg")
            rows.append(
                f"<tr class='{cls}'><td>{_fmt((r.group_id or '')[:8])}</td><td>{s.index}</td>"
                f"<td class='txt'>{html.escape(s.prev_obs)}</td><td class='txt'>{html.escape(s.action)}</td>"
                f"<td>{_fmt(s.parsed_action) if s.parsed_action is not None else '<i>parse error</i>'}</td>"
                f"<td>{_fmt(s.env_reward)}</td><td>{_fmt(s.format_reward)}</td><td>{_fmt(s.reward)}</td>"
                f"<td class='{shade.strip()}'>{'' if w is None else _fmt(float(w))}</td>"
                f"<td>{_fmt(s.info.get('target', ''))}</td></tr>"
            )
        if r.error:
            rows.append(
                f"<tr><td colspan='10' class='err'>rollout {html.escape(r.id)} failed: {html.escape(r.error)}</td></tr>"
            )
    summ = ""
    if summary:
        summ = (
            "<table style='width:auto;margin-bottom:1em'>"
            + "".join(f"<tr><th>{html.escape(str(k))}</th><td>{_fmt(v)}</td></tr>" for k, v in summary.items())
            + "</table>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "group",
            "step",
            "observation",
            "completion",
            "parsed",
            "env r",
            "format r",
            "reward",
            "weight",
            "target",
        )
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h2>{html.escape(title)}</h2>{summ}"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></body></html>"
    )


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
