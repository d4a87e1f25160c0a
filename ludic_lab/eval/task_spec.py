"""What :func:`~ludic_lab.eval.evaluate_task` evaluates, named by a string: a bundled task, a
JSONL file, reasoning-gym's generators, or any Python object as ``module:factory``.

- ``"capitals"``: the capitals task's held-out (test) countries, 20 tokens (the ``ludic-lab
  demo`` task); ``"digits"``: 32 fresh prompts of the digits task; ``"bugfix"``: the 20
  held-out bug-fix tasks as workspace episodes (:func:`~ludic_lab.task.bugfix.bugfix_task`), 512 tokens a turn.
- ``"harbor:PATH"``: the held-out Harbor task folders under ``PATH`` (a task folder: that task) as
  workspace episodes rewarded by Harbor's verifier (:func:`~ludic_lab.task.harbor_task.harbor_task`), 512 tokens a turn.
- ``"reasoning_gym:NAME"``: the held-out rows of reasoning-gym's generator ``NAME`` as
  :func:`~ludic_lab.task.external.reasoning_gym.reasoning_gym_task` holds them out by default
  (100 rows after the 1,000 training rows of seed 0), scored by reasoning-gym, 256 tokens.
- ``PATH.jsonl``: rows ``{"question", "answer"}`` in a :class:`~ludic_lab.envs.DatasetQAEnv`
  (answer in ``<answer>`` tags, checked by :func:`~ludic_lab.envs.numeric_match`).
- ``module:name`` or ``path/to/file.py:name``: that attribute as it is (a ``Task``, an env
  class or factory, a function returning a ``Task``, or an agent program).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic_lab.task.definition import Task

REASONING_GYM_PREFIX = "reasoning_gym:"
"""A task name ``reasoning_gym:NAME`` is reasoning-gym's generator ``NAME`` (held-out rows)."""
HARBOR_PREFIX = "harbor:"
"""A task name ``harbor:PATH`` is the Harbor task folder(s) at ``PATH`` (their held-out split)."""
NAMES = ("capitals", "digits", "bugfix", REASONING_GYM_PREFIX + "NAME", HARBOR_PREFIX + "PATH")
"""The task names :func:`named_task` knows (besides the ``extra`` a caller adds)."""


@dataclass(frozen=True)
class EvalTask:
    """A task to evaluate: the ``task``, the env ``seeds`` of its items (``None``: rows
    ``0..task.size-1``) and the completion budget it was made for."""

    task: Task
    """The task (its env, parser and protocol)."""
    seeds: tuple[int, ...] | None = None
    """Env seeds to evaluate, one item each (``None``: every row of ``task.size``)."""
    max_tokens: int = 128
    """The task's own completion budget, used when the caller gives none."""


def named_task(name: str, *, extra: Mapping[str, Callable[[], EvalTask]] | None = None) -> EvalTask:
    """The held-out :class:`EvalTask` called ``name`` (module docstring), or one of ``extra``'s
    (a caller's own names, e.g. the CLI's ``"tools"``). An unknown name is a ``ValueError``
    listing the known ones."""
    extra = dict(extra or {})
    if name in extra:
        return extra[name]()
    if name == "capitals":
        from ludic_lab.task.capitals import capitals_task

        return EvalTask(capitals_task("test"), None, 20)
    if name == "digits":
        from ludic_lab.task.digits import SEEDS, digits_task

        return EvalTask(digits_task(), tuple(range(SEEDS, SEEDS + 32)), 20)  # seeds past those training walks
    if name == "bugfix":
        from ludic_lab.task.bugfix import bugfix_task

        return EvalTask(bugfix_task("heldout"), None, 512)  # the held-out split as the task's own rows
    if name.startswith(HARBOR_PREFIX):
        from ludic_lab.task.harbor_task import harbor_task

        return EvalTask(harbor_task(name.removeprefix(HARBOR_PREFIX), split="heldout"), None, 512)
    if name.startswith(REASONING_GYM_PREFIX):
        from ludic_lab.task.external.reasoning_gym import ReasoningGymEnv, ReasoningGymEnvFactory, reasoning_gym_task

        train = reasoning_gym_task(name.removeprefix(REASONING_GYM_PREFIX))
        data = train.env.data  # type: ignore[attr-defined]  # a ReasoningGymEnvFactory
        heldout = ReasoningGymEnvFactory(data, "heldout")
        task = Task(train.name, heldout, parser=ReasoningGymEnv.recommended_parser(), size=data.heldout_size)
        return EvalTask(task, None, 256)
    known = ", ".join([*NAMES, *extra])
    raise ValueError(
        f"unknown task {name!r}; the known tasks are {known}; or give a .jsonl file of question/answer rows, "
        "or module:factory (a Task, an env class or factory, or an agent program)"
    )


def rows_task(rows: Sequence[Mapping[str, Any]] | str | Path, name: str = "qa") -> EvalTask:
    """Rows ``{"question", "answer"}`` (or the JSONL file holding them) as a question-answer task:
    answers in ``<answer>`` tags, checked by :func:`~ludic_lab.envs.numeric_match`, 256 tokens."""
    from ludic_lab.envs import DatasetQAEnv
    from ludic_lab.envs.dataset_qa_env import load_jsonl

    data = load_jsonl(str(rows)) if isinstance(rows, (str, Path)) else list(rows)
    try:
        DatasetQAEnv(data)  # the keys are there: an error now, not in the first episode
    except KeyError as e:
        where = f"{rows}: " if isinstance(rows, (str, Path)) else ""
        raise ValueError(f"{where}{e.args[0]} (each row needs a 'question' and an 'answer')") from e

    def make_env() -> DatasetQAEnv:
        return DatasetQAEnv(data)

    return EvalTask(Task(name, make_env, parser=DatasetQAEnv.recommended_parser(), size=len(data)), None, 256)


