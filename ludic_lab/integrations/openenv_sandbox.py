"""The command line of a launched OpenEnv server inside bubblewrap, serving on a unix socket.

The threat model of :mod:`ludic_lab.envs.code_exec` (its ``isolation_args``, ``sealing_args``
and seccomp filter): new pid, network, ipc and uts namespaces (no network: the host's
127.0.0.1 and every other address are out of reach), a user namespace with no capability
(uid 1000 inside), an empty environment but for the few variables set here and ``env``, a
read-only root of ``/usr`` and the interpreter's installation, the package folders read-only
at ``/site/N`` (on ``sys.path`` through the workspace's ``sitecustomize``), the app's folder
read-only at its own path (the working directory), as is ludic_lab's own package folder, a
private writable tmpfs at ``/tmp``;
rlimits (address space, file size, open files, no core files) set before bubblewrap starts, and
the number of processes: ``RLIMIT_NPROC`` set inside the user namespace (so it counts only the
sandbox's processes, Linux >= 5.14), and, since the kernel exempts root's processes from it
(the sandbox's uid maps to the caller's), a ``pids`` cgroup per server when started as root
(:mod:`~ludic_lab.integrations.sandbox_pids`).
:func:`sandbox_argv` is the same command line for any Python program (a verifiers tool server:
:mod:`~ludic_lab.integrations.verifiers_tool_sandbox`).
The server listens on ``/ipc/server.sock``, the one writable folder shared with the host,
which reaches it through :class:`~ludic_lab.integrations.openenv_proxy.UnixSocketProxy`.
Killing bubblewrap kills the sandbox's pid 1 and with it every process the server started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ludic_lab.envs.code_exec.bwrap import find_bwrap, isolation_args, sealing_args
from ludic_lab.envs.code_exec.sandbox import Interpreter
from ludic_lab.envs.code_exec.seccomp import filter_program
from ludic_lab.envs.workspace.sandbox import SANDBOX_UID, SITECUSTOMIZE, package_folders

OWN_PACKAGE = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""ludic_lab's own folder, bound read-only so that an env server may import ludic_lab also from
an editable install (whose ``.pth`` points outside the package folders)."""
SOCKET = "/ipc/server.sock"
"""Where the server listens inside the sandbox."""
SET_LIMITS = (
    "import os, resource, sys; [resource.setrlimit(getattr(resource, n), (int(v), int(v))) for n, v in zip(("
    "'RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_CORE'), sys.argv[1:5])]; "
    "sys.argv[5] == '-' or open(sys.argv[5], 'w').write(str(os.getpid())); os.execv(sys.argv[6], sys.argv[6:])"
)
"""Run with the host's interpreter: sets the rlimits, joins the pids cgroup (a ``cgroup.procs``
path, or ``-``), then becomes bubblewrap (same pid)."""
SET_NPROC = (
    "import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_NPROC, (n, n)); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)
"""The first program inside the sandbox (in its user namespace): sets RLIMIT_NPROC, then becomes the server."""


@dataclass(frozen=True)
class ServerLimits:
    """Resource limits of every process of a sandboxed OpenEnv server (rlimits)."""

    memory_bytes: int = 16 * 2**30
    """RLIMIT_AS: address space of each process (threads' stacks count: keep it generous)."""
    file_size_bytes: int = 1 * 2**30
    """RLIMIT_FSIZE: largest file a process may write (the server's log included)."""
    open_files: int = 4096
    """RLIMIT_NOFILE: a WebSocket session holds one."""
    tmpfs_bytes: int = 256 * 2**20
    """Size of the private writable ``/tmp``."""
    processes: int = 512
    """RLIMIT_NPROC inside the sandbox (and ``pids.max`` of its cgroup as root): processes and
    threads together (uvicorn's and anyio's worker threads count). A fork bomb stops there."""

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "file_size_bytes", "open_files", "tmpfs_bytes", "processes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ServerLimits.{name} must be a positive int, got {value!r}")


def sites_of(python: str | None) -> tuple[str, ...]:
    """The package folders of ``python`` (default: the running interpreter), real paths."""
    if python is None:
        return package_folders()
    code = "import json, site; print(json.dumps([*site.getsitepackages(), site.getusersitepackages()]))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    found: list[str] = []
    for folder in json.loads(out):
        real = os.path.realpath(folder)
        if os.path.isdir(real) and real not in found:
            found.append(real)
    return tuple(found)


def _dirs(path: str) -> list[str]:
    """``--dir`` arguments (mode 0755) for the parents of ``path``, which bwrap would make 0700."""
    parts = path.strip("/").split("/")[:-1]
    args: list[str] = []
    for i in range(len(parts)):
        args += ["--perms", "0755", "--dir", "/" + "/".join(parts[: i + 1])]
    return args


