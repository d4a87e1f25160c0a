"""``IdLog``: the pipeline's audit trail of item ids (what the actor pushed, what the trainer trained)."""

from __future__ import annotations

import os


class IdLog:
    """Appends item ids to a text file, one per line, flushed at once (an audit trail that
    survives ``kill -9`` of the writer: what was pushed, what was trained)."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._f = open(path, "a", encoding="utf-8")

    def __call__(self, ids: list[str]) -> None:
        """Append ``ids``, one per line, and flush."""
        self._f.write("".join(f"{i}\n" for i in ids))
        self._f.flush()

    def close(self) -> None:
        """Close the file."""
        self._f.close()
