"""The shell commands and archives behind a Harbor environment in a workspace
(:mod:`~ludic_lab.task.harbor_sandbox`), kept free of harbor so they type-check on Python 3.11.

    script = exec_script(command, cwd="/app", env={"K": "v"}, nonce=nonce)   # one Harbor exec
    stdout, stderr = split_output(result.output, nonce)
    payload = pack(Path("tests"))            # a host folder as base64 of a tar.gz
    extract(payload_bytes, Path("out"))      # what a download brought back, unpacked safely

A workspace command is ``bash -c`` with stdout and stderr on one pipe; a Harbor ``exec`` wants
them apart, so its command runs with stderr sent to a file in the command's private ``/tmp``
and printed after a nonce line. Files cross the sandbox's wall only through commands: a tar.gz
as base64 in the command line (or in chunks written by the workspace's file operation) on the
way in, a tar.gz as base64 on stdout on the way out, unpacked on the host with tarfile's
``data`` filter (links out of the tree, absolute paths and devices skipped, never followed).
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import re
import shlex
import tarfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

STDERR_CAP = 1 << 20
"""The last this many bytes of a command's stderr are kept (its stdout is cut by the pool's limits)."""
INLINE_CHARS = 60_000
"""An upload up to this many base64 characters rides in the command line; a longer one is written first."""
TAR_ERROR = "HARBOR-TAR-FAILED"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TransferError(RuntimeError):
    """A file or folder could not cross the sandbox's wall (missing, unreadable, too large)."""


def exports(env: Mapping[str, str]) -> str:
    """``export K=V`` lines for ``env``; a name the shell cannot set is a ``ValueError``."""
    bad = [k for k in env if not _NAME.fullmatch(k)]
    if bad:
        raise ValueError(f"environment variable names must be shell identifiers, got {bad}")
    return "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in env.items())


def exec_script(command: str, *, cwd: str, env: Mapping[str, str], nonce: str) -> str:
    """The workspace command of one Harbor ``exec``: ``env`` exported, ``bash -c command`` run
    in ``cwd`` with stderr kept apart (its last :data:`STDERR_CAP` bytes printed after ``nonce``);
    the script exits with the command's status."""
    return (
        exports(env)
        + "__hb_err=$(mktemp /tmp/.harbor-stderr.XXXXXX) || exit 125\n"
        + f'(cd -- {shlex.quote(cwd)} && exec bash -c {shlex.quote(command)}) 2>"$__hb_err"\n'
        + "__hb_rc=$?\n"
        + f"printf '\\n%s\\n' {shlex.quote(nonce)}\n"
        + f'tail -c {STDERR_CAP} "$__hb_err"\n'
        + 'exit "$__hb_rc"\n'
    )


def split_output(output: str, nonce: str) -> tuple[str, str]:
    """(stdout, stderr) of an :func:`exec_script` run; all stdout when the nonce line never came
    (the command was killed before the script printed it)."""
    mark = f"\n{nonce}\n"
    at = output.rfind(mark)
    if at < 0:
        return output, ""
    return output[:at], output[at + len(mark) :]


def pack(source: Path, *, arcname: str | None = None) -> str:
    """``source`` (a folder: its contents; a file: itself, named ``arcname``) as base64 of a tar.gz."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        if source.is_dir():
            for child in sorted(source.iterdir()):
                tar.add(child, arcname=child.name)
        elif source.is_file():
            tar.add(source, arcname=arcname or source.name)
        else:
            raise FileNotFoundError(f"{source}: no such file or folder to upload")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def unpack_script(sources: list[str], dest: str) -> str:
    """Shell lines that make ``dest`` and unpack into it the base64 tar.gz in ``sources``
    (one inline payload, or workspace files concatenated in order, removed afterwards)."""
    q = shlex.quote(dest)
    head = f"set -o pipefail\nmkdir -p -- {q} || exit 1\n"
    if len(sources) == 1 and not sources[0].startswith("@"):
        return head + f"printf %s {shlex.quote(sources[0])} | base64 -d | tar -xzf - -C {q} --no-same-owner\n"
    files = " ".join(shlex.quote("/workspace/" + s[1:]) for s in sources)
    return head + f"cat {files} | base64 -d | tar -xzf - -C {q} --no-same-owner\nrc=$?\nrm -f {files}\nexit $rc\n"


def pack_script(source: str, *, exclude: list[str] | None = None) -> str:
    """Shell lines that print ``source`` (a folder: its contents) as base64 of a tar.gz and
    nothing else; a failure prints :data:`TAR_ERROR` and tar's message, and exits non-zero.
    tar's status 1 ("file changed as we read it") is accepted, as Harbor accepts it."""
    flags = "".join(f" --exclude={shlex.quote(p)}" for p in exclude or [])
    return (
        "set -o pipefail\n"
        f"cd -- {shlex.quote(source)} 2>/tmp/.hb-tar-err || {{ echo {TAR_ERROR}; cat /tmp/.hb-tar-err; exit 3; }}\n"
        f"tar -czf -{flags} . 2>/tmp/.hb-tar-err | base64 -w0\n"
        "rc=$?\n"
        f'if [ "$rc" -gt 1 ]; then echo; echo {TAR_ERROR}; cat /tmp/.hb-tar-err; exit "$rc"; fi\n'
    )


def file_script(source: str) -> str:
    """Shell lines that print the regular file ``source`` as base64, or :data:`TAR_ERROR` and why."""
    q = shlex.quote(source)
    return (
        f"if [ ! -f {q} ]; then echo {TAR_ERROR}; echo {q}: no such file; exit 3; fi\n"
        f"base64 -w0 < {q} 2>/tmp/.hb-err || {{ echo; echo {TAR_ERROR}; cat /tmp/.hb-err; exit 2; }}\n"
    )


def decode(output: str, *, cut_bytes: int, what: str, limit_bytes: int) -> bytes:
    """The bytes a :func:`pack_script` / :func:`file_script` printed, or a :class:`TransferError`
    saying why there are none (its message, or an output over ``limit_bytes``)."""
    if TAR_ERROR in output:
        raise TransferError(f"{what}: {output.split(TAR_ERROR, 1)[1].strip()[-500:]}")
    if cut_bytes:
        raise TransferError(f"{what} is larger than {limit_bytes} bytes as base64 (max_transfer_mb)")
    try:
        return base64.b64decode("".join(output.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise TransferError(f"{what}: the sandbox's output is not base64 ({e}): {output[:200]!r}") from e


def extract(data: bytes, target: Path) -> list[str]:
    """Unpack a tar.gz into ``target`` with tarfile's ``data`` filter; a member it refuses (a
    link out of the tree, an absolute path, a device or FIFO) is skipped, never followed.
    Returns the skipped members' names."""
    skipped: list[str] = []

    def safe(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        if member.isdev():
            skipped.append(member.name)
            return None
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError:
            skipped.append(member.name)
            return None

    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(target, filter=safe)
    if skipped:
        log.warning("download into %s skipped what the data filter refuses: %s", target, skipped[:20])
    return skipped


def is_private_tmp(path: str) -> bool:
    """``path`` lies in ``/tmp``, which is private to each workspace command (gone after it)."""
    p = PurePosixPath(path)
    return p == PurePosixPath("/tmp") or PurePosixPath("/tmp") in p.parents
