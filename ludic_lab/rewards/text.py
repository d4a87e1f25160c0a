"""What a reward reads of a rollout: the task prompt and the agent's answer, as text.

Defaults for judges and group rewards; pass your own ``prompt_fn`` / ``answer_fn`` where an
env keeps the task or the answer elsewhere (e.g. in ``step.info``).
"""

from __future__ import annotations

from ludic_lab.types import Rollout, Step


def _agent_steps(rollout: Rollout) -> list[Step]:
    """Steps where the agent acted (observation-only steps of multi-agent games left out)."""
    return [s for s in rollout.steps if not s.info.get("observation_only")]


def rollout_prompt(rollout: Rollout) -> str:
    """The task as the agent first saw it: the first step's observation (``""`` if no steps)."""
    return rollout.steps[0].prev_obs if rollout.steps else ""


def rollout_answer(rollout: Rollout) -> str:
    """The agent's final reply as it wrote it: the raw completion of its last turn."""
    steps = _agent_steps(rollout)
    return steps[-1].action if steps else ""


def rollout_parsed_answer(rollout: Rollout) -> str | None:
    """What the parser extracted from the last turn (``None`` on a parse error or no turn)."""
    steps = _agent_steps(rollout)
    return steps[-1].parsed_action if steps else None
