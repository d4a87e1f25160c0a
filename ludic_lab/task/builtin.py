"""The built-in tasks by name: ``"capitals"`` (:mod:`ludic_lab.task.capitals`, for SmolLM2) and
``"digits"`` (:mod:`ludic_lab.task.digits`, learnable by the tiny test model)."""

from __future__ import annotations

from typing import Any

from ludic_lab.task.definition import Task

BUILTIN_TASKS = ("capitals", "digits")


def builtin_task(name: str, **options: Any) -> Task:
    """Task ``name`` (one of :data:`BUILTIN_TASKS`); ``options`` go to its factory
    (e.g. ``protocol_kind=``)."""
    if name == "capitals":
        from ludic_lab.task.capitals import capitals_task

        return capitals_task(**options)
    if name == "digits":
        from ludic_lab.task.digits import digits_task

        return digits_task(**options)
    raise ValueError(f"unknown task {name!r}; choose one of {BUILTIN_TASKS}")


__all__ = ["BUILTIN_TASKS", "builtin_task"]
