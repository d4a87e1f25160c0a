"""The notebook build check catches control characters in the sources: the quickstart's math
rendered "log π(ext{completion} | ext{prompt})" because "\\text" had been written as "\\t" +
"ext" (a TAB) when the source was generated."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "scripts" / "build_notebooks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_source_holds_a_control_character() -> None:
    build = _build_script()
    problems = [p for src, _ in build.sources() for p in build.control_characters(src)]
    assert not problems, "\n".join(problems)


def test_a_tab_in_markdown_is_reported_with_its_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build = _build_script()
    monkeypatch.setattr(build, "ROOT", tmp_path)
    src = tmp_path / "nb.md"
    src.write_text(
        "# Title\n\n$\\log\\pi(\text{completion})$\n\n```{code-cell} ipython3\nif x:\n\ty = 1\n```\n\nbell\x07 here\n",
        encoding="utf-8",
    )
    problems = build.control_characters(src)
    assert len(problems) == 2  # the TAB in code is indentation, allowed
    assert problems[0].startswith("nb.md:3:10: a TAB (\\t) in markdown (before 'ext{completi'): an escape gone wrong?")
    assert problems[1].startswith("nb.md:10:5: a bell (\\a) in markdown")


def test_the_quickstart_math_is_latex() -> None:
    text = (ROOT / "scripts" / "notebook_src" / "notebooks" / "quickstart.md").read_text(encoding="utf-8")
    assert "\\log\\pi(\\text{completion}\\mid\\text{prompt})" in text and "\t" not in text
