"""Every ```python block in docs/ runs, or says in the page why it cannot.

Each page's blocks run in order in one namespace (a notebook's cells: top-level ``await``
allowed), in a temporary working directory. A block marked right above its fence with
``<!-- snippet: skip: why -->`` or ``<!-- snippet: fragment: why -->`` is counted, not run;
``<!-- snippet: file: name -->`` writes the block to ``name`` for the blocks after it (see
``tests/doc_blocks.py``). The blocks ``tests/test_readme.py`` executes (its ``EXECUTED``
sections) are counted as run there. A page whose blocks load SmolLM2 or train is ``slow``.
"""

from __future__ import annotations

import ast
import re
import traceback
from pathlib import Path

import pytest

from tests.doc_blocks import Block, blocks_under, python_blocks, run_notebook_code
from tests.test_readme import EXECUTED
from tests.xdist_groups import HEAVY_MEMORY

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    p
    for p in [*(ROOT / "docs").glob("*.md"), ROOT / "examples" / "README.md", ROOT / "tutorials" / "README.md"]
    if p.is_file()
)
"""Every page whose snippets this file accounts for."""

_SLOW = re.compile(r"""["']default["']|train_env\(|Trainer\(""")
"""A runnable block matching this loads SmolLM2 or trains: its page's test is ``slow``."""


def _run_elsewhere(page: Path) -> set[str]:
    """The blocks of ``page`` that tests/test_readme.py executes (compared by text)."""
    return {code for heading in EXECUTED.get(page, ()) for code in blocks_under(heading, page)}


def _page_param(page: Path) -> object:
    elsewhere = _run_elsewhere(page)
    runs = [b for b in python_blocks(page) if b.kind is None and b.code not in elsewhere]
    marks = [pytest.mark.slow, HEAVY_MEMORY] if any(_SLOW.search(b.code) for b in runs) else []
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks)


def run_page(page: Path, workdir: Path) -> dict[str, list]:
    """Run ``page``'s blocks in order in one namespace with ``workdir`` as the working
    directory (the caller changes into it). Returns what happened to each block:
    ``run``, ``elsewhere`` (tests/test_readme.py runs it), ``file``, ``skip``, ``fragment``.
    A block that raises fails with the page and the block's line."""
    counts: dict[str, list] = {"run": [], "elsewhere": [], "file": [], "skip": [], "fragment": []}
    elsewhere = _run_elsewhere(page)
    ns: dict = {"__name__": "__docs_snippet__"}
    name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)
    for block in python_blocks(page):
        if block.code in elsewhere:
            counts["elsewhere"].append(block.line)
        elif block.kind in ("skip", "fragment"):  # not run, but it must still be Python
            compile(block.code, f"{name}:{block.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            counts[block.kind].append((block.line, block.reason))
        elif block.kind == "file":
            compile(block.code, f"{name}:{block.line}", "exec")
            (workdir / block.reason).write_text(block.code, encoding="utf-8")
            counts["file"].append((block.line, block.reason))
        else:
            _run_block(block, ns, name)
            counts["run"].append(block.line)
    return counts


def _run_block(block: Block, ns: dict, name: str) -> None:
    code = "\n" * block.line + block.code  # tracebacks then name the page's own line numbers
    try:
        run_notebook_code(code, ns, name)
    except Exception as e:
        raise AssertionError(f"{name}: the block at line {block.line} raised {type(e).__name__}: {e}") from e


def _summary(counts: dict[str, list]) -> str:
    head = ", ".join(f"{len(counts[k])} {k}" for k in counts)
    why = "".join(f"\n  line {line} {kind}: {reason}" for kind in ("skip", "fragment") for line, reason in counts[kind])
    return head + why


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES if python_blocks(p)])
def test_every_docs_snippet_runs_or_says_why_not(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record_property: pytest.RecordProperty
) -> None:
    monkeypatch.chdir(tmp_path)
    counts = run_page(page, tmp_path)
    for kind, items in counts.items():
        record_property(f"blocks_{kind}", len(items))
    record_property("skipped_reasons", [f"{line}: {reason}" for line, reason in counts["skip"] + counts["fragment"]])
    print(f"{page.relative_to(ROOT)}: {_summary(counts)}")


def test_a_raising_snippet_fails_naming_page_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n```python\nx = 1\n```\n\n<!-- snippet: skip: needs a GPU -->\n```python\nimport cuda\n```\n\n"
        "```python\nif x == 1:\n    raise RuntimeError('the doc is wrong')\n```\n",
        encoding="utf-8",
    )
    with pytest.raises(
        AssertionError, match=r"page.md: the block at line 12 raised RuntimeError: the doc is wrong"
    ) as info:
        run_page(page, tmp_path)
    assert 'page.md", line 14' in "".join(traceback.format_exception(info.value.__cause__))
    page.write_text(
        "```python\nx = 1\n```\n<!-- snippet: skip: GPU -->\n```python\nimport cuda\n```\n", encoding="utf-8"
    )
    assert run_page(page, tmp_path) == {"run": [1], "elsewhere": [], "file": [], "skip": [(5, "GPU")], "fragment": []}


@pytest.mark.parametrize(
    "marker, error",
    [
        ("<!-- snippet: skip -->", "needs a reason"),
        ("<!-- snippet: skip:   -->", "needs a reason"),
        ("<!-- snippet: omit: too long -->", "is not one of"),
    ],
)
def test_a_marker_without_a_reason_fails(tmp_path: Path, marker: str, error: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"text\n\n{marker}\n\n```python\nraise SystemExit\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"page.md:3: .*{error}"):
        python_blocks(page)


def test_every_python_fence_of_every_page_is_accounted_for() -> None:
    """The parser finds each ```python fence (indented ones too), so no block escapes the runs."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        fences = len(re.findall(r"^ *```python\s*$", text, flags=re.MULTILINE))
        assert len(python_blocks(page)) == fences, page


def test_the_tests_a_marker_names_exist() -> None:
    """A skip / fragment marker that says which test runs the same call names a real test: every
    ``test_*.py`` file and ``test_*`` function it mentions exists under tests/ (a renamed test
    fails here, not silently in the docs), and ``test_conformance.py``'s ``[row]`` ids are rows."""
    from tests.conformance_sources import SOURCE_IDS

    tests = ROOT / "tests"
    defined = {m for p in tests.rglob("test_*.py") for m in re.findall(r"def (test_\w+)\(", p.read_text("utf-8"))}
    checked = 0
    for page in PAGES:
        for block in python_blocks(page):
            if block.kind not in ("skip", "fragment"):
                continue
            where = f"{page.relative_to(ROOT)}:{block.line}"
            for name, py in re.findall(r"\b(test_\w+?)(\.py)?\b", block.reason):
                ok = (tests / f"{name}.py").is_file() if py else name in defined
                assert ok, f"{where}: the marker names {name}{py}, which tests/ does not have"
                checked += 1
            for row in re.findall(r"test_conformance\.py::\w+\[(\w+)\]", block.reason):
                assert row in SOURCE_IDS, f"{where}: {row!r} is not a row of tests/conformance_sources.py"
    assert checked > 20, checked  # the markers do name tests
