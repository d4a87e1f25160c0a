"""Rollouts as a table: :func:`rollouts_to_dataframe` (re-exported by :mod:`ludic_lab.types`).

Reads rollouts through their attributes only, so it imports nothing of ``ludic_lab.types``
at run time; pandas is imported when called.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pandas as pd

    from ludic_lab.types import Rollout, Step

_THINK = re.compile(r"^\s*<think>(.*?)(?:</think>|$)", re.DOTALL)


def step_reasoning(step: Step) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a step's reply: the reasoning its model family parsed (the
    agent's ``info["reasoning"]``), else a leading ``<think>`` block of the action; the answer
    is the action without that block. ``(None, action)`` when the reply did not reason."""
    agent = step.info.get("agent")
    parsed = agent.get("reasoning") if isinstance(agent, Mapping) else None
    parsed = parsed if isinstance(parsed, str) else None
    m = _THINK.match(step.action)
    if m is None:
        return parsed, step.action
    return (parsed if parsed is not None else m.group(1).strip()), step.action[m.end() :].lstrip()


def rollouts_to_dataframe(rollouts: Sequence[Rollout], *, per: Literal["rollout", "step"] = "rollout") -> pd.DataFrame:
    """A pandas DataFrame with one row per rollout (default) or per step.

    Rewards applied by :func:`ludic_lab.rewards.apply_rewards` (judges, group rewards) add a
    ``reward.<name>`` column (unweighted score) and, for judges, ``reasoning.<name>``. The
    model's own thinking is apart from its answer (:func:`step_reasoning`): per step the
    ``reasoning`` and ``answer`` columns, per rollout ``final_reasoning``.
    """
    import pandas as pd

    if per not in ("rollout", "step"):
        raise ValueError(f"per must be 'rollout' or 'step', got {per!r}")
    rows: list[dict[str, Any]] = []
    for r in rollouts:
        base = {
            "rollout_id": r.id,
            "agent_id": r.agent_id,
            "group_id": r.group_id,
            "env_seed": r.env_seed,
            "sampling_seed": r.sampling_seed,
            "policy_version": r.policy_version,
            "error": r.error,
        }
        if per == "rollout":
            last = r.steps[-1] if r.steps else None
            rows.append(
                {
                    **base,
                    "num_steps": r.length,
                    "total_reward": r.total_reward,
                    "completion_tokens": r.num_completion_tokens,
                    "parse_errors": sum(bool(s.info.get("parse_error")) for s in r.steps),
                    "terminated": bool(last and last.terminated),
                    "truncated": bool(last and last.truncated),
                    "final_action": last.action if last else None,
                    "final_reasoning": step_reasoning(last)[0] if last else None,
                    **_reward_columns(last.info if last else {}),
                    **{
                        f"meta.{k}": v for k, v in r.meta.items() if isinstance(v, (str, int, float, bool)) or v is None
                    },
                }
            )
        elif per == "step":
            for s in r.steps:
                reasoning, answer = step_reasoning(s)
                rows.append(
                    {
                        **base,
                        "step": s.index,
                        "prev_obs": s.prev_obs,
                        "action": s.action,
                        "reasoning": reasoning,
                        "answer": answer,
                        "parsed_action": s.parsed_action,
                        "next_obs": s.next_obs,
                        "reward": s.reward,
                        "env_reward": s.env_reward,
                        "format_reward": s.format_reward,
                        "terminated": s.terminated,
                        "truncated": s.truncated,
                        "parse_error": bool(s.info.get("parse_error")),
                        "completion_tokens": len(s.trace.completion_token_ids) if s.trace else 0,
                        "prompt_source": s.trace.prompt_source if s.trace else None,
                        "finish_reason": s.trace.finish_reason if s.trace else None,
                        **_reward_columns(s.info),
                    }
                )
        else:
            raise ValueError(f"per must be 'rollout' or 'step', got {per!r}")
    return pd.DataFrame(rows)


def _reward_columns(info: dict[str, Any]) -> dict[str, Any]:
    """``reward.<name>``: each applied reward's unweighted score (:mod:`ludic_lab.rewards`),
    ``reasoning.<name>``: a judge's reasoning, when it gave one."""
    out: dict[str, Any] = {f"reward.{k}": v for k, v in (info.get("rewards") or {}).items()}
    for k, v in (info.get("reward_info") or {}).items():
        if isinstance(v, dict) and isinstance(v.get("reasoning"), str):
            out[f"reasoning.{k}"] = v["reasoning"]
    return out
