"""Reading what a torchrun run writes: the teed console log, the per-rank log files, the
metrics JSONL, and torchrun's report of which rank failed first.

:class:`~ludic_lab.lab.torchrun.TorchrunRun` polls these while the run goes and builds its
:class:`~ludic_lab.lab.torchrun.TorchrunError` from them when it fails. Nothing here starts
or stops a process.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

RANK_PREFIX = re.compile(r"^\[(?:[A-Za-z_]\w*?)?(\d+)\]:")
"""The ``[default<rank>]:`` prefix torchrun's ``--tee`` puts before each rank's line."""


class JSONLTail:
    """Reads the rows appended to a JSONL file since construction (a torn last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        """The JSON objects of the lines completed since the last call (other lines skipped)."""
        try:
            with self.path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:  # truncated / rewritten: start over
                    self.offset, self._partial = 0, b""
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        rows = []
        for ln in lines:
            if not ln.strip():
                continue
            try:
                row = json.loads(ln)
            except ValueError:
                continue  # not a metrics line; the file's own reader reports it
            if isinstance(row, dict):
                rows.append(row)
        return rows


def rank_lines(console: str, rank: int | None, n: int) -> str:
    """The last ``n`` lines of ``rank`` in the teed ``console`` text (prefix removed), or of
    torchrun itself (its own messages, without a rank prefix) when ``rank`` is None."""
    lines = console.splitlines()
    if rank is None:
        picked = [ln for ln in lines if not RANK_PREFIX.match(ln)]
    else:
        picked = []
        for ln in lines:
            m = RANK_PREFIX.match(ln)
            if m and int(m.group(1)) == rank:
                picked.append(ln[m.end() :])
    return "\n".join(picked[-n:])


def rank_log_files(log_dir: Path) -> dict[int, dict[str, Path]]:
    """``{rank: {"stdout": path, "stderr": path}}`` of the latest attempt under ``log_dir/ranks``."""
    out: dict[int, dict[str, Path]] = {}
    attempts = sorted(log_dir.glob("ranks/*/attempt_*"), key=lambda p: int(p.name.split("_")[-1]))
    if attempts:
        for d in attempts[-1].iterdir():
            if d.is_dir() and d.name.isdigit():
                out[int(d.name)] = {"stdout": d / "stdout.log", "stderr": d / "stderr.log"}
    return out


def read_tail(path: Path, max_bytes: int = 32_000) -> str:
    """The text of the last ``max_bytes`` of ``path`` from its first whole line (``""`` if unreadable)."""
    try:
        with Path(path).open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text.split("\n", 1)[1] if size > max_bytes and "\n" in text else text


def root_cause(console: str) -> tuple[int | None, int | None]:
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)" block."""
    i = console.rfind("Root Cause")
    if i < 0:
        return None, None
    block = console[i : i + 2000]
    m = re.search(r"rank\s*:\s*(\d+)", block)
    c = re.search(r"exitcode\s*:\s*(-?\d+)", block)
    return (int(m.group(1)) if m else None), (int(c.group(1)) if c else None)


def traceback_tail(stderr: str, n: int = 25) -> str:
    """The last traceback in ``stderr`` (its last ``n`` lines), else stderr's last lines."""
    lines = stderr.rstrip().splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    picked = lines[starts[-1] :] if starts else lines
    if len(picked) > n:
        picked = ["  ..."] + picked[-n:]
    return "\n".join(picked)
