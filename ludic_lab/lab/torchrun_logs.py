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


HEADER_INSIDE = re.compile(r"\[[A-Za-z_]\w*?(\d+)\]:")
"""A ``[default<rank>]:`` header inside a teed line: torchrun read a line a rank had not ended
yet (a progress bar's state, written with ``\r`` and no newline) and wrote the next read after it."""


ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
"""A terminal escape sequence (CSI): tqdm's nested bars move the cursor up a row with ``ESC[A``."""
_CONTROL = re.compile(r"(\r|\n|\x1b\[[0-?]*[ -/]*[@-~])")


def screen_line(line: str) -> str:
    """What a terminal leaves of ``line`` (one line, no ``\n``) after its carriage returns: its
    last non-blank ``\r``-separated state, trailing spaces cut ("" when every state is blank);
    escape sequences (a nested bar's cursor moves) are dropped."""
    states = [s for s in ESCAPE.sub("", line).split("\r") if s.strip()]
    return states[-1].rstrip() if states else ""


def overwritten_states(raw: str) -> set[str]:
    """The states a later write overwrote on screen in ``raw`` (a rank's own stdout / stderr file,
    where tqdm's updates are kept as written), trailing spaces cut: ``raw`` is played as a terminal
    plays it (``\r`` back to the row's start, ``\n`` down a row, ``ESC[A`` up one, as tqdm's
    nested bars do; text overwrites what it covers), and each state a row held before a write
    changed it is overwritten (a nested bar's states repeat from one outer step to the next: a
    state overwritten once is overwritten for good)."""
    rows, gone, row, col = [""], set(), 0, 0
    for tok in _CONTROL.split(raw):
        if tok == "\r":
            col = 0
        elif tok == "\n":
            row, col = row + 1, 0
            rows += [""] * (row + 1 - len(rows))
        elif tok == "\x1b[A":
            row = max(0, row - 1)
        elif tok and not tok.startswith("\x1b"):
            old, line = rows[row].rstrip(), rows[row].ljust(col)
            rows[row] = line[:col] + tok + line[col + len(tok) :]
            if old and rows[row].rstrip() != old:
                gone.add(old)
            col += len(tok)
    return gone


def _segments(console: str) -> list[tuple[int | None, str]]:
    """``(rank, text)`` of each line torchrun teed into ``console`` (rank None: its own lines);
    a line with another header inside is cut there (torchrun wrote two reads on one line)."""
    out: list[tuple[int | None, str]] = []
    for line in console.split("\n"):
        m = RANK_PREFIX.match(line)
        if not m:
            out.append((None, line))
            continue
        rank, pos = int(m.group(1)), m.end()
        for h in HEADER_INSIDE.finditer(line, pos):
            out.append((rank, line[pos : h.start()]))
            rank, pos = int(h.group(1)), h.end()
        out.append((rank, line[pos:]))
    return out


def rank_lines(console: str, rank: int | None, n: int, overwritten: set[str] | frozenset[str] = frozenset()) -> str:
    """The last ``n`` lines of ``rank`` in the teed ``console`` text (prefix removed), or of
    torchrun itself (its own messages, without a rank prefix) when ``rank`` is None, as a terminal
    shows them: no blank lines (torchrun tees a progress bar's ``\r`` as an empty line), each line
    its last ``\r`` state, the states in ``overwritten`` (:func:`overwritten_states` of the rank's
    own files) left out but for the rank's latest line, a state repeated in a row shown once."""
    picked: list[str] = []
    for r, text in _segments(console):
        if r == rank and (shown := screen_line(text)):
            picked.append(shown)
    kept = [t for i, t in enumerate(picked) if t not in overwritten or i == len(picked) - 1]
    kept = [t for i, t in enumerate(kept) if i == 0 or t != kept[i - 1]]
    return "\n".join(kept[-n:])


def rank_tail(console_path: Path, log_dir: Path, rank: int | None, n: int) -> str:
    """:func:`rank_lines` of the run under ``log_dir`` whose teed console is ``console_path``, with
    the states that ``\r`` overwrote in the rank's own stdout / stderr files (:func:`overwritten_states`)."""
    console = read_tail(console_path)  # first: the rank's files then hold all it teed
    files = rank_log_files(log_dir).get(rank, {}) if rank is not None else {}
    overwritten = set().union(*(overwritten_states(read_tail(p)) for p in files.values()))
    return rank_lines(console, rank, n, overwritten)


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
    """The last traceback in ``stderr`` (its last ``n`` lines), else stderr's last lines; a
    ``\r``-updated line (a progress bar) is its last state, one that ends blank is left out."""
    lines = [shown for ln in stderr.split("\n") if (shown := screen_line(ln)) or "\r" not in ln]
    while lines and not lines[-1]:
        lines.pop()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    picked = lines[starts[-1] :] if starts else lines
    if len(picked) > n:
        picked = ["  ..."] + picked[-n:]
    return "\n".join(picked)
