"""``BubblewrapEnvironment``: Harbor's environment interface over a ludic_lab workspace, so that
``harbor run`` and Harbor's own ``Trial`` / ``Verifier`` run a task in bubblewrap, without Docker.

    harbor run -p ludic_lab/data/harbor/hello-file -a oracle \\
        --env ludic_lab.task.harbor_sandbox:BubblewrapEnvironment

Needs Python >= 3.12 with ``harbor`` (its ``BaseEnvironment`` is PEP 695 syntax); on 3.11 this
module raises ``ImportError``. ``start`` maps the task's Dockerfile onto a workspace exactly as
ludic_lab's own Harbor loader does (:mod:`~ludic_lab.task.harbor_image`: ``FROM`` python /
ubuntu / debian, ``WORKDIR``, ``COPY``, ``ENV``; anything that builds is refused, named by
line) and creates one :class:`~ludic_lab.envs.workspace.Workspace` in a pool of its own. Every
``exec`` is one workspace command (docs/workspace.md's threat model: no network, seccomp,
rlimits, a disk quota, every process killed when the command ends); files persist, processes do
not. The workspace tree holds the working directory (linked at its container path) and
``.harbor/{logs,tests,solution}`` (linked at ``/logs``, ``/tests``, ``/solution``), so Harbor's
paths persist from one command to the next. ``stop`` removes all of it. docs/harbor.md.
"""

from __future__ import annotations

import sys

if sys.version_info < (3, 12):  # harbor's environment interface is a SyntaxError before 3.12
    raise ImportError(
        "ludic_lab.task.harbor_sandbox needs Python >= 3.12 with harbor installed (harbor's BaseEnvironment "
        "uses PEP 695 syntax): python3.12 -m venv V && V/bin/pip install harbor==0.26.0 (docs/harbor.md)"
    )

import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode, TaskOS
from harbor.utils.path_filter import filter_paths_by_patterns
from pydantic import Field, field_validator

from ludic_lab.envs.workspace import Snapshot, Workspace, WorkspaceConfig, WorkspaceLimits, WorkspacePool
from ludic_lab.task.harbor_folder import ELSEWHERE, environment_needs
from ludic_lab.task.harbor_image import HarborImage, HarborUnsupportedError, read_dockerfile, script_needs
from ludic_lab.task.harbor_transfer import (
    INLINE_CHARS,
    TransferError,
    decode,
    exec_script,
    extract,
    file_script,
    is_private_tmp,
    pack,
    pack_script,
    split_output,
    unpack_script,
)

log = logging.getLogger(__name__)
HARBOR_DIR = ".harbor"
"""The workspace folder that holds Harbor's own paths (``/logs``, ``/tests``, ``/solution`` link there)."""
HARBOR_PATHS = ("logs", "tests", "solution")
HARBOR_DIRS = ("logs/agent", "logs/verifier", "logs/artifacts", "tests", "solution")
RESTORE = "mkdir -p " + " ".join(f"/workspace/{HARBOR_DIR}/{name}" for name in HARBOR_DIRS) + " 2>/dev/null\n"
"""Run first by every exec and upload: the links' targets are there again if a command removed them."""
MiB = 1 << 20


class BubblewrapOptions(EnvironmentOptions):
    """What ``--ek key=value`` may set (``harbor run ... --ek command_timeout_sec=600``)."""

    python: str | None = Field(default=None, description="The commands' python (default: the running one's base).")
    site_packages: list[str] | None = Field(
        default=None, description="Package folders on the commands' sys.path (default: the running venv's; [] none)."
    )
    command_timeout_sec: float = Field(
        default=3600.0, gt=0, description="The deadline of an exec that names none (Harbor's timeouts cancel earlier)."
    )
    disk_quota_mb: int = Field(default=1024, gt=0, description="What the task may add to its files (or storage_mb).")
    max_transfer_mb: int = Field(default=64, gt=0, description="The largest download (a tar.gz as base64).")

    @field_validator("python")
    @classmethod
    def _an_interpreter(cls, value: str | None) -> str | None:
        if value is not None and not (os.path.isfile(value) and os.access(value, os.X_OK)):
            raise ValueError(f"python={value!r} is not an executable file (give the interpreter's path)")
        return os.path.realpath(value) if value is not None else None

    @field_validator("site_packages")
    @classmethod
    def _folders(cls, value: list[str] | None) -> list[str] | None:
        missing = [p for p in value or [] if not os.path.isdir(p)]
        if missing:
            raise ValueError(f"site_packages: no such folders {missing}")
        return [os.path.realpath(p) for p in value] if value is not None else None