def load_object(spec: str) -> Any:
    """The object ``spec`` names: ``package.module:attr`` (importable) or ``path/to/file.py:attr``.

    A module that does not import, or has no such attribute, is a ``ValueError`` saying which."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not module:factory (e.g. my_pkg.agents:agent or agents.py:agent)")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            mod_spec = importlib.util.spec_from_file_location(f"_ludic_eval_{path.stem}", path)
            assert mod_spec is not None and mod_spec.loader is not None
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_spec.name] = module  # dataclasses and pickling look their module up
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as e:  # any import failure is the user's spec, named in one line
        raise ValueError(
            f"{spec!r}: module {module_name!r} does not import ({type(e).__name__}: {e}); give an importable "
            "module (on PYTHONPATH) or the path of a .py file, then a colon and the name in it"
        ) from e
    if not hasattr(module, attr):
        names = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ValueError(f"{spec!r}: module {module_name!r} has no attribute {attr!r}; its callables: {names}")
    obj = getattr(module, attr)
    if not (callable(obj) or isinstance(obj, Task)):
        raise ValueError(
            f"{spec!r} is a value of type {type(obj).__name__}, not callable: name a Task, an env class or factory, "
            "a function returning a Task, or an agent program (async def agent(client, question))"
        )
    return obj


def resolve(spec: Any, *, extra: Mapping[str, Callable[[], EvalTask]] | None = None) -> Any:
    """``spec`` as an object: a string by the module docstring's rules (an :class:`EvalTask` for
    a name or a JSONL file, the named object for ``module:factory``); anything else as it is."""
    if not isinstance(spec, str):
        return spec
    if spec.endswith(".jsonl") and ":" not in spec:
        if not Path(spec).is_file():
            raise ValueError(f"no JSONL file {spec!r} (a task file holds one {{question, answer}} row per line)")
        return rows_task(spec, Path(spec).stem or "qa")
    if ":" in spec and not spec.startswith((REASONING_GYM_PREFIX, HARBOR_PREFIX)) and spec not in (extra or {}):
        return load_object(spec)
    return named_task(spec, extra=extra)


def as_eval_task(obj: Any, *, extra: Mapping[str, Callable[[], EvalTask]] | None = None) -> EvalTask:
    """``obj`` (an :class:`EvalTask`, a ``Task``, rows, an env class or factory, or a function
    returning a ``Task``; or a string naming one, :func:`resolve`) as an :class:`EvalTask`."""
    from ludic_lab.task.definition import as_task

    obj = resolve(obj, extra=extra)
    if isinstance(obj, EvalTask):
        return obj
    if isinstance(obj, Task):
        return EvalTask(obj)
    if isinstance(obj, Sequence) and obj and all(isinstance(r, Mapping) for r in obj):
        return rows_task(obj)
    if isinstance(obj, type) or not callable(obj):
        return EvalTask(as_task(obj))
    import inspect

    try:
        required = [
            q.name
            for q in inspect.signature(obj).parameters.values()
            if q.default is q.empty and q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY)
        ]
    except (TypeError, ValueError):  # a builtin without a signature: try it
        required = []
    if required:
        raise ValueError(
            f"{getattr(obj, '__name__', obj)!r} needs arguments {required}; name a factory that takes none "
            "(e.g. def make_task(): return my_task(...)), a Task, an env class or an agent program"
        )
    made = obj()  # a factory: of a Task, or of an env (then it is the task's env factory)
    if isinstance(made, Task):
        return EvalTask(made)
    if isinstance(made, EvalTask):
        return made
    close = getattr(made, "close", None)
    if callable(close):
        close()
    return EvalTask(as_task(obj))


def with_seeds(target: EvalTask, seeds: Sequence[int] | None, limit: int | None) -> tuple[int, ...]:
    """The env seeds to evaluate: ``seeds`` if given, else the task's own (its seeds, or rows
    ``0..size-1``), the first ``limit`` of them. A task with neither needs ``seeds`` or ``limit``."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1 (items to evaluate), got {limit!r}")
    if seeds is not None:
        chosen = [int(s) for s in seeds]
    elif target.seeds is not None:
        chosen = list(target.seeds)
    elif target.task.size is not None:
        chosen = list(range(target.task.size if limit is None else min(limit, target.task.size)))
    elif limit is not None:
        chosen = list(range(limit))
    else:
        raise ValueError(
            f"task {target.task.name!r} has no rows (Task.size is None): say which env seeds to evaluate "
            "with seeds= (e.g. range(100, 132)) or limit= (seeds 0..limit-1)"
        )
    if not chosen:
        raise ValueError(f"no items to evaluate for task {target.task.name!r} (seeds is empty)")
    return tuple(chosen[:limit] if limit is not None else chosen)


def replace_protocol(target: EvalTask, protocol: Callable[[Any], Any], kind: str) -> EvalTask:
    """``target`` whose episodes run ``protocol(client)`` (registered as ``kind``), one env step each."""
    task = dataclasses.replace(target.task, protocol=protocol, protocol_kind=kind, max_steps=1)
    return dataclasses.replace(target, task=task)
