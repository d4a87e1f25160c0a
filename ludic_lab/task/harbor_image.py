"""A Harbor task's Dockerfile mapped onto a workspace, and what its scripts need from the host.

A workspace is not an image: nothing is installed, the host's ``/usr`` is what commands see.
So a Dockerfile is accepted only when it builds nothing: ``FROM`` a python, ubuntu or debian
base, ``WORKDIR``, ``COPY`` (from the build context, into the final working directory: the
files of the workspace's snapshot), ``ENV``, and the lines that build nothing (``LABEL``,
``CMD``, ``ENTRYPOINT``, ``EXPOSE``, ``VOLUME``). Any other line (``RUN apt-get``, ``ADD``,
``USER``, ``COPY --from``) is a need, named with its line number; so is a command of
``tests/test.sh`` that this host lacks or that needs the network (``apt-get``, ``curl``, ...).
"""

from __future__ import annotations

import glob
import os
import posixpath
import re
import shlex
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ludic_lab.envs.workspace.config import RESERVED_ROOTS

BASES = ("python", "ubuntu", "debian")
"""Base images whose tools a workspace on a Linux host with Python has (bash, coreutils, python)."""
NETWORK_COMMANDS = frozenset(
    {"apt-get", "apt", "apk", "yum", "dnf", "curl", "wget", "pip", "pip3", "uv", "uvx", "npm", "npx", "conda"}
)
"""Commands that fetch from the network (a workspace has none): a test script using one is refused."""
SHELL_WORDS = frozenset(
    "if then else elif fi for while until do done case esac in function select time ! { } [[ ]] [ test echo "
    "printf cd pwd export source . exit return set unset local read true false shift eval exec trap wait "
    "declare typeset let break continue alias type command hash umask ulimit pushd popd dirs getopts "
    "shopt kill jobs bg fg disown builtin readonly mapfile".split()
)
IGNORED = frozenset({"LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "VOLUME", "STOPSIGNAL", "MAINTAINER"})
_SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "(", ")", "!", "{", "then", "do", "else", "elif", "if", "while",
                         "until", "time", ";;", "|&"})  # fmt: skip


class HarborUnsupportedError(RuntimeError):
    """A valid Harbor task this host cannot run: ``needs`` names each thing (a Dockerfile line,
    a test-script line, a task.toml setting); ``where`` says where it runs."""

    def __init__(self, task: str, needs: Sequence[str], where: str) -> None:
        self.task, self.needs, self.where = task, tuple(needs), where
        lines = "\n".join(f"  - {n}" for n in self.needs) or "  - (nothing this host can map)"
        super().__init__(f"Harbor task {task!r} needs what a workspace on this host cannot give:\n{lines}\n{where}")


