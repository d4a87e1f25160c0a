"""One Harbor task folder, read and validated by Harbor's own task models, and what it needs.

    folder = load_harbor_task("ludic_lab/data/harbor/hello-file")
    folder.name, folder.instruction, folder.workdir, folder.agent_timeout_s

A Harbor (Terminal-Bench) task is ``instruction.md``, ``task.toml``, ``environment/``
(a Dockerfile), ``tests/test.sh`` (writes ``/logs/verifier/reward.txt`` or ``reward.json``)
and optionally ``solution/solve.sh``. ``task.toml`` is parsed by ``harbor``'s ``TaskConfig``
and the folder checked by its ``TaskPaths`` / ``TaskFileFilter`` as ``harbor``'s ``Task``
does (that class itself needs Python >= 3.12; its models run on 3.11). The environment is
then mapped onto a workspace (:mod:`~ludic_lab.task.harbor_image`): a task needing more than
this host can give is refused here, before anything runs (:class:`HarborUnsupportedError`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ludic_lab.task.harbor_image import HarborImage, HarborUnsupportedError, read_dockerfile, script_needs

HARBOR_HINT = (
    "the harbor package's task models are needed: pip install --no-deps --ignore-requires-python "
    "harbor==0.26.0 toml pathspec (harbor declares Python >= 3.12; its task models run on 3.11 without "
    "its other dependencies; on 3.12: pip install 'ludic_lab[harbor]'; docs/harbor.md)"
)
ELSEWHERE = (
    "run it where Docker runs, with Harbor itself: harbor run -p <task folder> (Docker, Modal, E2B, Daytona, ...)"
)
"""What a refusal names as the machine that can run the task."""
_CANARY_LINE_RE = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


class HarborTaskError(ValueError):
    """A folder that is not a valid Harbor task (Harbor's own validation says why)."""


@dataclass(frozen=True)
class HarborTaskFolder:
    """A validated Harbor task this host can run: its instruction, its workspace, its checks."""

    name: str
    """``[task].name`` of task.toml, else the folder's name."""
    path: Path
    instruction: str
    """instruction.md without its canary lines (as Harbor shows it)."""
    config: Any
    """Harbor's ``TaskConfig`` (``harbor.models.task.config``)."""
    image: HarborImage
    """The Dockerfile mapped onto a workspace: base image, working directory, environment, files."""
    test_script: str
    """The test script's path inside ``tests/`` (``test.sh``), run as ``/tests/<it>``."""
    solve_script: str | None
    """The solve script's path inside ``solution/``, or None."""
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    """``[verifier].env``: the test script's extra environment."""

    @property
    def workdir(self) -> str:
        """The container's working directory: the workspace root (linked to ``/workspace``)."""
        return self.image.workdir

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def agent_timeout_s(self) -> float | None:
        """``[agent].timeout_sec``: the episode's time for commands (None: no limit of its own)."""
        value = self.config.agent.timeout_sec
        return float(value) if value is not None else None

    @property
    def verifier_timeout_s(self) -> float:
        """``[verifier].timeout_sec``: the test script's time (Harbor's default 600 s)."""
        return float(self.config.verifier.timeout_sec)

    def meta(self) -> dict[str, Any]:
        """JSON-ready facts for a step's info."""
        return {"name": self.name, "path": str(self.path), "base_image": self.image.base, "workdir": self.workdir,
                "metadata": dict(self.config.metadata)}  # fmt: skip


def harbor_models() -> Any:
    """Harbor's task-model modules (a namespace); ``ModuleNotFoundError`` with the install hint."""
    try:
        from harbor.models.task import config, file_filter, paths, verifier_mode
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"{e}; {HARBOR_HINT}") from e

    class Models:
        TaskConfig, TaskOS = config.TaskConfig, config.TaskOS
        VerifierEnvironmentMode = config.VerifierEnvironmentMode
        TaskPaths, TaskFileFilter = paths.TaskPaths, file_filter.TaskFileFilter
        resolve_mode = staticmethod(verifier_mode.resolve_task_verifier_mode)

    return Models


def is_harbor_task(path: str | Path) -> bool:
    """A folder holding a ``task.toml`` (what :func:`load_harbor_task` then reads)."""
    return (Path(path) / "task.toml").is_file()