class BubblewrapEnvironment(BaseEnvironment):
    """A Harbor environment whose container is a ludic_lab workspace (module docstring)."""

    options_model = BubblewrapOptions
    options: BubblewrapOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._image: HarborImage | None = None
        self._pool: WorkspacePool | None = None
        self._ws: Workspace | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "ludic-bwrap"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """No network ever (so ``no-network`` is enforced); no GPUs, TPUs, allowlists, mounts, compose."""
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        """No CPU or memory limit or request is applied (a CPU count is not enforced, whole or not)."""
        return EnvironmentResourceCapabilities(fractional_cpus=True)

    # -- what the task needs ---------------------------------------------------------------------
    def _validate_definition(self) -> None:
        """Refuse (``HarborUnsupportedError``, naming each need) a task this host cannot run."""
        image, needs = self.needs()
        if needs or image is None:
            raise HarborUnsupportedError(self.environment_name, needs, ELSEWHERE)
        self._image = image

    def needs(self) -> tuple[HarborImage | None, list[str]]:
        """The Dockerfile as a workspace, and what the task asks for that this host cannot give."""
        cfg = self.task_env_config
        needs = environment_needs(cfg, linux=TaskOS.LINUX, gpus=self._effective_gpus)
        if self.network_policy.network_mode == NetworkMode.ALLOWLIST:
            needs.append(f"network access to {', '.join(self.network_policy.allowed_hosts)} (a workspace has none)")
        image = None
        if cfg.docker_image:
            needs.append(f"task.toml [environment] docker_image = {cfg.docker_image!r} (a prebuilt image)")
        else:
            image, image_needs = read_dockerfile(self.environment_dir, interpreter_prefix=self._interpreter_prefix())
            needs += image_needs
        if image is not None:
            if image.workdir.strip("/").split("/")[0] == HARBOR_DIR:
                needs.append(f"environment/Dockerfile: WORKDIR {image.workdir} (where Harbor's paths are kept)")
            if cfg.workdir and not _under(cfg.workdir, image.workdir):
                needs.append(f"task.toml [environment] workdir = {cfg.workdir!r}, outside the image's working "
                             f"directory {image.workdir} (only that directory is the workspace)")  # fmt: skip
            tests = self.environment_dir.parent / "tests" / "test.sh"
            if self.environment_dir.name == "environment" and tests.is_file():
                known = ("/tests", "/logs", "/solution", image.workdir)
                needs += script_needs(tests.read_text(errors="replace"), "tests/test.sh", known_dirs=known)
        return image, needs

    def _interpreter_prefix(self) -> str:
        python = self.options.python
        if python is None:
            return sys.base_prefix
        from ludic_lab.envs.code_exec.sandbox import Interpreter

        return Interpreter.from_executable(python).prefix

    # -- start and stop --------------------------------------------------------------------------
    @property
    def workdir(self) -> str:
        """Where commands run unless told otherwise: task.toml's ``workdir``, else the image's."""
        assert self._image is not None
        return self.task_env_config.workdir or self._image.workdir

    def _config(self) -> WorkspaceConfig:
        assert self._image is not None
        workdir = self._image.workdir
        links = {f"/{name}": f"/workspace/{HARBOR_DIR}/{name}" for name in HARBOR_PATHS}
        if workdir != "/workspace":
            links[workdir] = "/workspace" + workdir
        storage = self._effective_storage_mb
        limits = WorkspaceLimits(
            timeout_s=self.options.command_timeout_sec,
            disk_quota_bytes=(storage if storage else self.options.disk_quota_mb) * MiB,
            output_head_bytes=self.options.max_transfer_mb * MiB,
            output_tail_bytes=2 * MiB,
            max_file_bytes=8 * MiB,
        )
        env = {**self._image.env, **self._persistent_env}
        return WorkspaceConfig(limits=limits, python=self.options.python, site_packages=self.options.site_packages,
                               env=env, links=links)  # fmt: skip

    def _snapshot_tree(self, root: Path) -> None:
        """The task's files at the working directory's place, and Harbor's folders."""
        assert self._image is not None
        workdir = self._image.workdir
        self._image.build(root if workdir == "/workspace" else root / workdir.lstrip("/"))
        for sub in HARBOR_DIRS:
            (root / HARBOR_DIR / sub).mkdir(parents=True, exist_ok=True)

    async def start(self, force_build: bool) -> None:
        """Make the workspace (``force_build`` changes nothing: nothing is built)."""
        if self._ws is not None:
            return
        staging = Path(tempfile.mkdtemp(prefix="ludic-harbor-"))
        pool = WorkspacePool(1, config=self._config(), max_workspaces=1)
        try:
            self._snapshot_tree(staging / "tree")
            await pool.start()
            self._ws = await pool.create(Snapshot.folder(staging / "tree"))
            self._pool = pool
        except BaseException:
            await pool.shutdown()
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.debug("Harbor environment %s in workspace %s (%s)", self.session_id, self._ws.name, pool.strategy)

    async def stop(self, delete: bool) -> None:
        """Kill what runs, remove the workspace and its pool (whatever ``delete`` says: nothing is kept)."""
        ws, pool, self._ws, self._pool = self._ws, self._pool, None, None
        try:
            if ws is not None:
                await ws.close()
        finally:
            if pool is not None:
                await pool.shutdown()

    @property
    def workspace(self) -> Workspace:
        """The running workspace; ``RuntimeError`` before ``start`` or after ``stop``."""
        if self._ws is None:
            raise RuntimeError(f"{self.type()} environment {self.session_id} is not started (await env.start(...))")
        return self._ws

    # -- commands --------------------------------------------------------------------------------
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """``bash -c command`` in ``cwd`` (default the working directory) in a fresh sandbox;
        ``RuntimeError`` at ``timeout_sec`` (as Harbor's Docker environment), with every process
        killed. ``user`` is not honoured: every command runs as the workspace's one user."""
        nonce = "HARBOR-EXEC-" + secrets.token_hex(8)
        script = RESTORE + exec_script(command, cwd=cwd or self.workdir, env=self._merge_env(env) or {}, nonce=nonce)
        timeout = float(timeout_sec) if timeout_sec else None
        result = await self.workspace.run(script, timeout_s=timeout)
        if result.stop_reason == "timeout":
            raise RuntimeError(f"Command timed out after {timeout_sec or self.options.command_timeout_sec} seconds")
        if result.stop_reason == "sandbox_error":
            raise RuntimeError(f"the workspace sandbox failed: {result.output.strip()[-500:]}")
        stdout, stderr = split_output(result.output, nonce)
        code = result.exit_code
        if code is None or result.stop_reason != "exited":
            stderr += f"\n[the command was stopped: {result.stop_reason}]\n"
            code = code if code is not None else 128 + (result.signal or 9)
        if (emit := self._output_callback()) is not None:
            if stdout:
                await emit(stdout, "stdout")
            if stderr:
                await emit(stderr, "stderr")
        return ExecResult(stdout=stdout or None, stderr=stderr or None, return_code=code)

    async def _run(self, script: str) -> Any:
        return await self.workspace.run(script, timeout_s=self.options.command_timeout_sec)

    # -- files -----------------------------------------------------------------------------------
    def _target(self, path: str) -> str:
        p = PurePosixPath(path)
        if not p.is_absolute():
            p = PurePosixPath(self.workdir) / p
        if is_private_tmp(str(p)):
            raise ValueError(f"{path}: /tmp is private to each command in a {self.type()} environment (gone after "
                             "it); upload into the working directory, /logs, /tests or /solution")  # fmt: skip
        return str(p)

    async def _upload(self, payload: str, dest: str) -> None:
        if len(payload) <= INLINE_CHARS:
            sources = [payload]
        else:
            chunk, tag = self.workspace.limits.max_file_bytes, secrets.token_hex(6)
            sources = []
            for i in range(0, len(payload), chunk):
                name = f"{HARBOR_DIR}/upload-{tag}.{i // chunk}"
                await self.workspace.write_file(name, payload[i : i + chunk])
                sources.append("@" + name)
        result = await self._run(RESTORE + unpack_script(sources, dest))
        if not result.ok:
            raise TransferError(f"upload to {dest} failed ({result.stop_reason}): {result.output.strip()[-500:]}")

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a host file to ``target_path`` in the workspace (made with its folders)."""
        target = PurePosixPath(self._target(target_path))
        await self._upload(pack(Path(source_path), arcname=target.name), str(target.parent))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a host folder's contents into ``target_dir`` in the workspace (made if missing)."""
        source = Path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"{source}: no such folder to upload")
        await self._upload(pack(source), self._target(target_dir))

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a workspace file to the host (read in the sandbox, written by the host)."""
        source = self._target(source_path)
        result = await self._run(file_script(source))
        data = decode(result.output, cut_bytes=result.output_cut_bytes, what=f"download of {source}",
                      limit_bytes=self.workspace.limits.output_head_bytes)  # fmt: skip
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a workspace folder's contents into a host folder (overwriting; links leaving the
        tree, devices and FIFOs are skipped)."""
        await self.download_dir_with_exclusions(source_dir=source_dir, target_dir=target_dir, exclude=[])

    async def download_dir_with_exclusions(self, *, source_dir: str, target_dir: Path | str,
                                           exclude: list[str]) -> None:  # fmt: skip
        """:meth:`download_dir` without what tar's ``--exclude`` patterns name (one command, no /tmp)."""
        source = self._target(source_dir)
        result = await self._run(pack_script(source, exclude=exclude))
        data = decode(result.output, cut_bytes=result.output_cut_bytes, what=f"download of {source}",
                      limit_bytes=self.workspace.limits.output_head_bytes)  # fmt: skip
        extract(data, Path(target_dir))

    async def download_dir_filtered(self, *, source_dir: str, target_dir: Path | str, include: Any = None,
                                    exclude: Any = None, protect: Any = None) -> None:  # fmt: skip
        """Harbor's filtered download (fnmatch globs; exclude wins; ``protect`` always kept),
        done as Harbor does it for Windows: the whole folder, then the selection copied."""
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            staged = Path(tmp)
            await self.download_dir(source_dir, staged)
            paths = [p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file() and not p.is_symlink()]
            selected = filter_paths_by_patterns(paths, include=include, exclude=exclude)
            selected += [p for p in paths if p in (protect or ()) and p not in selected]
            for name in selected:
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(staged / name, target / name)


def _under(path: str, root: str) -> bool:
    p, r = PurePosixPath(path), PurePosixPath(root)
    return p == r or r in p.parents
