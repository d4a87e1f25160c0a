"""The quickstart, executed headless in its smoke configuration (on the tiny model: the views, not
the model, are under test), rendered by nbconvert's lab template and opened in a real headless
Chromium at 1600 px: each view rendered, every card within the page, the legend names the colours
drawn, group headers count their whole group, and replies cut at ``max_tokens`` are explained
above the cards that carry them. A screenshot of each view goes to ``$LUDIC_SCREENSHOTS`` (/tmp).
:func:`execute_notebook` is shared with tests/test_browser_tutorial12.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_browser_views import SCREENSHOTS, chromium_session, screenshot, webdriver

ROOT = Path(__file__).resolve().parent.parent

VIEWS_JS = """
const W = document.documentElement.clientWidth;
const out = {pageWidth: W, scrollWidth: document.documentElement.scrollWidth, views: []};
document.querySelectorAll('.ll-view').forEach(v => {
  const cards = Array.from(v.querySelectorAll('.ll-card')).map(c => c.getBoundingClientRect());
  out.views.push({
    cards: cards.length, outside: cards.filter(r => r.right > W + 0.5 || r.left < 0).length,
    tokens: v.querySelectorAll('span.ll-t').length,
    heads: Array.from(v.querySelectorAll('.ll-ghead')).map(h => [+h.dataset.groupSize, +h.dataset.shown]),
    legend: (v.querySelector('.ll-legend') || {}).textContent || null,
    cut: v.querySelectorAll('.ll-cut-note').length, cutCards: v.innerHTML.split('>cut</span>').length - 1,
    top: v.getBoundingClientRect().top + window.scrollY});
});
return out;
"""


def execute_notebook(nb: Any, workdir: Path, name: str) -> Path:
    """``nb`` run top to bottom with ``LUDIC_SMOKE=1`` in a kernel of this interpreter, in ``workdir``
    (cell outputs land in ``nb``); its lab-template HTML, ``workdir/<name>.html``."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    env = {**os.environ, "LUDIC_SMOKE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    spec = workdir / "kernels" / "ludic-browser"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "ludic", "language": "python",
                                                  "env": {k: env[k] for k in ("LUDIC_SMOKE", "HF_HUB_OFFLINE")}}))  # fmt: skip
    km = KernelManager(
        kernel_name="ludic-browser", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)])
    )
    client = NotebookClient(nb, km=km, timeout=600, startup_timeout=120, resources={"metadata": {"path": str(workdir)}})
    try:
        client.execute()
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=False)
    import nbformat

    nbformat.write(nb, workdir / f"{name}.ipynb")  # the executed notebook, for a failure's diagnosis
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    page = workdir / f"{name}.html"
    page.write_text(body, encoding="utf-8")
    return page


def execute_quickstart(workdir: Path) -> Path:
    """The quickstart run top to bottom with ``LUDIC_SMOKE=1`` and ``model = "tiny"``; its lab-template HTML."""
    nbformat = pytest.importorskip("nbformat")

    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    assert nb.cells[1].source.startswith("#| parameters")
    nb.cells.insert(2, nbformat.v4.new_code_cell('model = "tiny"  # injected by the test, as papermill would'))
    return execute_notebook(nb, workdir, "quickstart")


@pytest.mark.notebook
def test_the_quickstart_views_render_in_chromium_at_1600_px(tiny_model_dir: str, tmp_path: Path, free_port: int):
    page = execute_quickstart(tmp_path)
    with chromium_session(free_port, tmp_path / "profile", width=1600) as s:
        webdriver("POST", f"{s}/url", {"url": page.as_uri()})
        got = webdriver("POST", f"{s}/execute/sync", {"script": VIEWS_JS, "args": []})
        for i, v in enumerate(got["views"]):
            webdriver(
                "POST", f"{s}/execute/sync", {"script": f"window.scrollTo(0, {max(0, v['top'] - 40)})", "args": []}
            )
            screenshot(s, SCREENSHOTS / f"ludic_quickstart_view{i}.png")
    views = got["views"]
    # rollouts[0], the SAW batch, the credit view with ratios: each rendered with its tokens laid out
    assert len(views) == 3 and all(v["cards"] and v["tokens"] for v in views), views
    assert got["scrollWidth"] <= got["pageWidth"] == 1600
    assert all(v["outside"] == 0 for v in views), views
    batch_views = views[1:]
    for v in batch_views:
        assert "blue: pushed up" in v["legend"] and "red: pushed down" in v["legend"]
        # smoke: 2 countries x 4 samples, every group whole
        assert v["heads"] == [[4, 4], [4, 4]] and v["cards"] == 8
        assert (v["cut"] == 1) == (v["cutCards"] > 0), v  # a cut card is explained above the cards
