"""Shared parts of the verifiers tests: the test environments on the import path, re-scoring a trace."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ENVS = Path(__file__).parent / "verifiers_envs"
"""The verifiers environments written for these tests (see its README)."""


@contextmanager
def verifiers_envs_importable() -> Iterator[None]:
    """Put :data:`ENVS` on ``sys.path`` (verifiers imports tasksets by id) and on ``PYTHONPATH``
    (tool servers run as ``python -m <module>`` subprocesses), as an installed package would be."""
    old = os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(ENVS))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ENVS), *([old] if old else [])])
    try:
        yield
    finally:
        sys.path.remove(str(ENVS))
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


async def rescore(taskset_id: str, rollout: Any) -> Any:
    """verifiers' own scoring of a rollout's recorded trace: the trace rebuilt from
    ``rollout.meta["verifiers"]["trace"]``, its scores cleared, and scored offline by the task
    (loaded afresh from the taskset) -> the re-scored ``vf.Trace``."""
    import verifiers.v1 as vf

    record = dict(rollout.meta["verifiers"]["trace"])
    record.update(rewards={}, metrics={})
    trace = vf.WireTrace.model_validate(record)
    taskset = vf.load_taskset(vf.resolve_env_config({"taskset": {"id": taskset_id}}).taskset)
    (task,) = [t for t in taskset if t.key == rollout.meta["verifiers"]["task"]["key"]]
    await task.score(trace)
    return trace
