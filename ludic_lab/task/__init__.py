"""Tasks (layer 6): what a run practises, in one place.

A :class:`Task` holds an env factory, the parser an agent reads it with, its rows, its
evaluation and stats; :meth:`Task.engine` binds it to a sampler and :meth:`Task.requests`
gives a :class:`RequestStream` (the requests of each step, with a cursor that a checkpoint
saves). The built-in tasks (``capitals``, ``digits``) live in :mod:`ludic_lab.task.builtin`.
No torch at import: a pipeline actor imports this package.
"""

from ludic_lab.task.definition import EvaluateFn, StatsFn, Task, as_task
from ludic_lab.task.request_stream import SEED_STRIDE, RequestStream

__all__ = ["SEED_STRIDE", "EvaluateFn", "RequestStream", "StatsFn", "Task", "as_task"]
