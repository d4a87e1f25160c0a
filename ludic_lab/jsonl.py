"""JSONL and dataset helpers shared across layers (no torch import)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any


def json_line(obj: Any) -> str:
    """``obj`` as one JSON line (no newline) that always encodes as UTF-8.

    Non-ASCII text stays readable (``ensure_ascii=False``); a string holding a lone surrogate
    (e.g. text decoded from broken model bytes with ``surrogateescape``), which UTF-8 cannot
    encode, makes the whole line ASCII-escaped instead (``"\\ud800"``): still valid JSON that
    ``json.loads`` turns back into exactly the same string. NaN/inf are written as JSON's
    ``NaN``/``Infinity`` extensions (Python reads them back).
    """
    line = json.dumps(obj, ensure_ascii=False, allow_nan=True)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(obj, ensure_ascii=True, allow_nan=True)
    return line


def read_jsonl(
    path: str | os.PathLike, *, what: str = "JSONL file", torn_last_line: bool = False
) -> list[dict[str, Any]]:
    """Read a JSONL file of objects; a bad line is an error naming file and line number.

    Blank lines are skipped. ``what`` names the data in the not-found error. ``torn_last_line``:
    a last line that does not parse (or decode: cut inside a character), as a writer killed
    mid-line leaves it, is skipped with a warning naming the file instead of raising.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} not found: {p}")
    lines = p.read_bytes().split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    rows: list[dict[str, Any]] = []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            why = e.msg if isinstance(e, json.JSONDecodeError) else f"not UTF-8: {e.reason}"
            if torn_last_line and i == len(lines):
                warnings.warn(f"{p}:{i}: skipping a truncated last line ({why}; a run killed mid-write)", stacklevel=2)
                continue
            raise ValueError(f"{p}:{i}: not valid JSON ({why})") from e
        if not isinstance(row, dict):
            raise ValueError(f"{p}:{i}: each line must be a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def is_hf_dataset(data: object) -> bool:
    """True for a ``datasets.Dataset`` (checked without importing ``datasets``)."""
    return type(data).__module__.split(".")[0] == "datasets" and type(data).__name__ == "Dataset"