def server_argv(
    uvicorn: Sequence[str],
    *,
    workdir: str,
    app_dir: str,
    python: str | None,
    env: Mapping[str, str],
    limits: ServerLimits,
    readable: Sequence[str] = (),
    writable: Sequence[str] = (),
    seccomp_fd: int | None,
    cgroup_procs: str | None = None,
) -> list[str]:
    """The whole command of an OpenEnv server: :func:`sandbox_argv` running ``python -m uvicorn``
    followed by ``uvicorn`` (the app and its options; it must serve on :data:`SOCKET`) in
    ``app_dir`` (bound read-only: the working directory)."""
    return sandbox_argv(
        ["-m", "uvicorn", *uvicorn], workdir=workdir, chdir=app_dir, python=python, env=env, limits=limits,
        readable=[app_dir, *readable], writable=writable, seccomp_fd=seccomp_fd, cgroup_procs=cgroup_procs,
    )  # fmt: skip


def sandbox_argv(
    program: Sequence[str],
    *,
    workdir: str,
    chdir: str | None,
    python: str | None,
    env: Mapping[str, str],
    limits: ServerLimits,
    readable: Sequence[str] = (),
    writable: Sequence[str] = (),
    seccomp_fd: int | None,
    cgroup_procs: str | None = None,
) -> list[str]:
    """The whole command: the rlimits (and the pids cgroup ``cgroup_procs``), then bubblewrap
    running the interpreter with arguments ``program`` in ``chdir`` (default: the private
    ``/tmp``). ``workdir``: the host's private folder for this server (its ``ipc`` is bound
    writable at ``/ipc``, its ``boot`` holds the ``sitecustomize`` and is bound at
    ``/site/boot``); ``readable`` / ``writable``: host folders (readable: also files) bound at
    their own paths. Refuses ``/`` and the home folder."""
    interpreter = Interpreter.from_executable(python) if python else Interpreter.current()
    sites = sites_of(python)
    boot = os.path.join(workdir, "boot")
    os.makedirs(boot, mode=0o755, exist_ok=True)
    with open(os.path.join(boot, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE.format(sites=[f"/site/{i}" for i in range(len(sites))]))
    os.makedirs(os.path.join(workdir, "ipc"), mode=0o700, exist_ok=True)
    args = isolation_args(find_bwrap(), interpreter, tmpfs_bytes=limits.tmpfs_bytes, as_root=False)
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
    args += ["--perms", "0755", "--dir", "/site", "--ro-bind", boot, "/site/boot"]
    for i, folder in enumerate(sites):
        args += ["--ro-bind", folder, f"/site/{i}"]
    args += ["--bind", os.path.join(workdir, "ipc"), "/ipc"]
    binds = [*((p, "--ro-bind") for p in readable), *((p, "--bind") for p in writable)]
    if not any(OWN_PACKAGE.startswith(site + "/") for site in sites):  # an editable install: its source
        binds.insert(0, (OWN_PACKAGE, "--ro-bind"))
    for folder, how in binds:
        real = os.path.realpath(folder)
        if real in ("/", os.path.realpath(os.path.expanduser("~"))):
            raise ValueError(
                f"{folder!r} would show the sandboxed server the whole machine or home folder; "
                "run it from (cwd=) the folder that holds the env's package"
            )
        if not (os.path.isdir(real) or (how == "--ro-bind" and os.path.isfile(real))):
            raise ValueError(f"{folder!r} is not a folder; the sandboxed server can be given folders only")
        args += [*_dirs(real), how, real, real]
    environment = {"PYTHONPATH": "/site/boot", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **env}
    sealing = sealing_args(info_fd=None, seccomp_fd=seccomp_fd, env=environment)
    if chdir is not None:
        sealing[sealing.index("--chdir") + 1] = os.path.realpath(chdir)  # `python -m` imports from there
    exe = interpreter.executable
    args += [*sealing, exe, "-I", "-S", "-c", SET_NPROC, str(limits.processes), exe, *program]
    rlimits = [limits.memory_bytes, limits.file_size_bytes, limits.open_files, 0]
    return [sys.executable, "-I", "-S", "-c", SET_LIMITS, *map(str, rlimits), cgroup_procs or "-", *args]


def seccomp_fd() -> int | None:
    """A readable fd of the seccomp filter (None where there is none); the caller closes it."""
    import tempfile

    program = filter_program()
    if program is None:
        return None
    with tempfile.TemporaryFile() as f:
        f.write(program)
        f.flush()
        return os.open(f"/proc/self/fd/{f.fileno()}", os.O_RDONLY)


def require_bwrap() -> None:
    """Raise :class:`~ludic_lab.envs.code_exec.sandbox.SandboxUnavailableError` naming the
    install and the opt-out when bubblewrap is missing."""
    from ludic_lab.envs.code_exec.sandbox import SandboxUnavailableError

    try:
        find_bwrap()
    except SandboxUnavailableError as exc:
        raise SandboxUnavailableError(
            f"{exc} -- OpenEnvServer.launch runs the env server in that sandbox; for an env you trust, "
            "sandbox='unsafe_local' runs it as a plain process (what its actions do, they do on this machine)"
        ) from None
