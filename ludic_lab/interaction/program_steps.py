"""The steps of an endpoint session: one per segment, with the step info of the agent-program path.

Each segment (a chain of delivered calls, each extending the previous one) becomes one
:class:`~ludic_lab.types.Step` whose trace is the chain folded into one sequence.
``step.info["agent_program"]`` holds the segment's ``calls`` (session call indices),
``prompt_source``, ``break_reason``, and its tool calls in the shape ``ToolAgent`` gives
under ``info["agent"]``: ``tool_calls`` lists every call the model wrote (``call``,
``call_id``, ``name``, ``arguments`` as the model wrote them, ``error``: ``None``,
``"invalid_call"`` for a block that is not a valid call, ``"unknown_tool"`` for a name the
request did not offer: the kinds ``ToolAgent`` records), ``tools`` counts them (``calls``,
``failed``, ``errors`` by kind) and ``num_tool_calls`` is the number of calls without an error.
"""

from __future__ import annotations

from typing import Any

from ludic_lab.traces import merge_traces
from ludic_lab.types import Step


def segment_steps(session: Any, obs: str) -> list[Step]:
    """One step per segment of ``session``'s delivered calls (:meth:`Session.segments`)."""
    steps = []
    for k, chain in enumerate(session.segments()):
        trace = merge_traces([c.trace for c in chain])
        head = chain[0]
        calls = tool_call_records(chain)
        steps.append(
            Step(
                index=k,
                prev_obs=obs,
                action=chain[-1].text,
                parsed_action=None,
                next_obs=None,
                reward=0.0,
                info={
                    "parse_error": False,
                    "incomplete_completion": chain[-1].trace.finish_reason == "length",
                    "agent_program": {
                        "calls": [c.index for c in chain],
                        "prompt_source": head.trace.prompt_source,
                        "break_reason": head.break_reason,
                        "tool_calls": calls,
                        "num_tool_calls": sum(r["error"] is None for r in calls),
                        "tools": tool_call_counts(calls),
                    },
                },
                trace=trace,
            )
        )
    return steps


def tool_call_records(chain: list[Any]) -> list[dict[str, Any]]:
    """Every tool call the model wrote in ``chain``'s replies, in order: calls as the endpoint
    returned them (``error``: ``"unknown_tool"`` for a name the request's ``tools`` did not offer,
    else ``None``), malformed
    blocks with ``name=""``, the raw block as ``arguments`` and ``error="invalid_call"`` (the
    kinds ``ToolAgent`` records)."""
    out: list[dict[str, Any]] = []
    for c in chain:
        offered = getattr(c, "tool_names", ())
        for tc in c.tool_calls:
            fn = tc.get("function") or {}
            name, arguments = fn.get("name", ""), fn.get("arguments", "")
            error = "unknown_tool" if offered and name not in offered else None
            out.append({"call": c.index, "call_id": tc.get("id"), "name": name, "arguments": arguments, "error": error})
        for k, (raw, why) in enumerate(getattr(c, "invalid_tool_calls", ())):
            bad = {"call_id": f"invalid_{k}", "name": "", "arguments": raw, "error": "invalid_call", "why": why}
            out.append({"call": c.index, **bad})
    return out


def tool_call_counts(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"calls", "failed", "errors": {kind: n}}`` of :func:`tool_call_records` (the keys
    ``ToolAgent``'s ``info["agent"]["tools"]`` has for the same counts)."""
    errors: dict[str, int] = {}
    for r in records:
        if r["error"] is not None:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    return {"calls": len(records), "failed": sum(errors.values()), "errors": errors}
