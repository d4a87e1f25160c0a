"""Tutorial 12 (bring your environment), executed headless in its smoke configuration with
``model = "tiny"`` set in its parameters cell (the views, not the model, are under test; the
exported script's torchrun check run takes the tiny model too), rendered by nbconvert's lab
template and opened in a real headless Chromium at 1600 px. Besides the quickstart's checks
(tests/test_browser_notebooks.py: cards within the page, a legend naming the colours drawn,
group headers counting their whole group, cut replies explained), what the tutorial's prose
says of its views: the colours it names are the legend's, each group header's mean is the whole
group's, the first verifiers episode and each held-out evaluation show a progress line, the
training cell shows its live plot, and the torchrun cell's header, live plot and metrics table
give one seconds-a-step. Screenshots go to ``$LUDIC_SCREENSHOTS`` (/tmp)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.lab.token_html import COLOUR_NAMES, fmt
from tests.test_browser_notebooks import ROOT, VIEWS_JS, execute_notebook
from tests.test_browser_views import SCREENSHOTS, chromium_session, screenshot, webdriver
from tests.xdist_groups import HEAVY_MEMORY

TUTORIAL = ROOT / "tutorials" / "12_bring_your_env.ipynb"
SMOKE_GROUP_SIZE, SMOKE_EVAL_EPISODES = 3, 2  # the smoke switch's group_size, eval_tasks x eval_k

PROBE = """\
import json as _json
_groups = {it.group_id: [x for x in batch.items if x.group_id == it.group_id] for it in cards}
print("LUDIC_CREDIT " + _json.dumps({
    "groups": {g[:12]: [len(xs), sum(x.reward for x in xs) / len(xs)] for g, xs in _groups.items()},
    "cut": sum(it.meta.get("finish_reason") == "length" for it in cards)}))
"""
"""Appended by the test (never committed): the credit view's groups as the batch holds them
(size, mean reward of the whole group) and how many of the cards shown were cut at max_tokens."""

PAGE_JS = """
const text = e => e ? e.textContent.replace(/\\s+/g, ' ').trim() : null;
const top = e => e.getBoundingClientRect().top + window.scrollY;
return {
  heads: Array.from(document.querySelectorAll('.ll-ghead')).map(text),
  folded: Array.from(document.querySelectorAll('.ll-card')).filter(c => c.querySelector('details:not([open])')).length,
  evals: Array.from(document.querySelectorAll('.ll-eval-progress')).map(e => ({text: text(e), top: top(e)})),
  live: Array.from(document.querySelectorAll('.ll-live')).map(e => ({
    text: text(e.querySelector('.ll-live-text')), done: +e.dataset.done, img: !!e.querySelector('img'), top: top(e)})),
  torchrun: Array.from(document.querySelectorAll('b')).filter(b => b.textContent === 'torchrun')
    .map(b => ({text: text(b.parentElement), top: top(b)})),
  tables: Array.from(document.querySelectorAll('table.dataframe')).map(t => ({
    head: Array.from(t.querySelectorAll('thead tr:first-child th')).map(text),
    rows: Array.from(t.querySelectorAll('tbody tr')).map(r => Array.from(r.children).map(text)), top: top(t)})),
  figures: Array.from(document.querySelectorAll('.jp-Cell')).filter(c => c.textContent.includes('fig.suptitle'))
    .map(top),
};
"""


def execute_tutorial12(workdir: Path) -> tuple[Path, Any, dict[str, Any]]:
    """The tutorial run with ``LUDIC_SMOKE=1`` and ``model = "tiny"``: its lab-template HTML, the
    executed notebook, and what :data:`PROBE` printed."""
    nbformat = pytest.importorskip("nbformat")
    for package in ("verifiers", "openenv"):
        pytest.importorskip(package, reason=f"{TUTORIAL.name} needs the {package} extra")
    nb = nbformat.read(TUTORIAL, as_version=4)
    params = next(c for c in nb.cells if c.cell_type == "code")
    assert params.source.startswith("#| parameters") and 'model = "default"' in params.source
    params.source = params.source.replace('model = "default"', 'model = "tiny"', 1)  # as a user sets it
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    page = execute_notebook(nb, workdir, "tutorial12")
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    line = next(ln for ln in printed.splitlines() if ln.startswith("LUDIC_CREDIT "))
    return page, nb, json.loads(line.split(" ", 1)[1])


def _no_view_diagnosis(page: Path, nb: Any, got: dict[str, Any], seen: dict[str, Any]) -> str:
    """What a run without exactly one credit view had: the credit cell's outputs, whether the page's
    HTML holds the view, what else the browser found (the page and notebook are copied to
    :data:`SCREENSHOTS` for a look)."""
    import shutil

    cell = next(c for c in nb.cells if c.cell_type == "code" and "lab.credit_view(" in c.source)
    outs = [
        (o.output_type, sorted(o.get("data", {})), len(o.get("data", {}).get("text/html", ""))) for o in cell.outputs
    ]
    text = page.read_text(encoding="utf-8")
    for f in (page, page.with_suffix(".ipynb")):
        if f.exists():
            shutil.copy(f, SCREENSHOTS / f"ludic_tutorial12_failed{f.suffix}")
    found = {k: len(v) for k, v in seen.items()}
    in_html = len(re.findall(r"class=[\"']ll-view[\"']", text))  # nbconvert re-serializes with either quote
    return (f"{len(got['views'])} credit views in the browser; the credit cell's outputs {outs}; the page's HTML "
            f"({len(text)} chars) holds a ll-view block {in_html} times; the browser found {found}")  # fmt: skip


def _prose_before(nb: Any, marker: str) -> str:
    """The markdown cell just before the first code cell whose source holds ``marker``."""
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and marker in c.source)
    return next(c.source for c in reversed(nb.cells[:at]) if c.cell_type == "markdown")


def _last_table(tables: list[dict[str, Any]], column: str) -> dict[str, Any]:
    """The page's last table with a ``column`` header."""
    return [t for t in tables if column in t["head"]][-1]


