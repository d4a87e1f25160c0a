"""Reading and running the ```python blocks of a Markdown page, as a notebook would.

Shared by ``tests/test_readme.py`` (README's sections, the walkthroughs it links to) and
``tests/test_docs_snippets.py`` (every other block in docs/). A block may be marked, right
above its fence, with an HTML comment the reader does not see::

    <!-- snippet: skip: needs a GPU and NCCL -->
    <!-- snippet: fragment: uses `engine` from the prose above -->
    <!-- snippet: file: calc_server.py -->

``skip`` and ``fragment`` blocks are not run (the reason is required); a ``file`` block is
written to that name in the page's working directory (the blocks after it use the file) and
compiled, not run.
"""

from __future__ import annotations

import ast
import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

MARKER_KINDS = ("skip", "fragment", "file")
"""What a ``<!-- snippet: KIND: reason -->`` comment above a block may say."""

_FENCE = re.compile(r"^( *)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:(.*?)-->\s*$")


def blocks_under(heading: str, page: Path = README) -> list[str]:
    """The ```python blocks of the section titled ``heading`` (any level, ## or ###) of
    ``page``, up to the next heading of the same or a higher level (``#`` lines inside code
    blocks are comments, not headings)."""
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    fenced = False
    headings = []  # (line index, level, title) outside code blocks
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#+) (.*)$", line.rstrip("\n"))):
            headings.append((i, len(m.group(1)), m.group(2)))
    found = [(i, level) for i, level, title in headings if title == heading]
    assert len(found) == 1, f"{page.name}: {len(found)} headings {heading!r} (expected one)"
    start, level = found[0]
    ends = [i for i, lv, _ in headings if i > start and lv <= level]
    section = "".join(lines[start : ends[0] if ends else len(lines)])
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def run_notebook_code(code: str, ns: dict, filename: str = "README.md") -> None:
    """Execute ``code`` in the namespace ``ns`` as a notebook cell: top-level ``await``
    allowed (the cell's coroutine runs to completion on a fresh event loop)."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    compiled = compile(code, filename, "exec", flags=flags)
    result = eval(compiled, ns)
    if asyncio.iscoroutine(result):
        asyncio.run(result)


@dataclass(frozen=True)
class Block:
    """One ```python block of a page: where it starts, its code and its marker, if any."""

    line: int
    """1-based line of the opening fence."""
    code: str
    """The block's text, dedented to the fence's indentation."""
    kind: str | None = None
    """``skip``, ``fragment``, ``file`` or None (the block runs)."""
    reason: str = ""
    """The marker's reason (for ``file``: the file name)."""


def python_blocks(page: Path) -> list[Block]:
    """Every ```python block of ``page`` in order, with the marker comment right above it
    (blank lines between allowed). A malformed marker (unknown kind, no reason) raises
    ``ValueError`` naming the page and line."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m.group(2):
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        j = i + 1
        while j < len(lines) and not re.match(rf"^ {{0,{indent}}}```\s*$", lines[j]):
            j += 1
        if lang == "python":
            code = "\n".join(line[indent:] for line in lines[i + 1 : j]) + "\n"
            blocks.append(Block(i + 1, code, *_marker_above(page, lines, i)))
        i = j + 1
    return blocks


def _marker_above(page: Path, lines: list[str], fence: int) -> tuple[str | None, str]:
    k = fence - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    m = _MARKER.match(lines[k]) if k >= 0 else None
    if m is None:
        return None, ""
    kind, _, reason = (part.strip() for part in m.group(1).partition(":"))
    if kind not in MARKER_KINDS:
        raise ValueError(f"{page}:{k + 1}: snippet marker {kind!r} is not one of {MARKER_KINDS}")
    if not reason:
        raise ValueError(f"{page}:{k + 1}: snippet marker {kind!r} needs a reason: <!-- snippet: {kind}: why -->")
    return kind, reason