@dataclass(frozen=True)
class HarborImage:
    """What a Dockerfile that builds nothing amounts to, in workspace terms."""

    base: str
    workdir: str
    """The final ``WORKDIR``: the workspace root (the sandbox links it to ``/workspace``)."""
    env: Mapping[str, str] = field(default_factory=dict)
    copies: tuple[tuple[str, str], ...] = ()
    """(host path in the build context, path relative to the workspace root), in order."""

    def with_env(self, extra: Mapping[str, str]) -> HarborImage:
        return replace(self, env={**self.env, **extra})

    def links(self) -> dict[str, str]:
        """The sandbox's links: the working directory, ``/tests``, ``/logs``, ``/solution``
        (the last three into the command's private ``/tmp``, filled by the verifier's command)."""
        links = {"/tests": "/tmp/harbor/tests", "/logs": "/tmp/harbor/logs", "/solution": "/tmp/harbor/solution"}
        if self.workdir != "/workspace":
            links[self.workdir] = "/workspace"
        return links

    def build(self, dest: Path) -> None:
        """Write the snapshot: every ``COPY`` into ``dest`` (the workspace root), in order."""
        dest.mkdir(parents=True, exist_ok=True)
        for src, rel in self.copies:
            target = dest / rel if rel else dest
            if os.path.isdir(src):
                shutil.copytree(src, target, dirs_exist_ok=True, symlinks=True)
            else:
                if rel.endswith("/") or target.is_dir():
                    target = target / os.path.basename(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with backslash continuations joined, comments and blanks gone."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not buf:
            start = no
        if line.endswith("\\"):
            buf += line[:-1].strip() + " "
            continue
        out.append((start, (buf + line.strip()).strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def read_dockerfile(env_dir: Path, *, interpreter_prefix: str) -> tuple[HarborImage | None, list[str]]:
    """``environment/Dockerfile`` as a :class:`HarborImage`, and the needs it names (empty when
    a workspace can stand in for its image)."""
    needs: list[str] = []
    for name in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
        if (env_dir / name).is_file():
            needs.append(f"environment/{name}: services in containers of their own")
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        return None, needs + ["environment/Dockerfile (none found)"]
    base, workdir, env = "", "/", {}
    copies: list[tuple[str, str]] = []  # (host source, absolute destination)
    for no, line in logical_lines(dockerfile.read_text(errors="replace")):
        where = f"environment/Dockerfile:{no}: {line}"
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            base = rest.split()[0] if rest else ""
            repo = base.split(":")[0].split("@")[0].removeprefix("docker.io/").removeprefix("library/")
            if repo not in BASES or " AS " in f" {rest.upper()} " and len(rest.split()) > 1:
                needs.append(f"{where} (a base image whose tools this host lacks; it has {', '.join(BASES)}'s)")
        elif word == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, rest.strip("\"'")))
        elif word == "ENV":
            parsed = _env_pairs(rest)
            if parsed is None or any("$" in v for v in parsed.values()):
                needs.append(f"{where} (an ENV this reader does not expand)")
            else:
                env.update(parsed)
        elif word == "COPY":
            needs += _copy(rest, env_dir, workdir, copies, where)
        elif word not in IGNORED:
            needs.append(f"{where} (builds the image: a workspace installs nothing)")
    needs += _workdir_needs(workdir, interpreter_prefix, dockerfile)
    rel_copies = []
    for src, dest in copies:
        inside = dest == workdir or dest.startswith(workdir.rstrip("/") + "/")
        if not inside:
            needs.append(f"environment/Dockerfile: COPY to {dest}, outside the working directory {workdir} "
                         "(only the working directory is the workspace)")  # fmt: skip
            continue
        rel = posixpath.relpath(dest, workdir) if dest != workdir else ""
        rel_copies.append((src, "" if rel == "." else rel + ("/" if dest.endswith("/") else "")))
    return HarborImage(base, workdir, env, tuple(rel_copies)), needs


def _workdir_needs(workdir: str, interpreter_prefix: str, dockerfile: Path) -> list[str]:
    top = workdir.strip("/").split("/")[0]
    if workdir == "/workspace":
        return []
    if workdir == "/" or top in RESERVED_ROOTS or top in {"tests", "logs", "solution"}:
        return [f"environment/Dockerfile: WORKDIR {workdir} (the sandbox has its own files there)"]
    prefix = interpreter_prefix.rstrip("/")
    if workdir == prefix or prefix.startswith(workdir + "/") or workdir.startswith(prefix + "/"):
        return [f"environment/Dockerfile: WORKDIR {workdir} (where this host's Python is mounted)"]
    return []


def _env_pairs(rest: str) -> dict[str, str] | None:
    try:
        words = shlex.split(rest)
    except ValueError:
        return None
    if not words:
        return None
    if "=" not in words[0]:  # the legacy form: ENV KEY value with spaces
        key, _, value = rest.partition(" ")
        return {key: value.strip().strip("\"'")}
    pairs = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            return None
        pairs[key] = value
    return pairs


def _copy(rest: str, env_dir: Path, workdir: str, copies: list[tuple[str, str]], where: str) -> list[str]:
    try:
        words = shlex.split(rest)
    except ValueError:
        return [f"{where} (unreadable)"]
    flags = [w for w in words if w.startswith("--")]
    words = [w for w in words if not w.startswith("--")]
    if any(not f.startswith(("--chown", "--chmod", "--link")) for f in flags) or len(words) < 2 or rest.startswith("["):
        return [f"{where} (copies from another image or stage)"]
    *sources, dest = words
    dest_abs = posixpath.normpath(posixpath.join(workdir, dest)) + ("/" if dest.endswith("/") else "")
    context = env_dir.resolve()
    for src in sources:
        matches = sorted(glob.glob(str(context / src))) if any(c in src for c in "*?[") else [str(context / src)]
        for match in matches:
            real = Path(match).resolve()
            if not (real == context or context in real.parents) or not real.exists():
                return [f"{where} ({src} is not in the build context environment/)"]
            target = dest_abs
            if len(sources) > 1 or len(matches) > 1:
                target = dest_abs.rstrip("/") + "/"
            copies.append((str(real), target))
    return []


def script_needs(text: str, where: str, *, known_dirs: Iterable[str]) -> list[str]:
    """The lines of a shell script whose command needs the network or is not on this host's
    ``PATH`` (the sandbox's: the interpreter's ``bin``, ``/usr/local/bin``, ``/usr/bin``, ``/bin``)."""
    path = [os.path.join(sys.base_prefix, "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
    functions = set(re.findall(r"^\s*(?:function\s+)?([A-Za-z_][\w-]*)\s*\(\)", text, re.MULTILINE))
    needs = []
    for no, line in _lines_without_heredocs(text):
        for cmd in _commands(line):
            if cmd in SHELL_WORDS or cmd in functions or "$" in cmd or "=" in cmd.split("/")[0]:
                continue
            if cmd in NETWORK_COMMANDS:
                needs.append(f"{where}:{no}: {line} ({cmd} needs the network; a workspace has none)")
            elif cmd.startswith("/"):
                if not any(cmd == d or cmd.startswith(d.rstrip("/") + "/") for d in known_dirs) and not visible(cmd):
                    needs.append(f"{where}:{no}: {line} ({cmd} is not on this host)")
            elif "/" not in cmd and not any(visible(os.path.join(p, cmd)) for p in path):
                needs.append(f"{where}:{no}: {line} ({cmd} is not on this host)")
    return needs


def visible(path: str, *, roots: Sequence[str] = ("/usr/", "/bin/", "/sbin/", "/lib")) -> bool:
    """``path`` is an executable a workspace command can run: it and every link on the way lie
    under what the sandbox mounts (``/usr``, ``/bin``, ..., this Python), not ``/etc`` (e.g. the
    ``/etc/alternatives`` link of ``awk``: the sandbox has no ``/etc``)."""
    mounted = (*roots, sys.base_prefix.rstrip("/") + "/")
    for _ in range(40):
        if not path.startswith(mounted):
            return False
        if not os.path.islink(path):
            return os.path.isfile(path) and os.access(path, os.X_OK)
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return False


def _lines_without_heredocs(text: str) -> list[tuple[int, str]]:
    out, end = [], None
    for no, line in logical_lines(text):
        if end is not None:
            if line.strip() == end:
                end = None
            continue
        m = re.search(r"<<-?\s*['\"]?([A-Za-z_]\w*)['\"]?", line)
        if m:
            end = m.group(1)
        out.append((no, line))
    return out


def _commands(line: str) -> list[str]:
    """The words in command position of one shell line (best effort: an unreadable line gives none)."""
    try:
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        tokens = list(lex)
    except ValueError:
        return []
    cmds, expect, prefixed = [], True, False
    for tok in tokens:
        if tok in _SEPARATORS:
            expect, prefixed = True, False
            continue
        if tok.startswith((">", "<")) or tok in {"<", ">", ">>", "2>", "&>"}:
            expect = False
            continue
        if expect:
            if re.fullmatch(r"[A-Za-z_]\w*=.*", tok):  # VAR=value before a command
                continue
            if prefixed and (tok.startswith("-") or re.fullmatch(r"[\d.]+[smhd]?", tok)):  # timeout -k 5 10 cmd
                continue
            cmds.append(tok)
            prefixed = expect = tok in {"sudo", "env", "nohup", "timeout", "xargs", "nice"}
    return cmds
