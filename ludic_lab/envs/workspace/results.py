"""What a workspace command returns (:class:`CommandResult`), and the errors of its file
operations (:class:`WorkspaceFileError`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

CommandStop = Literal[
    "exited",
    "timeout",
    "cpu_limit",
    "file_size_limit",
    "disk_quota",
    "disk_full",
    "supervisor_killed",
    "stopped",
    "sandbox_error",
]


def cut_marker(cut_bytes: int) -> str:
    """The line a command's output holds where its middle was not kept."""
    return f"\n[... {cut_bytes} bytes of output cut here ...]\n"


class WorkspaceFileError(ValueError):
    """A file operation the workspace refused or could not do (a path outside the workspace,
    a missing file, an edit whose text is absent or not unique); the message is for the model."""


class WorkspaceClosedError(RuntimeError):
    """The workspace (or its pool) was closed; its files are gone."""


@dataclass(frozen=True)
class CommandResult:
    """One ``bash -c`` command in a workspace, after every process it started is gone."""

    command: str
    output: str
    """stdout and stderr interleaved, as a terminal shows them; when long, its first and last
    parts (``output_head_bytes`` / ``output_tail_bytes``) around a line saying how much was cut."""
    exit_code: int | None
    """The shell's exit status (None when it was killed by a signal)."""
    signal: int | None
    stop_reason: CommandStop
    """``exited`` (by itself, any status), ``timeout``, ``cpu_limit``, ``file_size_limit``
    (a file grew past RLIMIT_FSIZE: the quota's rest), ``disk_quota`` / ``disk_full`` (stopped
    when the workspace passed its quota or the host's disk its floor), ``supervisor_killed``
    (the command killed the process that runs it: everything ended, its output is lost),
    ``stopped`` (the pool shut down, or the episode was cancelled), ``sandbox_error`` (the
    sandbox itself failed: not the command's doing)."""
    wall_s: float
    cpu_s: float
    peak_memory_bytes: int
    output_bytes: int
    """Bytes the command wrote to stdout and stderr in all."""
    output_cut_bytes: int
    """Bytes of the output that were not kept (the middle of a long output)."""
    disk_bytes: int
    """What the workspace holds beyond its snapshot after the command (bytes on disk)."""
    disk_entries: int

    @property
    def ok(self) -> bool:
        return self.stop_reason == "exited" and self.exit_code == 0

    @property
    def timed_out(self) -> bool:
        return self.stop_reason in ("timeout", "cpu_limit")

    def to_info(self) -> dict[str, Any]:
        """JSON-ready, without the output itself (for a step's info)."""
        info = asdict(self)
        info.pop("output")
        return info

    def __str__(self) -> str:
        """The output, and a last line when the command failed or was stopped."""
        why = {
            "timeout": "the command ran past its time limit and was killed (with every process it started)",
            "cpu_limit": "the command used its CPU time and was killed",
            "file_size_limit": "a file grew past the size limit (what is left of the workspace's disk quota)",
            "disk_quota": f"the workspace went over its disk quota ({self.disk_bytes} bytes used); the command was "
            "stopped: delete files to go on",
            "disk_full": "the host's disk is nearly full; the command was stopped",
            "supervisor_killed": "the command killed the process that supervises it; everything it started "
            "was stopped and its output is lost",
            "stopped": "the command was stopped",
            "sandbox_error": "the sandbox failed (not the command's fault)",
        }.get(self.stop_reason)
        if why is None:
            why = None if self.exit_code == 0 else (
                f"exit code {self.exit_code}" if self.exit_code is not None else f"killed by signal {self.signal}"
            )  # fmt: skip
        return self.output + (f"\n[{why}]" if why else "")


@dataclass(frozen=True)
class FileText:
    """Lines of a file as :meth:`Workspace.read_file` returns them."""

    path: str
    text: str
    """The lines ``first`` .. ``last``, each prefixed by its number and a tab (as ``cat -n``)."""
    lines: int
    """Lines in the whole file."""
    first: int
    last: int


@dataclass(frozen=True)
class FileEdit:
    """Where :meth:`Workspace.edit_file` replaced the text, and the lines around it now."""

    path: str
    line: int
    snippet: str
