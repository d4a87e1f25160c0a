"""How a failed episode's error reads: its type and message, where it was raised, what a
timeout was waiting for, and the partial rollouts an exception may carry."""

from __future__ import annotations

import os
from pathlib import Path

from ludic_lab.types import Rollout


def format_error(exc: BaseException) -> str:
    """``"<ExcType>: message"`` (just the type name when the message is empty)."""
    msg = str(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def partial_rollouts(exc: BaseException) -> list[Rollout]:
    """Rollouts an exception carries (duck-typed ``.rollouts`` list or ``.rollout``), else ``[]``."""
    carried = getattr(exc, "rollouts", None)
    if carried is None:
        one = getattr(exc, "rollout", None)
        carried = [] if one is None else [one]
    if not isinstance(carried, (list, tuple)):
        return []
    return [r for r in carried if isinstance(r, Rollout)]


def where_raised(exc: BaseException | None) -> str:
    """Where ``exc`` was raised: ``"in <function> (<file>:<line>)"`` of the innermost frame
    outside asyncio, plus the asyncio call it was awaiting (e.g. ``"at asyncio.sleep"``)."""
    tb = exc.__traceback__ if exc is not None else None
    if tb is None:
        return "(no traceback)"
    ours, awaiting = None, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if f"{os.sep}asyncio{os.sep}" in code.co_filename:
            awaiting = awaiting or code.co_name
        else:
            ours, awaiting = tb, None
        tb = tb.tb_next
    if ours is None:
        return f"at asyncio.{awaiting}"
    code = ours.tb_frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    return f"in {name} ({Path(code.co_filename).name}:{ours.tb_lineno})" + (
        f" at asyncio.{awaiting}" if awaiting else ""
    )


def protocol_timeout_error(exc: BaseException, timeout: float) -> TimeoutError:
    """The error of a protocol that stopped at the episode timeout (``phase == "timeout"``):
    which call was waiting, the timeout, the steps done, and the protocol's own detail. An
    exception whose ``timeout_named`` is true already names the call and the limit that stopped
    it (e.g. a tool call under the protocol's own ``timeout_s``): its message is kept."""
    steps = max((len(r.steps) for r in partial_rollouts(exc)), default=0)
    if getattr(exc, "timeout_named", False) is True:
        return TimeoutError(str(exc))
    inner = exc.__cause__ if exc.__cause__ is not None else exc
    detail = str(inner).strip()
    return TimeoutError(
        f"the model call (agent.act) did not return within the episode timeout of {timeout:g} s "
        f"after {steps} completed step(s)"
        + (f" ({detail})" if detail else "")
        + "; raise RolloutEngine(episode_timeout_s=...) if episodes are legitimately this slow"
    )
