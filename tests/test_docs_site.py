"""The documentation site: it builds in strict mode, and every public name has a docstring.

``mkdocs build --strict`` (mkdocs.yml) fails on a broken link, a missing anchor or a
cross-reference that resolves to nothing; the API reference is generated from the packages'
``__all__`` lists by ``scripts/gen_api_pages.py``, which also finds the names without a
docstring. Skipped, with the install command, where the ``docs`` extra is missing (it is part
of the ``test`` extra, so not under CI, where a skip of a ``slow`` test fails).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
_INSTALL = "install the docs extra: pip install -e '.[docs]'"


def _need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed; {_INSTALL}")


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_every_public_name_has_a_docstring() -> None:
    _need("griffe")
    gen = _script("gen_api_pages")
    names = gen.public_names()
    packages = {n.package for n in names}
    assert "ludic_lab.training" in packages and "ludic_lab" in packages, sorted(packages)
    assert any(n.path == "ludic_lab.training.trainer.Trainer" for n in names)
    assert len(names) > 200, f"only {len(names)} public names found"
    missing = gen.undocumented(names)
    assert not missing, "public names (listed in an __all__) without a docstring; add one:\n" + "\n".join(missing)


def test_links_point_at_the_page_or_file_they_name() -> None:
    _need("mkdocs")
    hooks = _script("mkdocs_hooks")
    site_of = {"README.md": "index.md", "tutorials/README.md": "tutorials/index.md"}

    def rewrite(target: str, page_repo: str, page_site: str, repo_url: str = "") -> str | None:
        return hooks._rewrite(target, page_repo, page_site, site_of, repo_url)

    # a docs page linking up to README and to the tutorials folder; README linking into docs/
    assert rewrite("../README.md", "docs/testing.md", "testing.md") == "index.md"
    assert rewrite("../tutorials/README.md#binder", "docs/notebooks.md", "notebooks.md") == "tutorials/index.md#binder"
    assert rewrite("docs/your_env.md#the-env", "README.md", "index.md") == "your_env.md#the-env"
    assert rewrite("../docs/judges.md", "tutorials/README.md", "tutorials/index.md") == "../judges.md"
    # a repository file that is no page: to repo_url when set, else plain text
    assert rewrite("../examples/rejection_sampling.py", "docs/demo.md", "demo.md") is None
    url = rewrite("../examples/rejection_sampling.py", "docs/demo.md", "demo.md", "https://example.org/ludic_lab")
    assert url == "https://example.org/ludic_lab/blob/main/examples/rejection_sampling.py"
    # a link to nothing is left as it is, for MkDocs to report; outside links untouched
    assert rewrite("../no_such_file.md", "docs/demo.md", "demo.md") == "../no_such_file.md"
    assert rewrite("https://pytorch.org", "docs/demo.md", "demo.md") == "https://pytorch.org"


def test_the_site_config_fails_on_a_broken_link(tmp_path: Path) -> None:
    """mkdocs.yml's strict mode and link validation, applied to a one-page site with a broken link."""
    _need("mkdocs", "yaml")
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    site = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    assert site["strict"] is True
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [a page](missing.md) and [a heading](#nowhere).\n")
    config = {"site_name": "t", "strict": True, "validation": site["validation"], "nav": ["index.md"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "out")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert "missing.md" in proc.stderr and "#nowhere" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    _need("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_jupyter")
    out = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-4000:]}"
    trainer = (out / "api" / "ludic_lab.training" / "index.html").read_text()
    assert 'id="ludic_lab.training.trainer.Trainer"' in trainer and "train_step" in trainer
    assert ":class:" not in trainer and ":meth:" not in trainer  # Sphinx roles shown as code
    home = (out / "index.html").read_text()
    assert 'href="your_env/"' in home  # README's docs/your_env.md link, pointed at its page
    notebooks = sorted(p.stem for p in (ROOT / "tutorials").glob("*.ipynb"))
    rendered = [n for n in notebooks if (out / "tutorials" / n / "index.html").is_file()]
    assert rendered == notebooks, f"tutorials not rendered: {sorted(set(notebooks) - set(rendered))}"
    assert (out / "changelog" / "index.html").is_file() and (out / "benchmarks" / "index.html").is_file()
