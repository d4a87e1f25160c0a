"""The credit views in a real headless Chromium: every sibling card of a group lies within the
page's width (cards wrap, nothing hides to the right), at the width a laptop notebook has.

:func:`chromium_session` (chromedriver over WebDriver's HTTP protocol, no client package) is
shared with tests/test_browser_notebooks.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.lab.saw_html import saw_batch_html
from ludic_lab.lab.token_html import save_html
from ludic_lab.rollouts.saw import SAWBatch, SAWItem

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOTS = Path(os.environ.get("LUDIC_SCREENSHOTS", "/tmp"))
"""Where the tests leave their screenshots, to look at (default /tmp)."""

CARDS_JS = """
const doc = document.documentElement;
const cards = Array.from(document.querySelectorAll('.ll-card')).map(c => {
  const r = c.getBoundingClientRect();
  return {left: r.left, right: r.right, width: r.width, top: r.top, id: c.dataset.rolloutId};
});
const groups = Array.from(document.querySelectorAll('.ll-group')).map(g => [g.scrollWidth, g.clientWidth]);
return {cards: cards, groups: groups, pageWidth: doc.clientWidth, scrollWidth: doc.scrollWidth,
        heads: Array.from(document.querySelectorAll('.ll-ghead')).map(h => h.textContent)};
"""


def webdriver(method: str, url: str, body: Any = None, timeout: float = 60.0) -> Any:
    """One WebDriver call; returns its ``value``."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())["value"]


@contextlib.contextmanager
def chromium_session(port: int, profile: Path, width: int = 1600, height: int = 1000) -> Iterator[str]:
    """A headless Chromium window of ``width`` x ``height`` px; yields the session's URL."""
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not os.access(exe, os.X_OK):
            pytest.skip(f"{exe} is not installed (scripts/install_system_deps.sh: chromium chromium-driver)")
    driver = subprocess.Popen([CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    session = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if webdriver("GET", f"{base}/status", timeout=2).get("ready"):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            assert time.monotonic() < deadline, "chromedriver did not start"
            time.sleep(0.1)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                f"--user-data-dir={profile}", f"--window-size={width},{height}"]  # fmt: skip
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                                                 "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}}  # fmt: skip
        session = webdriver("POST", f"{base}/session", caps, timeout=120)["sessionId"]
        yield f"{base}/session/{session}"
    finally:
        if session is not None:
            with contextlib.suppress(Exception):
                webdriver("DELETE", f"{base}/session/{session}", timeout=30)
        driver.terminate()
        try:
            driver.wait(10)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()


def screenshot(session: str, path: Path) -> Path:
    """The window as a PNG at ``path``."""
    import base64

    path.write_bytes(base64.b64decode(webdriver("GET", f"{session}/screenshot")))
    return path


def siblings(tok: Any, n: int) -> list[SAWItem]:
    """``n`` items of one group: one right answer (reward 1) and ``n - 1`` wrong ones (0), GRPO-weighted."""
    prompt = tok.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
                        add_special_tokens=False)  # fmt: skip
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rewards = [1.0] + [0.0] * (n - 1)
    mean = sum(rewards) / n
    std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
    items = []
    for k, r in enumerate(rewards):
        reply = "Paris is the capital of France, a city on the Seine." if r else f"I think it is city number {k}."
        comp = tok.encode(reply, add_special_tokens=False) + [eos]
        w = (r - mean) / (std + 1e-6)
        items.append(SAWItem(input_ids=tuple(prompt + comp), action_mask=(0,) * len(prompt) + (1,) * len(comp),
                             weights=(0.0,) * len(prompt) + (w,) * len(comp),
                             behaviour_logprobs=(0.0,) * len(prompt) + (-0.5,) * len(comp),
                             reward=r, rollout_id=f"r{k}", group_id="g0"))  # fmt: skip
    return items


@pytest.mark.notebook
def test_every_sibling_card_is_within_the_page_at_1600_px(tiny_tokenizer, tmp_path: Path, free_port: int):
    items = siblings(tiny_tokenizer, 8)  # GRPO's common group size: 8 cards of at least 18em side by side
    page = Path(save_html(saw_batch_html(SAWBatch(tuple(items)), tokenizer=tiny_tokenizer), tmp_path / "credit.html"))
    with chromium_session(free_port, tmp_path / "profile", width=1600) as s:
        webdriver("POST", f"{s}/url", {"url": page.as_uri()})
        got = webdriver("POST", f"{s}/execute/sync", {"script": CARDS_JS, "args": []})
        screenshot(s, SCREENSHOTS / "ludic_credit_view_1600.png")
    assert [c["id"] for c in got["cards"]] == [it.rollout_id for it in items]
    width = got["pageWidth"]
    assert width > 1400, got  # the window really is 1600 px wide
    outside = [c for c in got["cards"] if c["left"] < 0 or c["right"] > width + 0.5]
    assert not outside, f"{len(outside)} of {len(items)} cards reach past the page's {width} px: {outside}"
    assert got["scrollWidth"] <= width, "the page scrolls sideways"
    assert all(sw <= cw for sw, cw in got["groups"]), f"a group scrolls sideways inside the output: {got['groups']}"
    assert min(c["width"] for c in got["cards"]) >= 200, "cards too narrow to read"
    assert len({round(c["top"]) for c in got["cards"]}) > 1, "8 cards at 1600 px should wrap to a second row"
    assert got["heads"] and "8 siblings" in got["heads"][0]
