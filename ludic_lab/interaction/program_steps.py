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

:func:`waiting_on` says what an episode whose time ran out was waiting for, from its session.
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


def waiting_on(session: Any, program: str = "the agent program") -> str:
    """What a session's program was waiting for when its time ran out: a model call under way,
    else the tool call(s) the last delivered reply asked for (the program or harness runs them),
    else ``program``'s own work after its last reply (or before its first call)."""
    if getattr(session, "calls_under_way", 0):
        return f"the model call (call {len(session.calls)} of the episode, sampling)"
    delivered = [c for c in session.calls if c.delivered]
    if not delivered:
        return f"{program}, before its first model call"
    last = max(delivered, key=lambda c: (c.index, c.choice))
    if last.tool_calls:
        shown = []
        for tc in last.tool_calls[:3]:
            fn = tc.get("function") or {}
            shown.append(f"{fn.get('name', '?')}({str(fn.get('arguments', ''))[:60]})")
        more = f" and {len(last.tool_calls) - 3} more" if len(last.tool_calls) > 3 else ""
        return f"the tool call {', '.join(shown)}{more} (asked for by model call {last.index})"
    return f"{program}, after model call {last.index} (no model or tool call under way)"
