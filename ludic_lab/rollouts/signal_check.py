"""Is there anything to learn from this batch? Counts and a warning with the likely causes.

Two ways a step can train on nothing, silently:

- **no gradient**: every item's weight is 0 — with group-relative credit (GRPO, RLOO, ...)
  that is every group's members scoring the same reward, so every advantage is 0;
- **no tool calls**: the agent offers tools (a ``ToolAgent`` records ``info["agent"]["tools"]``) and
  not one episode called one, so nothing about calling tools can be learned.

:func:`signal_stats` turns a batch into flat metrics (``signal/...``, in ``SAWBatch.meta``
and so in the trainer's ``source/signal/...``); :func:`no_signal_warning` turns a step's
metrics into the line ``ConsoleLogger``, the tqdm bar and the notebook's ``LivePlot`` show.

Example::

    meta = signal_stats(rollouts, items, credit={"num_groups": 4, "zero_std_groups": 4})
    no_signal_warning(meta)   # 'no learning signal: all 4 groups scored equal rewards ...'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.types import Rollout

_NAN = float("nan")

NO_GRADIENT_CAUSES = (
    "likely causes: the task is too hard or too easy for the model (every reward 0, or every reward 1); "
    "answers never reach the verifier in the format it reads (see parse_error_rate and "
    "source.last_rollouts); samples too alike to differ (temperature, group_size)"
)
NO_TOOL_CALL_CAUSES = (
    "likely causes: the model does not know when or how to call (give few_shot_messages whose assistant "
    "turns call the tool in the model's format and end in the answer format the verifier reads: "
    "worked examples that answer in sentences teach sentences); a system prompt that hides the tool "
    "prompt; see source.last_rollouts[i].steps[-1].info['agent']['tools']"
)


def _tool_counts(rollout: Rollout) -> tuple[bool, int]:
    """(did the agent offer tools in this episode, how many calls it made)."""
    offered, calls = False, 0
    for step in rollout.steps:
        agent = step.info.get("agent")  # the protocols keep the agent's info under "agent"
        tools = agent.get("tools") if isinstance(agent, Mapping) else step.info.get("tools")
        if isinstance(tools, Mapping):
            offered = True
            calls += int(tools.get("calls", 0) or 0)
    return offered, calls


def signal_stats(
    rollouts: Sequence[Rollout], items: Sequence[SAWItem], credit: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """Flat ``signal/...`` metrics of one batch.

    ``signal/no_gradient`` (1.0 when there are items and every weight is 0),
    ``signal/equal_reward_groups`` and ``signal/equal_reward_group_frac`` (from the credit
    assigner's ``zero_std_groups`` / ``num_groups``, NaN without groups),
    ``signal/tool_episodes`` (episodes whose agent offered tools), ``signal/tool_calls``,
    ``signal/no_tool_calls`` (1.0 when tools were offered and none was called).
    """
    credit = credit or {}
    groups = int(credit.get("num_groups", 0) or 0)
    equal = int(credit.get("zero_std_groups", 0) or 0)
    offered = calls = 0
    for r in rollouts:
        if r.failed:
            continue
        o, c = _tool_counts(r)
        offered += o
        calls += c if o else 0
    return {
        "signal/no_gradient": float(bool(items) and all(it.weight == 0.0 for it in items)),
        "signal/equal_reward_groups": float(equal),
        "signal/equal_reward_group_frac": equal / groups if groups else _NAN,
        "signal/tool_episodes": float(offered),
        "signal/tool_calls": float(calls),
        "signal/no_tool_calls": float(offered > 0 and calls == 0),
    }


def _get(metrics: Mapping[str, Any], key: str) -> float | None:
    """``key`` or ``source/key`` (the trainer prefixes batch meta) as a finite float."""
    for k in (key, f"source/{key}"):
        v = metrics.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def problems(metrics: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(kind, what happened, likely causes)`` for each way this step has nothing to learn:
    kinds ``"no_gradient"`` and ``"no_tool_calls"``. Reads the keys of :func:`signal_stats`
    (bare or ``source/``-prefixed, averaged over a step's batches: a flag counts when it
    holds for every batch)."""
    out: list[tuple[str, str, str]] = []
    if (_get(metrics, "signal/no_gradient") or 0.0) >= 1.0:
        groups = _get(metrics, "credit/num_groups")
        equal = _get(metrics, "signal/equal_reward_groups")
        lo, hi = _get(metrics, "reward_min"), _get(metrics, "reward_max")
        what = "every weight is 0"
        if groups and equal is not None and equal >= groups:
            what = f"all {int(groups)} groups scored equal rewards, so every advantage is 0"
        if lo is not None and hi is not None:
            what += f" (rewards {_fmt(lo)} .. {_fmt(hi)})" if lo != hi else f" (every reward {_fmt(lo)})"
        out.append(("no_gradient", f"no learning signal: {what}; this step changes nothing", NO_GRADIENT_CAUSES))
    offered = _get(metrics, "signal/tool_episodes") or 0.0
    if offered > 0 and (_get(metrics, "signal/no_tool_calls") or 0.0) >= 1.0:
        what = f"no tool calls: {offered:.0f} episodes were offered tools and none called one"
        out.append(("no_tool_calls", what, NO_TOOL_CALL_CAUSES))
    return out


def no_signal_warning(metrics: Mapping[str, Any], *, causes: bool = True) -> str | None:
    """The warning for a step (or batch) with nothing to learn, or ``None`` when there is
    signal (see :func:`problems`); ``causes=False`` leaves the likely causes out."""
    parts = [f"{what}; {why}" if causes else what for _kind, what, why in problems(metrics)]
    return " | ".join(parts) if parts else None


class NoSignalNotice:
    """What a logger shows: ``step N: <warning>``, each kind's likely causes the first time
    only, afterwards the short form with how many steps had nothing to learn (``count``)."""

    def __init__(self) -> None:
        self.count = 0
        self._told: set[str] = set()

    def __call__(self, step: int | float, metrics: Mapping[str, Any]) -> str | None:
        found = problems(metrics)
        if not found:
            return None
        self.count += 1
        parts = []
        for kind, what, why in found:
            parts.append(what if kind in self._told else f"{what}; {why}")
            self._told.add(kind)
        tail = f" ({self.count} steps without signal so far)" if self.count > 1 else ""
        return f"step {int(step)}: " + " | ".join(parts) + tail


def count_steps_without_signal(counters: dict[str, int], metrics: Mapping[str, Any]) -> None:
    """Add this step to ``counters["no_gradient_steps"]`` / ``["no_tool_calls_steps"]`` when
    :func:`problems` finds that kind (the trainer reports them as ``total/...``)."""
    found = {kind for kind, _what, _why in problems(metrics)}
    for kind in ("no_gradient", "no_tool_calls"):
        counters[f"{kind}_steps"] = counters.get(f"{kind}_steps", 0) + (kind in found)