def strip_canary(text: str) -> str:
    """Leading canary lines removed, and the blank lines after them (Harbor's ``strip_canary``)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY_LINE_RE.match(lines[i].strip()):
        i += 1
    while i < len(lines) and lines[i].strip() == "":
        i += 1
    return "\n".join(lines[i:])


def load_harbor_task(path: str | Path) -> HarborTaskFolder:
    """The task folder at ``path``, validated as Harbor validates it, or a
    :class:`HarborTaskError` (invalid) / :class:`HarborUnsupportedError` (valid, but needs
    what this host cannot give: the message names each need and where to run it)."""
    m = harbor_models()
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise HarborTaskError(f"{path}: no such folder")
    tp = m.TaskPaths(folder)
    if not tp.config_path.is_file():
        raise HarborTaskError(f"{folder}: no task.toml (a Harbor task folder holds instruction.md, task.toml, "
                              "environment/, tests/)")  # fmt: skip
    try:
        config = m.TaskConfig.model_validate_toml(tp.config_path.read_text())
        file_filter = m.TaskFileFilter(folder)
        tp.validate_input_tree(tp.tests_dir, exclude=file_filter.is_excluded)
        tp.validate_input_tree(tp.solution_dir, exclude=file_filter.is_excluded)
    except (ValueError, OSError, RuntimeError) as e:  # pydantic's ValidationError is a ValueError
        raise HarborTaskError(f"{folder}/task.toml: {e}") from e
    name = config.task.name if config.task is not None else folder.name
    needs = _config_needs(config, m)
    if config.steps:
        raise HarborUnsupportedError(name, needs, ELSEWHERE)
    if not tp.instruction_path.is_file():
        raise HarborTaskError(f"Task directory {folder} is missing instruction.md.")
    test_path = tp.discovered_test_path_for(m.TaskOS.LINUX)
    if test_path is None and m.resolve_mode(config) == m.VerifierEnvironmentMode.SHARED:
        raise HarborTaskError(f"Task directory {folder} declares [environment].os = 'linux' but does not contain "
                              "tests/test.sh.")  # fmt: skip
    image: HarborImage | None = None
    if config.environment.docker_image:
        needs.append(f"task.toml [environment] docker_image = {config.environment.docker_image!r} (a prebuilt image)")
    else:
        image, image_needs = read_dockerfile(tp.environment_dir, interpreter_prefix=sys.base_prefix)
        needs += image_needs
    if test_path is not None:
        tests_rel = test_path.relative_to(tp.tests_dir).as_posix()
        known = ("/tests", "/logs", "/solution", image.workdir if image else "/app")
        needs += script_needs(test_path.read_text(errors="replace"), f"tests/{tests_rel}", known_dirs=known)
    if needs or image is None or test_path is None:
        raise HarborUnsupportedError(name, needs, ELSEWHERE)
    try:
        file_filter.require_included(test_path)  # as Harbor's verifier: an excluded test script is an error
    except (ValueError, OSError) as e:
        raise HarborTaskError(f"{folder}: {e}") from e
    verifier_env = dict(config.verifier.env)
    templated = [k for k, v in {**verifier_env, **config.environment.env}.items() if "${" in v]
    if templated:
        raise HarborUnsupportedError(name, [f"task.toml env values read from the host: {templated}"], ELSEWHERE)
    image = image.with_env(config.environment.env)
    solve = tp.discovered_solve_path_for(m.TaskOS.LINUX)
    return HarborTaskFolder(
        name=name,
        path=folder,
        instruction=strip_canary(tp.instruction_path.read_text()),
        config=config,
        image=image,
        test_script=test_path.relative_to(tp.tests_dir).as_posix(),
        solve_script=solve.relative_to(tp.solution_dir).as_posix() if solve is not None else None,
        verifier_env=verifier_env,
    )


def _config_needs(config: Any, m: Any) -> list[str]:
    """What task.toml asks for that a workspace on this host cannot give."""
    needs = [f"task.toml [[steps]]: a multi-step task ({len(config.steps)} steps)"] if config.steps else []
    needs += environment_needs(config.environment, linux=m.TaskOS.LINUX)
    if m.resolve_mode(config) != m.VerifierEnvironmentMode.SHARED:
        needs.append("task.toml [verifier] environment_mode = 'separate' (the verifier in a container of its own)")
    return needs


def environment_needs(env: Any, *, linux: Any, gpus: int | None = None) -> list[str]:
    """What task.toml's ``[environment]`` (``env``) asks for that a workspace cannot give: another
    OS than ``linux`` (harbor's ``TaskOS.LINUX``), GPUs (``gpus``: the count in force, default
    ``env.gpus``), TPUs, MCP servers."""
    needs, gpus = [], env.gpus if gpus is None else gpus
    if env.os != linux:
        needs.append(f"task.toml [environment] os = {env.os.value!r}")
    if gpus:
        kinds = f": {', '.join(env.gpu_types)}" if env.gpu_types else ""
        needs.append(f"task.toml [environment] gpus = {gpus} (GPUs{kinds})")
    if env.tpu is not None:
        needs.append("task.toml [environment] tpu (TPUs)")
    if env.mcp_servers:
        needs.append(f"task.toml [environment] mcp_servers ({len(env.mcp_servers)} servers)")
    return needs
