"""Build hooks of the documentation site (``mkdocs.yml``: ``hooks:``).

The site is ``docs/`` plus pages that live elsewhere in the repository, taken as they are:
README.md as the home page, CHANGELOG.md, the tutorials' README and notebooks (rendered by
mkdocs-jupyter, not executed), the examples' and notebooks' READMEs, and the API reference
that ``scripts/gen_api_pages.py`` generates. Links keep pointing where they point on GitHub:
a link to one of these files goes to its page, a link to another file of the repository goes
to ``repo_url`` when the site sets one (else it becomes plain text naming the path), and a link
to nothing is left for MkDocs to report (``--strict`` fails on it).
"""

from __future__ import annotations

import importlib.util
import posixpath
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

# repository path -> path on the site, for the pages taken from outside docs/
PAGES = {
    "README.md": "index.md",
    "CHANGELOG.md": "changelog.md",
    "tutorials/README.md": "tutorials/index.md",
    "examples/README.md": "examples.md",
    "notebooks/README.md": "notebook_folder.md",
}
TUTORIALS = "tutorials/*.ipynb"

_api: dict[str, str] = {}  # site path -> Markdown of the generated API pages
_repo_of: dict[str, str] = {}  # site path -> repository path, for every page
_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)((?:\s+\"[^\"]*\")?)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const):<code>~?\.?([^<]*)</code>")


def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_api_pages", ROOT / "scripts" / "gen_api_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _site_pages() -> dict[str, str]:
    """Repository path -> site path of every page taken from outside docs/."""
    pages = {repo: site for repo, site in PAGES.items() if (ROOT / repo).is_file()}
    for notebook in sorted(ROOT.glob(TUTORIALS)):
        rel = notebook.relative_to(ROOT).as_posix()
        pages[rel] = rel
    return pages


def on_config(config: Any) -> Any:
    """Generate the API pages and put them, and the tutorial notebooks, under their nav entries."""
    _api.clear()
    _api.update(_load_generator().api_pages())
    packages = sorted(p.removeprefix("api/").removesuffix(".md") for p in _api if p != "api/index.md")
    api = [{"Overview": "api/index.md"}] + [{name: f"api/{name}.md"} for name in packages]
    notebooks = [s for r, s in _site_pages().items() if r.endswith(".ipynb")]  # titled by their heading
    expand = {"api/index.md": api, "tutorials/index.md": [{"Overview": "tutorials/index.md"}, *notebooks]}

    def walk(items: list[Any]) -> list[Any]:
        out = []
        for item in items:
            if isinstance(item, dict):
                (title, value), *_ = item.items()
                if isinstance(value, list):
                    value = walk(value)
                elif value in expand:
                    value = expand[value]
                out.append({title: value})
            else:
                out.append(item)
        return out

    config["nav"] = walk(config["nav"] or [])
    return config


@event_priority(100)  # before mkdocs-jupyter, which turns the notebooks added here into pages
def on_files(files: Files, config: Any) -> Files:
    """Add the pages from outside docs/ and the API reference to the site's files."""
    _repo_of.clear()
    for file in files.documentation_pages():
        _repo_of[file.src_uri] = f"docs/{file.src_uri}"
    for repo, site in _site_pages().items():
        if repo == site:  # a notebook: a file of the repository root, as mkdocs-jupyter reads its path
            files.append(File(repo, str(ROOT), config["site_dir"], config["use_directory_urls"]))
        else:
            files.append(File.generated(config, site, abs_src_path=str(ROOT / repo)))
        _repo_of[site] = repo
    for site, text in _api.items():
        files.append(File.generated(config, site, content=text))
    return files


def _rewrite(target: str, page_repo: str, page_site: str, site_of: dict[str, str], repo_url: str) -> str | None:
    """The link to write for ``target`` on the page of ``page_repo``; None: keep its text only."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return target
    path, hash_, fragment = target.partition("#")
    repo = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo), path))
    if (ROOT / repo).is_dir() and f"{repo}/README.md" in site_of:
        repo = f"{repo}/README.md"
    site = site_of.get(repo)
    if site is None and repo.startswith("docs/") and (ROOT / repo).is_file():
        site = repo.removeprefix("docs/")
    if site is not None:
        rel = posixpath.relpath(site, posixpath.dirname(page_site) or ".")
        return rel + hash_ + fragment
    if repo.startswith("..") or not (ROOT / repo).exists():
        return target  # a link to nothing: MkDocs reports it
    if repo_url:
        kind = "tree" if (ROOT / repo).is_dir() else "blob"
        return f"{repo_url.rstrip('/')}/{kind}/main/{repo}" + hash_ + fragment
    return None


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point each relative link at the page or repository file it names (see the module docstring)."""
    page_site = page.file.src_uri
    page_repo = _repo_of.get(page_site)
    if page_repo is None:  # a generated API page: its links are cross-references
        return markdown
    site_of = {repo: site for site, repo in _repo_of.items()}
    repo_url = config.get("repo_url") or ""
    out, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced:
            line = _LINK.sub(lambda m: _link(m, page_repo, page_site, site_of, repo_url), line)
        out.append(line)
    return "\n".join(out)


def _link(m: re.Match[str], page_repo: str, page_site: str, site_of: dict[str, str], repo_url: str) -> str:
    bang, text, target, title = m.groups()
    new = _rewrite(target, page_repo, page_site, site_of, repo_url)
    if new is None:
        path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo), target.partition("#")[0]))
        return text if path in text else f"{text} (`{path}`)"
    return f"{bang}[{text}]({new}{title})"


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """Docstrings written with Sphinx roles (``:class:`~a.B` ``) show the name as code, without the role."""

    def code(m: re.Match[str]) -> str:
        name = m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1)  # ~a.b.C shows C
        return f"<code>{name}</code>"

    return _ROLE.sub(code, html)
