"""Build the committed notebooks from their MyST-markdown sources (and check they match).

Sources live in ``scripts/notebook_src/<folder>/<name>.md`` and become
``<folder>/<name>.ipynb`` (``folder`` is ``notebooks`` or ``tutorials``). A source is MyST
markdown as jupytext writes it: prose is markdown, ``+++`` splits markdown cells, and each
code cell is a fenced block

    ```{code-cell} ipython3
    :tags: [parameters]

    STEPS = 30
    ```

(the ``:tags:`` line is optional). The built notebooks have no outputs, deterministic cell
ids and the ``python3`` kernel, so rebuilding an unchanged source gives a byte-identical file.

    python scripts/build_notebooks.py            # (re)build every notebook
    python scripts/build_notebooks.py --check    # exit 1 if a committed notebook differs from its source
    python scripts/build_notebooks.py --to-source tutorials/03_grpo.ipynb   # edited in Jupyter? write it back
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "scripts" / "notebook_src"
FOLDERS = ("notebooks", "tutorials")

FRONT_MATTER = """---
jupytext:
  text_representation:
    format_name: myst
kernelspec:
  display_name: Python 3 (ipykernel)
  language: python
  name: python3
---
"""
_FENCE_OPEN = re.compile(r"^```\{code-cell\}(?:\s+\S+)?\s*$")
_TAGS = re.compile(r"^:tags:\s*\[(.*)\]\s*$")


def parse_myst(text: str) -> list[dict[str, Any]]:
    """Cells of a MyST source as ``{"cell_type", "source", "tags"}`` dicts, in order."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":  # front matter (kernelspec): skipped
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is None:
            raise ValueError("unterminated front matter (a '---' line opens it but none closes it)")
        lines = lines[end + 1 :]
    cells: list[dict[str, Any]] = []
    md: list[str] = []

    def flush_md() -> None:
        body = "\n".join(md).strip("\n")
        if body.strip():
            cells.append({"cell_type": "markdown", "source": body, "tags": []})
        md.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE_OPEN.match(line):
            flush_md()
            i += 1
            tags: list[str] = []
            m = _TAGS.match(lines[i]) if i < len(lines) else None
            if m:
                tags = [t.strip().strip("'\"") for t in m.group(1).split(",") if t.strip()]
                i += 1
                if i < len(lines) and not lines[i].strip():
                    i += 1
            code: list[str] = []
            while i < len(lines) and lines[i] != "```":
                code.append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"unterminated code cell starting with {code[:1]}")
            cells.append({"cell_type": "code", "source": "\n".join(code).strip("\n"), "tags": tags})
        elif line.strip() == "+++":
            flush_md()
        else:
            md.append(line)
        i += 1
    flush_md()
    return cells


def build_notebook(cells: list[dict[str, Any]]) -> Any:
    """An output-free nbformat v4 notebook of ``cells`` with deterministic ids."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for n, c in enumerate(cells):
        meta = {"tags": c["tags"]} if c["tags"] else {}
        if c["cell_type"] == "code":
            cell = nbformat.v4.new_code_cell(c["source"], metadata=meta)
        else:
            cell = nbformat.v4.new_markdown_cell(c["source"], metadata=meta)
        cell.id = f"cell-{n:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def notebook_to_myst(nb: Any) -> str:
    """The MyST source of a notebook (outputs dropped): the inverse of :func:`build_notebook`."""
    parts = [FRONT_MATTER]
    prev = None
    for cell in nb.cells:
        src = cell.source.strip("\n")
        if cell.cell_type == "code":
            tags = cell.metadata.get("tags", [])
            head = "```{code-cell} ipython3\n" + (f":tags: [{', '.join(tags)}]\n\n" if tags else "")
            parts.append(f"{head}{src}\n```\n")
        else:
            if prev == "markdown":
                parts.append("+++\n")
            parts.append(src + "\n")
        prev = cell.cell_type
    return "\n".join(parts)


def sources() -> list[tuple[Path, Path]]:
    """``(source.md, target.ipynb)`` pairs for every notebook source."""
    return [
        (src, ROOT / folder / f"{src.stem}.ipynb") for folder in FOLDERS for src in sorted((SRC / folder).glob("*.md"))
    ]


def render(src: Path) -> str:
    """The exact file text the notebook built from ``src`` has."""
    import nbformat

    return nbformat.writes(build_notebook(parse_myst(src.read_text(encoding="utf-8")))) + "\n"


_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
_NAMES = {
    "\t": "TAB (\\t)",
    "\x08": "backspace (\\b)",
    "\x0c": "form feed (\\f)",
    "\r": "carriage return (\\r)",
    "\x0b": "vertical tab (\\v)",
    "\x07": "bell (\\a)",
}


def control_characters(src: Path) -> list[str]:
    """Control characters in a source: anywhere in markdown (a TAB included), and in code
    besides TAB. They are nearly always an escape gone wrong: ``"\\text"`` written as
    ``"\text"`` in Python becomes TAB + ``ext`` and renders as "ext" in the math."""
    problems = []
    text = src.read_text(encoding="utf-8")
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE_OPEN.match(line):
            in_code = True
        elif in_code and line == "```":
            in_code = False
        for m in _CONTROL.finditer(line):
            ch = m.group()
            if in_code and ch == "\t":
                continue
            name = _NAMES.get(ch, f"control character U+{ord(ch):04X}")
            where = "code" if in_code else "markdown"
            problems.append(
                f"{src.relative_to(ROOT)}:{n}:{m.start() + 1}: a {name} in {where} "
                f"(before {line[m.end() : m.end() + 12]!r}): "
                "an escape gone wrong? write a backslash as \\\\ (or use a raw string) where this text is generated"
            )
    return problems


def check() -> list[str]:
    """Problems (empty when every committed notebook equals its source's build and has a
    source, and no source holds a control character, see :func:`control_characters`)."""
    problems = []
    pairs = sources()
    for src, _ in pairs:
        problems += control_characters(src)
    for src, out in pairs:
        if not out.is_file():
            problems.append(f"{out.relative_to(ROOT)} is missing (build it: python scripts/build_notebooks.py)")
        elif out.read_text(encoding="utf-8") != render(src):
            problems.append(
                f"{out.relative_to(ROOT)} differs from {src.relative_to(ROOT)}: edit the source and rebuild, "
                f"or write your notebook edits back with --to-source {out.relative_to(ROOT)}"
            )
    known = {out for _, out in pairs}
    for folder in FOLDERS:
        for nb in sorted((ROOT / folder).glob("*.ipynb")):
            if nb not in known:
                problems.append(f"{nb.relative_to(ROOT)} has no source in {SRC.relative_to(ROOT)}/{folder}/")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a notebook is out of date")
    ap.add_argument("--to-source", metavar="NOTEBOOK", help="write this .ipynb back to its MyST source")
    args = ap.parse_args(argv)
    if args.to_source:
        import nbformat

        nb_path = Path(args.to_source).resolve()
        src = SRC / nb_path.parent.name / f"{nb_path.stem}.md"
        src.write_text(notebook_to_myst(nbformat.read(nb_path, as_version=4)), encoding="utf-8")
        print(f"wrote {src.relative_to(ROOT)}; now run: python scripts/build_notebooks.py")
        return 0
    if args.check:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    bad = [p for src, _ in sources() for p in control_characters(src)]
    if bad:
        for p in bad:
            print(p, file=sys.stderr)
        return 1
    for src, out in sources():
        text = render(src)
        if not out.is_file() or out.read_text(encoding="utf-8") != text:
            out.write_text(text, encoding="utf-8")
            print(f"built {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
