"""The tool-use task: multiply a 3-digit by a 2-digit number, with a calculator or without.

SmolLM2-135M cannot multiply 347 by 29 in its head, but it can call a calculator and copy
the result. One episode = one question from ``ludic_lab/data/multiplication.jsonl``
(:class:`~ludic_lab.envs.DatasetQAEnv`, one env step); reward 1 when the *last number* of
the model's final reply (the one without a tool call) is the product, else 0.

With the tool, the agent is a :class:`~ludic_lab.agents.ToolAgent` with the
:func:`~ludic_lab.envs.calculator.calculator` tool (its model turns and tool results are one
step). The context starts with two worked exchanges (:data:`TOOL_EXAMPLES`): with only the
tool described, SmolLM2 hardly ever writes a ``<tool_call>`` block; with the examples it does
most of the time but, sampled at temperature 1, often writes invalid JSON
(``{"expression": 964 * 59}``, unquoted) — room for RL to teach the format. The control
(``use_tool=False``) is a plain :class:`~ludic_lab.agents.Agent` shown the same two questions
answered directly.

:func:`tool_stats` turns rollouts into the numbers to watch: accuracy, tool-call rate,
valid-call rate (episodes with at least one call that ran), calls per episode, failures by kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ludic_lab.agents import Agent, ToolAgent
from ludic_lab.context import FullDialog
from ludic_lab.envs import DatasetQAEnv
from ludic_lab.envs.calculator import calculator
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import ParseResult
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine
from ludic_lab.task import Task
from ludic_lab.types import Message, Rollout

TOOL_SYSTEM_PROMPT = "Use the calculator tool for arithmetic, then reply with just the number."
"""System prompt with the tool (the agent appends the tool's description to it)."""
NO_TOOL_SYSTEM_PROMPT = "Reply with just the number."
"""System prompt of the no-tool control."""


def _call(expression: str) -> str:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


def _m(role: str, content: str) -> Message:
    return {"role": role, "content": content}


TOOL_EXAMPLES: tuple[Message, ...] = (
    _m("user", "What is 12 * 34?"),
    _m("assistant", _call("12 * 34")),
    _m("tool", "408"),
    _m("assistant", "408"),
    _m("user", "What is 250 times 17?"),
    _m("assistant", _call("250 * 17")),
    _m("tool", "4250"),
    _m("assistant", "4250"),
)
"""Two worked exchanges that start every episode's context (the tool run)."""
NO_TOOL_EXAMPLES: tuple[Message, ...] = (
    _m("user", "What is 12 * 34?"),
    _m("assistant", "408"),
    _m("user", "What is 250 times 17?"),
    _m("assistant", "4250"),
)
"""The same two questions answered directly (the no-tool control)."""

_NUMBER = re.compile(r"-?\d[\d,]*")


def final_number_match(reply: str, target: str) -> bool:
    """``True`` when the last number in ``reply`` (thousands commas ignored) equals ``target``.

    A reply that still holds a tool call (the tool-turn limit was hit) ends with the call's
    operands, so it scores 0; so does a reply without a number.
    """
    found = _NUMBER.findall(reply if isinstance(reply, str) else str(reply))
    return bool(found) and found[-1].replace(",", "").strip() == str(target).strip()


def final_number_parser(reply: str) -> ParseResult:
    """The parser of the task: the action is the last number of the final reply (what
    :func:`final_number_match` judges, so rewards are those of the whole reply), or the whole
    reply, stripped, when it holds no number."""
    found = _NUMBER.findall(reply if isinstance(reply, str) else str(reply))
    return ParseResult(action=found[-1] if found else str(reply).strip(), reward=0.0, obs=None)


def tool_task_agent(
    client: Any, *, use_tool: bool = True, max_tool_turns: int = 2, tool_timeout_s: float = 5.0
) -> Agent:
    """The agent of one episode: a calculator :class:`ToolAgent` (``use_tool``) or a plain
    :class:`Agent` (the control), each with its system prompt and examples.

    A reply cut at ``max_tokens`` still reaches the env here (``reject_incomplete_completions=False``,
    unlike the library's default): with the default's -0.1 for a cut turn, SmolLM2's long first
    tool turns made calling the tool the losing move, and one GRPO step took the demo from 0.83
    of episodes calling the tool to none (held-out greedy accuracy 1.00 -> 0.00); without it,
    train reward 0.21 -> 1.00 at step 2 (2026-11-26, seed 0)."""
    if not use_tool:
        return Agent(
            client,
            FullDialog(examples=NO_TOOL_EXAMPLES),
            final_number_parser,
            system_prompt=NO_TOOL_SYSTEM_PROMPT,
            reject_incomplete_completions=False,
        )
    return ToolAgent(
        client,
        FullDialog(examples=TOOL_EXAMPLES),
        final_number_parser,
        tools=[calculator],
        max_tool_turns=max_tool_turns,
        tool_timeout_s=tool_timeout_s,
        system_prompt=TOOL_SYSTEM_PROMPT,
        reject_incomplete_completions=False,
    )


def multiplication_task(rows: Sequence[dict[str, Any]], *, use_tool: bool = True, max_tool_turns: int = 2) -> Task:
    """The tool-use task as a :class:`~ludic_lab.task.Task`: env ``"multiplication"`` serving
    ``rows`` (env seed ``i`` is question ``i``), protocol ``"tool_agent"`` (the tool agent, or
    the no-tool control when ``use_tool`` is false), one env step per episode; ``stats``:
    :func:`tool_stats`, ``evaluate``: :func:`evaluate_tool_task`."""
    rows = list(rows)

    def make_env() -> DatasetQAEnv:
        return DatasetQAEnv(rows, verifier=final_number_match, system_prompt=None)

    def make_protocol(client: Any) -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(tool_task_agent(client, use_tool=use_tool, max_tool_turns=max_tool_turns))

    return Task("multiplication", make_env, size=len(rows), protocol_kind="tool_agent", protocol=make_protocol,
                max_steps=1, evaluate=evaluate_tool_task, stats=tool_stats)  # fmt: skip


def tool_task_engine(
    client: Any,
    rows: Sequence[dict[str, Any]],
    *,
    use_tool: bool = True,
    max_tool_turns: int = 2,
    concurrency: int = 64,
) -> tuple[RolloutEngine, EnvSpec, ProtocolSpec]:
    """``(engine, env_spec, protocol_spec)`` of :func:`multiplication_task` sampling through ``client``."""
    task = multiplication_task(rows, use_tool=use_tool, max_tool_turns=max_tool_turns)
    return task.engine(client, max_concurrency=concurrency), EnvSpec(task.name), ProtocolSpec(task.protocol_kind)


def tool_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Accuracy and tool use over ``rollouts`` (failed rollouts count as wrong, no call):
    ``accuracy``, ``tool_call_rate`` (episodes with a call), ``valid_call_rate`` (episodes
    with a call that ran), ``calls_per_episode`` and ``failed_calls/<kind>`` per episode."""
    n = len(rollouts)
    if n == 0:
        return {"accuracy": float("nan"), "tool_call_rate": float("nan"), "valid_call_rate": float("nan"),
                "calls_per_episode": float("nan")}  # fmt: skip
    correct = called = valid = calls = 0
    errors: dict[str, int] = {}
    for r in rollouts:
        if r.failed or not r.steps:
            continue
        correct += any(bool(s.info.get("correct")) for s in r.steps)
        counts = [s.info.get("agent", {}).get("tools") or {} for s in r.steps]
        n_calls = sum(int(c.get("calls", 0)) for c in counts)
        called += n_calls > 0
        valid += sum(int(c.get("ok", 0)) for c in counts) > 0
        calls += n_calls
        for c in counts:
            for kind, k in (c.get("errors") or {}).items():
                errors[kind] = errors.get(kind, 0) + int(k)
    out = {
        "accuracy": correct / n,
        "tool_call_rate": called / n,
        "valid_call_rate": valid / n,
        "calls_per_episode": calls / n,
    }
    out.update({f"failed_calls/{kind}": k / n for kind, k in sorted(errors.items())})
    return out


def tool_stats_callback(source: Any, *loggers: Any) -> Callable[[int, dict[str, Any]], None]:
    """A :class:`~ludic_lab.training.Trainer` callback: adds :func:`tool_stats` of the step's
    rollouts (``source.last_rollouts``) to its metrics as ``tools/<name>`` (so they land in
    ``trainer.history``), then logs the step to ``loggers`` (callbacks run after the trainer's
    own loggers, which therefore do not see these keys)."""

    def callback(step: int, metrics: dict[str, Any]) -> None:
        metrics.update({f"tools/{k}": v for k, v in tool_stats(source.last_rollouts).items()})
        row = {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float, str))}
        for lg in loggers:
            lg.log(step, row)

    return callback


async def evaluate_tool_task(
    client: Any,
    rows: Sequence[dict[str, Any]],
    *,
    use_tool: bool = True,
    temperature: float = 0.0,
    max_tokens: int = 48,
    max_tool_turns: int = 2,
    sampling_seed: int = 0,
    limit: int | None = None,
    name: str = "eval",
) -> dict[str, Any]:
    """One episode per question of ``rows`` (the first ``limit``): :func:`tool_stats` of the
    result plus ``"result"``, the :class:`~ludic_lab.eval.EvalResult` (greedy at temperature 0)."""
    from ludic_lab.eval import evaluate

    engine, env, protocol = tool_task_engine(client, rows, use_tool=use_tool, max_tool_turns=max_tool_turns)
    n = len(rows) if limit is None else min(int(limit), len(rows))
    result = await evaluate(
        engine, env, protocol, range(n), k=1, temperature=temperature, max_tokens=max_tokens,
        sampling_seed=sampling_seed, name=name,
    )  # fmt: skip
    return {**tool_stats(result.rollouts), "result": result}
