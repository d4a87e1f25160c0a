"""Failures of an agent program that the model caused, told apart from the infrastructure's.

An agent program can stop because of what the model wrote: it named a tool the program does
not have, wrote arguments that do not parse, broke the framework's rules. That is the
model's doing, and often the commonest mistake of a small model, so a run may want to score
it (a reward you set) instead of leaving the episode out of its group. A timeout, a crash of
the program's own code or a backend error is not the model's doing and always stays out.

An exception counts as a **model error** when it, or an exception it was raised from or
during, is

- a :class:`ModelError` (raise :class:`UnknownToolError` or :class:`ToolArgumentsError`, or
  the base class, from a program of your own);
- the OpenAI Agents SDK's ``agents.exceptions.ModelBehaviorError`` (a tool the model named
  that the agent lacks, tool arguments that are not JSON where the tool does not report them
  back to the model, ...), recognised by name, so the SDK is not imported here;
- an instance of a class you name (``AgentProgramProtocol(model_errors=(MyError,))``).

:class:`~ludic_lab.interaction.AgentProgramProtocol` ``model_error_reward`` chooses what
happens: ``None`` (the default) leaves the episode out (a failed rollout,
``failure_cause="model_error"``); a number scores it with that reward on what the model
sampled up to the error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from ludic_lab.interaction.single_agent import EpisodeError

MODEL_ERROR_CAUSE = "model_error"
"""``Rollout.meta["failure_cause"]`` of an episode left out because of a model error."""

_BY_NAME = (("agents.exceptions", "ModelBehaviorError"),)
"""Exception classes of other packages that mean "the model did this": (module, class name)."""


class ModelError(Exception):
    """Raise it from an agent program when the model did something the program cannot go on
    from; the protocol scores or leaves out the episode as ``model_error_reward`` says."""

    failure_cause = MODEL_ERROR_CAUSE


class UnknownToolError(ModelError):
    """The model called a tool the program does not have (the message should name it)."""


class ToolArgumentsError(ModelError):
    """The model's tool arguments do not parse as JSON, or do not fit the tool's parameters."""


class ModelErrorEpisode(EpisodeError):
    """An agent-program episode left out because of a model error (``failure_cause`` says so)."""

    failure_cause = MODEL_ERROR_CAUSE


def check_model_errors(classes: Iterable[Any]) -> tuple[type[BaseException], ...]:
    """``classes`` as a tuple of exception classes; a ``TypeError`` names anything else."""
    if isinstance(classes, type) or isinstance(classes, (str, bytes)):
        raise TypeError(f"model_errors must be a list or tuple of exception classes, got {classes!r}")
    out = tuple(classes)
    for c in out:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise TypeError(
                f"model_errors must hold exception classes (e.g. model_errors=(json.JSONDecodeError,)), got {c!r}"
            )
    return out


def check_model_error_reward(value: Any) -> float | None:
    """``None`` (leave model errors out) or the reward as a finite float; else a clear error."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"model_error_reward must be a number (the reward of an episode the model broke, e.g. -1.0) "
            f"or None (leave such episodes out), got {value!r}"
        )
    if not math.isfinite(value):
        raise ValueError(f"model_error_reward must be finite, got {value!r}")
    return float(value)


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__


def _named(exc: BaseException) -> bool:
    return any((cls.__module__, cls.__qualname__) in _BY_NAME for cls in type(exc).__mro__)


def find_model_error(exc: BaseException | None, extra: tuple[type[BaseException], ...] = ()) -> BaseException | None:
    """The first exception of ``exc``'s chain that is a model error (a :class:`ModelError`,
    the Agents SDK's ``ModelBehaviorError`` or one of ``extra``), else ``None``."""
    for e in _chain(exc):
        if isinstance(e, (ModelError, *extra)) or _named(e):
            return e
    return None
