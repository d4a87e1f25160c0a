"""The API reference of the documentation site, generated from the packages' ``__all__`` lists.

Every package of ``ludic_lab`` that declares ``__all__`` gets one page: a table of its public
names (first docstring line each) and, for each name, a ``::: path`` block that mkdocstrings
renders from the docstrings. Names are looked up at run time (some packages load names lazily
or compute their list), then found by griffe at the module that defines them, so each object is
documented once, under the path its docstring lives at.

Run by the site's build hook (``scripts/mkdocs_hooks.py``); by hand,
``python scripts/gen_api_pages.py --out DIR`` writes the pages to DIR and
``python scripts/gen_api_pages.py --check`` lists the public names without a docstring.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import pkgutil
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "ludic_lab"


@dataclasses.dataclass(frozen=True)
class PublicName:
    """One name of a package's ``__all__``: where users import it, where its docstring lives."""

    package: str
    """The package whose ``__all__`` lists the name (``ludic_lab.training``)."""
    name: str
    """The name as imported (``Trainer``)."""
    path: str
    """The griffe path of the object that defines it (``ludic_lab.training.trainer.Trainer``)."""
    summary: str
    """The first line of its docstring; empty when it has none."""


def public_packages() -> list[str]:
    """Every package under ``ludic_lab`` that declares ``__all__``, in import-path order.

    A package that cannot be imported (an optional extra missing) raises: the reference must
    cover every package, so the build environment needs the extras they import."""
    root = importlib.import_module(PACKAGE)
    names = [PACKAGE] + [m.name for m in pkgutil.walk_packages(root.__path__, PACKAGE + ".") if m.ispkg]
    found = []
    for name in sorted(names):
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise RuntimeError(
                f"{name} does not import ({e}); install the extras the API reference covers: pip install -e '.[test]'"
            ) from e
        if hasattr(module, "__all__"):
            found.append(name)
    return found


@cache
def _griffe_package() -> Any:
    import griffe

    return griffe.load(PACKAGE, search_paths=[str(ROOT)], resolve_aliases=False, docstring_parser="google")


def _griffe_object(path: str) -> Any:
    """The griffe object at ``path`` (aliases followed), or None when griffe does not see it."""
    obj = _griffe_package()
    for part in path.split(".")[1:]:
        members = getattr(obj, "members", None)
        if members is None or part not in members:
            return None
        obj = members[part]
        while getattr(obj, "is_alias", False):
            try:
                obj = obj.final_target
            except Exception:  # noqa: BLE001 - an alias griffe cannot follow: the name is not found
                return None
    return obj


def _defining_path(package: str, name: str) -> str:
    """The griffe path of ``package.name``'s object: where its class, function or value is defined."""
    value = getattr(importlib.import_module(package), name)
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        if _griffe_object(f"{module}.{qualname}") is not None:
            return f"{module}.{qualname}"
    obj = _griffe_object(f"{package}.{name}")  # a value (a dict, a string): followed through its imports
    if obj is None:
        raise RuntimeError(
            f"{package}.{name}: the API reference cannot find where it is defined; import it in "
            f"{package}/__init__.py (under `if TYPE_CHECKING:` when it loads lazily)"
        )
    return str(obj.path)


def public_names(packages: list[str] | None = None) -> list[PublicName]:
    """Every name of every public package's ``__all__``, with the path its docstring lives at."""
    out = []
    for package in packages or public_packages():
        for name in importlib.import_module(package).__all__:
            path = _defining_path(package, name)
            docstring = _griffe_object(path).docstring
            summary = _summary(docstring.value if docstring else "")
            out.append(PublicName(package, name, path, summary))
    return out


def _summary(docstring: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line (at most ~200 characters)."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z`(*])", paragraph, maxsplit=1)[0]
    return sentence if len(sentence) <= 200 else sentence[:197].rsplit(" ", 1)[0] + " ..."


def undocumented(names: list[PublicName]) -> list[str]:
    """The ``package.name`` of each public name whose object has no docstring."""
    return [f"{n.package}.{n.name} (defined at {n.path})" for n in names if not n.summary]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def api_pages() -> dict[str, str]:
    """The reference's pages, ``{path under the site: Markdown}``: ``api/index.md`` and one per package."""
    packages = public_packages()
    names = public_names(packages)
    seen: dict[str, PublicName] = {}
    pages = {}
    index = [
        "# API reference\n",
        "One page per package: the names its `__all__` lists, each rendered from its docstring.",
        "Import a name from the package its page is named after (`from ludic_lab.training import Trainer`).\n",
        "| package | what it holds |",
        "|---|---|",
    ]
    for package in packages:
        module_doc = _griffe_object(package).docstring
        summary = _summary(module_doc.value if module_doc else "")
        index.append(f"| [`{package}`]({package}.md) | {_cell(summary)} |")
        mine = [n for n in names if n.package == package]
        lines = [
            f"# `{package}`\n",
            f"::: {package}",
            "    options:",
            "      members: false",
            "      show_root_heading: false",
            "      show_root_toc_entry: false\n",
            "| name | what it is |",
            "|---|---|",
        ]
        blocks = []
        for n in mine:
            lines.append(f"| [`{n.name}`][{n.path}] | {_cell(n.summary)} |")
            if n.path in seen:  # the same object under a second name: documented once
                continue
            seen[n.path] = n
            blocks += [f"::: {n.path}", "    options:", "      heading_level: 2", "      show_root_heading: true\n"]
        pages[f"api/{package}.md"] = "\n".join([*lines, "", *blocks])
    pages["api/index.md"] = "\n".join(index) + "\n"
    return pages


def main(argv: list[str] | None = None) -> int:
    """Write the pages to ``--out``, or with ``--check`` print the undocumented public names."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder to write the API pages into")
    parser.add_argument("--check", action="store_true", help="list public names without a docstring")
    args = parser.parse_args(argv)
    if args.check:
        missing = undocumented(public_names())
        print("\n".join(missing) or "every public name has a docstring")
        return 1 if missing else 0
    if args.out is None:
        parser.error("give --out DIR or --check")
    for rel, text in api_pages().items():
        target = args.out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
