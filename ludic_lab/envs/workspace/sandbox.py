"""The command line of one workspace command: bubblewrap with the threat model of
:mod:`~ludic_lab.envs.code_exec` (its ``isolation_args`` and ``sealing_args``), the workspace
bound read-write at ``/workspace``, packages read-only at ``/site/N``, and the program of
:mod:`~ludic_lab.envs.workspace.inside` as the first process.

What a command sees: ``/usr`` and the interpreter's installation (read-only), ``/site/N``
(read-only package folders, on ``sys.path`` through ``/site/boot/sitecustomize.py``),
``/workspace`` (its own files, the only writable place that persists), a private tmpfs at
``/tmp`` (``HOME``, ``TMPDIR``; emptied after every command), ``/proc``, a minimal ``/dev``;
no ``/etc``, no network, no other workspace, nothing of the host's home or checkout.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ludic_lab.envs.code_exec.bwrap import isolation_args, sealing_args
from ludic_lab.envs.code_exec.sandbox import Interpreter
from ludic_lab.envs.code_exec.seccomp import filter_program

INSIDE_SOURCE = Path(__file__).with_name("inside.py")
SANDBOX_UID = 1000
"""The uid commands have inside a user namespace (started by a normal user)."""
SITECUSTOMIZE = '''"""Written by ludic_lab: the host's package folders in place of the base installation's
own site-packages, as a venv has them (after the standard library, .pth files processed)."""
import site
import sys

_base = set(site.getsitepackages())
sys.path[:] = [p for p in sys.path if p not in _base]
for folder in {sites!r}:
    site.addsitedir(folder)
'''


@dataclass(frozen=True)
class SandboxSetup:
    """What every command of a pool shares: the programs, the interpreter, the packages."""

    bwrap: str
    interpreter: Interpreter
    as_root: bool
    """Started as root: bubblewrap runs privileged and the program drops to the workspace's uid;
    else bubblewrap maps the user into a user namespace (uid :data:`SANDBOX_UID` inside)."""
    inside: str
    """Host path of the first program (byte-compiled with the sandbox's interpreter)."""
    seccomp: str | None
    """Host path of the seccomp filter, or None without one."""
    sites: tuple[str, ...] = ()
    """Host package folders, bound at ``/site/0``, ``/site/1``, ..."""
    boot: str | None = None
    """Host folder holding the ``sitecustomize.py`` that adds ``/site/N`` to ``sys.path``."""
    env: Mapping[str, str] = field(default_factory=dict)
    tmpfs_bytes: int = 128 * 2**20
    links: tuple[tuple[str, str], ...] = ()
    """Symbolic links (path, target) made in the root (:attr:`WorkspaceConfig.links`)."""

    def environment(self) -> dict[str, str]:
        """The commands' environment: a PATH that finds ``python`` first, HOME and TMPDIR in
        the private ``/tmp``, no pager, git trusting ``/workspace`` (owned by another uid)."""
        env = {
            "PATH": f"{self.interpreter.prefix}/bin:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "workspace",
            "LOGNAME": "workspace",
            "SHELL": "/bin/bash",
            "TERM": "dumb",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PIP_NO_INPUT": "1",
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
        }
        if self.boot is not None:
            env["PYTHONPATH"] = "/site/boot"
        return {**env, **self.env}


def package_folders() -> tuple[str, ...]:
    """The running interpreter's package folders (the venv's site-packages and the user's),
    never the project checkout itself."""
    import site

    found: list[str] = []
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        real = os.path.realpath(folder)
        if os.path.isdir(real) and real not in found:
            found.append(real)
    return tuple(found)


def prepare(
    root: str,
    interpreter: Interpreter,
    *,
    bwrap: str,
    sites: Sequence[str],
    seccomp: bool,
    env: Mapping[str, str],
    tmpfs_bytes: int,
    links: Sequence[tuple[str, str]] = (),
) -> SandboxSetup:
    """Write the pool's shared files into ``root`` (the first program, compiled once; the
    seccomp filter; the ``sitecustomize``) and describe the sandbox."""
    home = interpreter.prefix
    for link, _ in links:
        if link == home or link.startswith(home + "/") or home.startswith(link + "/"):
            raise ValueError(f"WorkspaceConfig.links: {link!r} would stand where the interpreter ({home}) is mounted")
    src, pyc = os.path.join(root, "inside.py"), os.path.join(root, "inside.pyc")
    with open(INSIDE_SOURCE, "rb") as f_in, open(src, "wb") as f_out:
        f_out.write(f_in.read())
    done = subprocess.run(
        [interpreter.executable, "-I", "-S", "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], "
         "cfile=sys.argv[2], dfile='inside.py', doraise=True)", src, pyc],
        capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    inside = pyc if done.returncode == 0 and os.path.exists(pyc) else src
    program = filter_program() if seccomp else None
    seccomp_path = None
    if program is not None:
        seccomp_path = os.path.join(root, "seccomp.bpf")
        with open(seccomp_path, "wb") as f:
            f.write(program)
    boot = None
    if sites:
        boot = os.path.join(root, "boot")
        os.mkdir(boot, 0o755)
        with open(os.path.join(boot, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE.format(sites=[f"/site/{i}" for i in range(len(sites))]))
    for path in (src, pyc, boot, seccomp_path):
        if path is not None and os.path.exists(path):
            os.chmod(path, 0o755 if os.path.isdir(path) else 0o644)
    return SandboxSetup(
        bwrap=bwrap,
        interpreter=interpreter,
        as_root=os.geteuid() == 0,
        inside=inside,
        seccomp=seccomp_path,
        sites=tuple(sites),
        boot=boot,
        env=dict(env),
        tmpfs_bytes=tmpfs_bytes,
        links=tuple(links),
    )


def workspace_argv(
    setup: SandboxSetup,
    mount: str,
    *,
    info_fd: int,
    seccomp_fd: int | None,
    prefix: Sequence[str] = (),
    in_user_ns: bool | None = None,
) -> list[str]:
    """The command line of one run over the workspace directory ``mount`` (a tree, or the
    overlay's mount point that ``prefix`` mounts). ``in_user_ns``: bubblewrap makes a user
    namespace (default: unless started as root)."""
    userns = (not setup.as_root) if in_user_ns is None else in_user_ns
    args = [*prefix, *isolation_args(setup.bwrap, setup.interpreter, tmpfs_bytes=setup.tmpfs_bytes, as_root=not userns)]
    if userns:  # the same uid whoever started it, and no capability even as root of an outer namespace
        args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
    if setup.sites or setup.boot:
        args += ["--perms", "0755", "--dir", "/site"]
    for i, folder in enumerate(setup.sites):
        args += ["--ro-bind", folder, f"/site/{i}"]
    if setup.boot is not None:
        args += ["--ro-bind", setup.boot, "/site/boot"]
    args += ["--ro-bind", setup.inside, "/ws_inside" + os.path.splitext(setup.inside)[1]]
    args += ["--bind", mount, "/workspace"]
    for path, target in setup.links:  # parents as bwrap makes them are 0700: unusable by the sandbox's user
        parts = path.strip("/").split("/")[:-1]
        for i in range(len(parts)):
            args += ["--perms", "0755", "--dir", "/" + "/".join(parts[: i + 1])]
        args += ["--symlink", target, path]
    args += sealing_args(info_fd=info_fd, seccomp_fd=seccomp_fd, env=setup.environment())
    return [*args, setup.interpreter.executable, "-I", "-S", "/ws_inside" + os.path.splitext(setup.inside)[1]]
