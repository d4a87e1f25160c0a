"""Text <-> OpenEnv: the default mappings between a model's reply and an OpenEnv action, and
between an OpenEnv observation and the text the model reads.

Actions, from the action's JSON schema (``GET /schema``; ``metadata`` is left out):

- ``action_field="message"`` given: ``{"message": reply}``;
- one string field and no other required field (``message``, ``text``, ``command``, ...):
  the reply goes into it;
- otherwise the reply must hold a JSON object of the action's fields (a fenced code block or
  the first ``{...}`` in the text is read), e.g. ``{"row": 1, "col": 2}``.

A reply that cannot be made into an action raises :class:`InvalidAction`: the env records a
penalised step and tells the model why, without calling the server.

Observations (the ``observation`` dict the server sends; reward and done travel beside it):
a chat ``messages`` list gives its last message's content; else the first text field named
like a prompt (:data:`TEXT_KEYS`); else the only string field; else the fields as JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

TEXT_KEYS = ("prompt", "text", "message", "content", "observation", "question", "output", "feedback")
"""Observation fields read as the text, in this order, when the observation has several."""

_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)

ActionFromText = Callable[[str], Any]
"""``action_from_text(reply) -> action`` (a dict, or what a typed client's ``step`` takes); raise
``ValueError`` (e.g. :class:`InvalidAction`) for a reply that is no action."""
ObservationToText = Callable[[Any], str]
"""``observation_to_text(observation) -> str`` (the observation dict, or a typed client's model)."""


class InvalidAction(ValueError):
    """The reply is not an action of this environment (a penalised step, not a failure)."""


def _fields(schema: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    props = (schema or {}).get("properties") or {}
    return {k: v for k, v in props.items() if k != "metadata" and isinstance(v, dict)}


def _is_string(prop: Mapping[str, Any]) -> bool:
    if prop.get("type") == "string":
        return True
    return any(isinstance(alt, dict) and alt.get("type") == "string" for alt in prop.get("anyOf", ()))


def text_field(schema: Mapping[str, Any] | None) -> str | None:
    """The action field a reply goes into whole: the one string field when no other field is required."""
    fields = _fields(schema)
    strings = [k for k, p in fields.items() if _is_string(p)]
    required = set((schema or {}).get("required") or ()) - {"metadata"}
    if len(strings) == 1 and required <= {strings[0]}:
        return strings[0]
    return None


def json_object(reply: str) -> dict[str, Any]:
    """The JSON object in ``reply`` (the whole text, a fenced block, or the first ``{...}``)."""
    candidates = [reply.strip()]
    candidates += [m.group(1) for m in _FENCE.finditer(reply)]
    start, end = reply.find("{"), reply.rfind("}")
    if 0 <= start < end:
        candidates.append(reply[start : end + 1])
    for c in candidates:
        try:
            value = json.loads(c)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack: no action
            continue
        if isinstance(value, dict):
            return value
    raise InvalidAction('the reply holds no JSON object; answer with the action as JSON, e.g. {"field": value}')


def default_action_from_text(schema: Mapping[str, Any] | None, action_field: str | None = None) -> ActionFromText:
    """The default reply -> action mapping for an action of JSON schema ``schema`` (module docstring).

    Raises ``ValueError`` at once when ``action_field`` is not a field of the schema."""
    fields = _fields(schema)
    if action_field is not None:
        if fields and action_field not in fields:
            raise ValueError(f"action_field={action_field!r} is not a field of the action; fields: {sorted(fields)}")
        return lambda reply: {action_field: reply}
    field = text_field(schema)
    if field is not None:
        return lambda reply: {field: reply}
    if not fields:
        raise ValueError(
            "the server published no action schema (GET /schema) to map a reply onto; pass "
            "action_field='name' (the reply as that field) or action_from_text=fn (reply -> action dict)"
        )
    required = set((schema or {}).get("required") or ()) - {"metadata"}

    def from_json(reply: str) -> dict[str, Any]:
        obj = json_object(reply)
        unknown, missing = set(obj) - set(fields), required - set(obj)
        if unknown or missing:
            raise InvalidAction(
                f"the action takes the fields {sorted(fields)} (required: {sorted(required)}); got {sorted(obj)}"
            )
        return obj

    return from_json


def action_prompt(schema: Mapping[str, Any] | None) -> str | None:
    """A system prompt naming the action's JSON fields when replies are read as JSON, else ``None``."""
    fields = _fields(schema)
    if not fields or text_field(schema) is not None:
        return None
    desc = ", ".join(f'"{k}" ({p.get("type", "value")})' for k, p in fields.items())
    return f"Reply with one JSON object with the fields {desc}."


def as_dict(observation: Any) -> Any:
    """A JSON-ready form of an observation: a pydantic model dumped, mappings and lists copied."""
    if hasattr(observation, "model_dump"):
        return observation.model_dump(mode="json", exclude={"reward", "done", "metadata"})
    if isinstance(observation, Mapping):
        return {str(k): as_dict(v) for k, v in observation.items()}
    if isinstance(observation, (list, tuple)):
        return [as_dict(v) for v in observation]
    return observation if isinstance(observation, (str, int, float, bool)) or observation is None else str(observation)


def default_observation_to_text(observation: Any) -> str:
    """The text of an observation (rule in the module docstring)."""
    obs = as_dict(observation)
    if isinstance(obs, str):
        return obs
    if not isinstance(obs, dict):
        return json.dumps(obs)
    messages = obs.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        content = messages[-1].get("content")
        if isinstance(content, str):
            return content
    for key in TEXT_KEYS:
        if isinstance(obs.get(key), str):
            return str(obs[key])
    strings = [v for v in obs.values() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    return json.dumps(obs, sort_keys=True, default=str)