@pytest.mark.notebook
@HEAVY_MEMORY
@pytest.mark.timeout(900)
def test_tutorial12_views_render_in_chromium_and_say_what_its_prose_says(
    tiny_model_dir: str, tmp_path: Path, free_port: int
):
    page, nb, probe = execute_tutorial12(tmp_path)
    with chromium_session(free_port, tmp_path / "profile", width=1600) as s:
        webdriver("POST", f"{s}/url", {"url": page.as_uri()})
        got = webdriver("POST", f"{s}/execute/sync", {"script": VIEWS_JS, "args": []})
        seen = webdriver("POST", f"{s}/execute/sync", {"script": PAGE_JS, "args": []})
        shots = [("episode", e["top"]) for e in seen["evals"][:1]] + [("credit", v["top"]) for v in got["views"]]
        shots += [("live", v["top"]) for v in seen["live"][:1]] + [("figure", y) for y in seen["figures"]]
        shots += [("torchrun", seen["torchrun"][-1]["top"])] if seen["torchrun"] else []
        for i, (what, y) in enumerate(shots):
            webdriver("POST", f"{s}/execute/sync", {"script": f"window.scrollTo(0, {max(0, y - 40)})", "args": []})
            screenshot(s, SCREENSHOTS / f"ludic_tutorial12_{i}_{what}.png")
    assert got["scrollWidth"] <= got["pageWidth"] == 1600, "the page scrolls sideways"

    # the credit view: one, its cards within the page, the colours the legend and the prose name
    assert len(got["views"]) == 1, _no_view_diagnosis(page, nb, got, seen)
    (view,) = got["views"]
    assert view["cards"] and view["tokens"] and view["outside"] == 0, view
    prose = " ".join(_prose_before(nb, "lab.credit_view(").split())
    for sign, says in (("positive", "pushed up"), ("negative", "pushed down"), ("masked", "masked, not trained")):
        assert f"{COLOUR_NAMES[sign]}: {says}" in view["legend"], view["legend"]
    assert "blue tokens are pushed up, red ones down, grey ones" in prose, prose
    assert "The prompt is folded" in prose and seen["folded"] == view["cards"], seen["folded"]
    # each group's header is the whole group's: its size, the cards shown of it, its mean reward
    assert len(view["heads"]) == len(probe["groups"]) == 2, (view, probe)  # one group per environment
    assert sum(shown for _, shown in view["heads"]) == view["cards"]
    for (size, shown), head in zip(view["heads"], seen["heads"], strict=True):
        gid = re.search(r"group (\S+)", head).group(1)
        whole, mean = probe["groups"][gid]
        assert size == whole == SMOKE_GROUP_SIZE and 1 <= shown <= 2, (head, probe)
        assert f"reward mean {fmt(mean)}" in head and (shown == size or f"{shown} shown" in head), (head, probe)
    # replies cut at max_tokens: explained above the cards exactly when a card shown was cut
    assert view["cutCards"] == probe["cut"] and view["cut"] == (probe["cut"] > 0), (view, probe)

    # progress lines: the first verifiers episode, then each environment's held-out evaluation, before and after
    evals = [e["text"] for e in seen["evals"]]
    assert evals[0].startswith("one verifiers episode 1/1 episodes"), evals
    names = ("vf_multiply", "capitals")
    for when in ("before", "after"):
        for name in names:
            want = f"{when} {name} {SMOKE_EVAL_EPISODES}/{SMOKE_EVAL_EPISODES} episodes"
            assert any(e.startswith(want) for e in evals), (want, evals)
    held_out = _last_table(seen["tables"], "pass@1")
    assert [r[0] for r in held_out["rows"]] == [f"{w} {n}" for w in ("before", "after") for n in names], held_out

    # the training cell's live plot (one step) and the torchrun cell: one seconds-a-step in all three places
    train, torchrun_plot = seen["live"]
    assert train["done"] == 1 and train["img"] and train["text"].startswith("train 1/1"), train
    metrics = _last_table(seen["tables"], "time/step_s")
    per = float(metrics["rows"][0][metrics["head"].index("time/step_s")])
    assert len(metrics["rows"]) == 1 and per > 0, metrics
    head = seen["torchrun"][-1]["text"]
    assert "succeeded" in head and f"{per:.2f} s/step" in head, (head, per)
    assert torchrun_plot["done"] == 1 and f"{per:.2f} s/step" in torchrun_plot["text"], (torchrun_plot, per)
