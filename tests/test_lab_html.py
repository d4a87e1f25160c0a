"""The HTML credit views: token colours follow ``weight x action_mask`` (sign, grey when
masked, one scale per group), hover data, multi-byte text and whitespace kept exactly, HTML
escaped, standalone export — checked by parsing, and once in a real headless chromium."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.lab.rollout_html import rollouts_html
from ludic_lab.lab.saw_html import saw_batch_html
from ludic_lab.lab.token_html import (
    MASKED_BG,
    display_tokenizer,
    save_html,
    token_pieces,
    weight_rgb,
)
from ludic_lab.rollouts.saw import SAWBatch, SAWItem
from ludic_lab.types import Rollout, Step, TokenTrace

TEXTS = ["café 日本 🎉", "a\tb\n\n  c  ", '<script>alert("x")</script> & </span>']
WEIGHTS = [0.5, -1.0, 0.0]


# -- parsing helpers -----------------------------------------------------------------------------
class ViewParser(HTMLParser):
    """Collects groups -> cards -> token spans (attributes and text) of a view."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.groups: list[dict[str, Any]] = []
        self.cards: list[dict[str, Any]] = []
        self.tags: list[str] = []
        self._span: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append(tag)
        cls = a.get("class", "").split()
        if tag == "div" and "ll-group" in cls:
            self.groups.append({"attrs": a, "cards": []})
        elif tag == "div" and "ll-card" in cls:
            card = {"attrs": a, "spans": []}
            self.cards.append(card)
            if self.groups:
                self.groups[-1]["cards"].append(card)
        elif tag == "span" and "ll-t" in cls:
            self._span = {"attrs": a, "text": ""}
            self.cards[-1]["spans"].append(self._span)

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._span = None

    def handle_data(self, data: str) -> None:
        if self._span is not None:
            self._span["text"] += data


def parse(html: str) -> ViewParser:
    p = ViewParser()
    p.feed(html)
    p.close()
    return p


def bg(span: dict[str, Any]) -> tuple[int, int, int]:
    style = span["attrs"]["style"]
    m = re.search(r"background:\s*rgb\((\d+),\s*(\d+),\s*(\d+)\)", style)
    assert m, style
    return int(m[1]), int(m[2]), int(m[3])


def masked_rgb() -> tuple[int, int, int]:
    return tuple(int(x) for x in re.findall(r"\d+", MASKED_BG))  # type: ignore[return-value]


def check_colour_signs(spans: list[dict[str, Any]]) -> int:
    """Every span's colour agrees with its mask and weight sign; returns how many were action."""
    n_action = 0
    for s in spans:
        rgb = bg(s)
        if s["attrs"]["data-mask"] == "0":
            assert rgb == masked_rgb(), s
            continue
        n_action += 1
        w = float(s["attrs"]["data-w"])
        if w > 0:
            assert rgb[2] > rgb[0], s
        elif w < 0:
            assert rgb[0] > rgb[2], s
        else:
            assert rgb == (255, 255, 255), s
    return n_action


# -- fixtures ----------------------------------------------------------------------------------
def make_items(tok: Any) -> list[SAWItem]:
    prompt = tok.encode("<|im_start|>user\nSay it:\tnow<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    items = []
    for k, (text, w) in enumerate(zip(TEXTS, WEIGHTS, strict=False)):
        comp = tok.encode(text, add_special_tokens=False) + [eos]
        P, C = len(prompt), len(comp)
        items.append(
            SAWItem(
                input_ids=tuple(prompt + comp),
                action_mask=(0,) * P + (1,) * C,
                weights=(0.0,) * P + (w,) * C,
                behaviour_logprobs=(0.0,) * P + tuple(-0.1 * (j + 1) for j in range(C)),
                reward=1.0 - k,
                rollout_id=f"r{k}",
                group_id="g1",
            )
        )
    comp = tok.encode("solo", add_special_tokens=False) + [eos]
    items.append(
        SAWItem(
            input_ids=tuple(prompt + comp),
            action_mask=(0,) * len(prompt) + (1,) * len(comp),
            weights=(0.0,) * len(prompt) + (2.0,) * len(comp),
            behaviour_logprobs=(0.0,) * len(prompt) + (-1.0,) * len(comp),
            reward=3.0,
            rollout_id="r3",
            group_id="g2",
        )
    )
    return items


def decode(tok: Any, ids: Any) -> str:
    return tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


# -- SAW views -----------------------------------------------------------------------------------
def test_saw_batch_colours_follow_weight_sign_and_share_one_scale_per_group(tiny_tokenizer):
    items = make_items(tiny_tokenizer)
    view = parse(saw_batch_html(SAWBatch(items), tokenizer=tiny_tokenizer))
    assert [g["attrs"]["data-group-id"] for g in view.groups] == ["g1", "g2"]
    assert [len(g["cards"]) for g in view.groups] == [3, 1]  # siblings side by side in one row
    assert [float(g["attrs"]["data-scale"]) for g in view.groups] == [1.0, 2.0]
    for card, it in zip(view.cards, items, strict=False):
        spans = card["spans"]
        assert check_colour_signs(spans) == sum(1 for s in spans if s["attrs"]["data-mask"] == "1") > 0
        # grey exactly on the prompt, and the action weights are the item's
        n_masked_tokens = sum(len(s["attrs"]["data-ids"].split()) for s in spans if s["attrs"]["data-mask"] == "0")
        assert n_masked_tokens == it.num_tokens - it.num_action_tokens
        assert {float(s["attrs"]["data-w"]) for s in spans if s["attrs"]["data-mask"] == "1"} == {it.weight}
        assert float(card["attrs"]["data-adv"]) == it.weight and float(card["attrs"]["data-reward"]) == it.reward
    # the scale is the group's: +0.5 next to a -1.0 sibling is a 57.5% tint (hand-computed:
    # 0.15 + 0.85 * 0.5 / 1.0), while the lone +2.0 of group g2 is full blue
    first_action = next(s for s in view.cards[0]["spans"] if s["attrs"]["data-mask"] == "1")
    assert bg(first_action) == (127, 167, 207) == weight_rgb(0.5, 1.0)
    full = next(s for s in view.cards[3]["spans"] if s["attrs"]["data-mask"] == "1")
    assert bg(full) == (33, 102, 172)
    neg = next(s for s in view.cards[1]["spans"] if s["attrs"]["data-mask"] == "1")
    assert bg(neg) == (178, 24, 43)  # -1.0 is the group's max |w|: full red


def test_hover_data_has_token_ids_logprobs_ratios_and_advantage(tiny_tokenizer):
    items = make_items(tiny_tokenizer)
    current = [
        [b + (0.2 if m else 0.0) for b, m in zip(it.behaviour_logprobs, it.action_mask, strict=False)] for it in items
    ]
    view = parse(saw_batch_html(items, tokenizer=tiny_tokenizer, logprobs=current))
    for card, it in zip(view.cards, items, strict=False):
        pos = 0
        for s in card["spans"]:
            a = s["attrs"]
            ids = [int(x) for x in a["data-ids"].split()]
            assert ids == list(it.input_ids[pos : pos + len(ids)])
            assert a["title"].startswith("token")
            assert all(str(i) in a["title"] for i in ids)
            if a["data-mask"] == "1":
                lps = [float(x) for x in a["data-logprob"].split()]
                assert lps == pytest.approx(list(it.behaviour_logprobs[pos : pos + len(ids)]))
                assert [float(x) for x in a["data-ratio"].split()] == pytest.approx([math.exp(0.2)] * len(ids))
                assert float(a["data-adv"]) == it.weight
                assert "logprob" in a["title"] and "ratio 1.221" in a["title"] and "adv" in a["title"]
            else:
                assert "data-logprob" not in a and "data-ratio" not in a and "masked" in a["title"]
            pos += len(ids)
        assert pos == it.num_tokens


def test_multibyte_whitespace_and_markup_are_rendered_exactly(tiny_tokenizer):
    items = make_items(tiny_tokenizer)
    page = saw_batch_html(SAWBatch(items), tokenizer=tiny_tokenizer)
    view = parse(page)
    assert "script" not in view.tags  # the completion's <script> stays text
    for card, it in zip(view.cards, items, strict=False):
        text = "".join(s["text"] for s in card["spans"])
        assert text == decode(tiny_tokenizer, it.input_ids)
        assert "\ufffd" not in text
    texts = [s["text"] for s in view.cards[0]["spans"]]
    assert "日" in "".join(texts) and "🎉" in "".join(texts)
    multi = [s for s in view.cards[0]["spans"] if len(s["attrs"]["data-ids"].split()) > 1]
    assert multi, "the tiny BPE splits CJK/emoji bytes across tokens: they must be grouped"
    assert all(s["text"] in ("日", "本", "🎉") or s["text"].strip() in ("日", "本", "🎉") for s in multi)
    ws = "".join(s["text"] for s in view.cards[1]["spans"])
    assert "a\tb\n\n  c  " in ws
    assert any("ll-nl" in s["attrs"]["class"] for s in view.cards[1]["spans"])
    assert "white-space:pre-wrap" in page and "<script>" not in page and "</span> &amp;" not in page


def test_token_pieces_group_split_characters_and_concatenate_to_decode(tiny_tokenizer):
    ids = tiny_tokenizer.encode("x 🎉🎉 é\u00a0日本語\n", add_special_tokens=False)
    pieces = token_pieces(ids, tiny_tokenizer)
    assert "".join(p.text for p in pieces) == decode(tiny_tokenizer, ids)
    assert [p.start for p in pieces[1:]] == [p.stop for p in pieces[:-1]] and pieces[-1].stop == len(ids)
    assert not any("\ufffd" in p.text for p in pieces)
    # a lone continuation byte (an invalid sequence the model sampled) stays visible as U+FFFD
    bad = tiny_tokenizer.encode("日", add_special_tokens=False)[1:]
    assert "\ufffd" in "".join(p.text for p in token_pieces(bad, tiny_tokenizer))


def test_without_a_tokenizer_token_ids_are_shown(tiny_tokenizer):
    it = make_items(tiny_tokenizer)[0]
    view = parse(it._repr_html_())
    texts = [s["text"] for s in view.cards[0]["spans"]]
    assert texts == [f"\u2039{i}\u203a" for i in it.input_ids]
    with display_tokenizer(tiny_tokenizer):
        view = parse(it._repr_html_())
    assert "".join(s["text"] for s in view.cards[0]["spans"]) == decode(tiny_tokenizer, it.input_ids)


def test_reprs_of_item_and_batch_use_the_display_tokenizer(tiny_tokenizer):
    items = make_items(tiny_tokenizer)
    with display_tokenizer(tiny_tokenizer):
        b = parse(SAWBatch(items, meta={"reward_mean": 0.25})._repr_html_())
        one = parse(items[1]._repr_html_())
    assert len(b.cards) == 4 and len(one.cards) == 1
    assert "".join(s["text"] for s in one.cards[0]["spans"]) == decode(tiny_tokenizer, items[1].input_ids)


# -- rollout views -----------------------------------------------------------------------------
def make_rollouts(tok: Any) -> list[Rollout]:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    out = []
    for k, text in enumerate(TEXTS[:2]):
        prompt = tok.encode(f"<|im_start|>user\nq{k}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        comp = tok.encode(text, add_special_tokens=False) + [eos]
        tr = TokenTrace(prompt, comp, [-0.25] * len(comp))
        step = Step(0, f"q{k}", text, text, "ok", reward=float(k), terminated=True, trace=tr, env_reward=float(k))
        out.append(Rollout(steps=(step,), id=f"roll{k}", group_id="G", env_seed=7, sampling_seed=k))
    return out


def test_rollout_views_colour_by_credit_and_show_siblings_side_by_side(tiny_tokenizer):
    rs = make_rollouts(tiny_tokenizer)
    weights = {("roll0", 0): -0.5, ("roll1", 0): 0.5}
    view = parse(rollouts_html(rs, weights=weights, tokenizer=tiny_tokenizer))
    assert len(view.groups) == 1 and len(view.groups[0]["cards"]) == 2
    for card, r in zip(view.cards, rs, strict=False):
        spans = card["spans"]
        check_colour_signs(spans)
        w = weights[(r.id, 0)]
        assert {float(s["attrs"]["data-w"]) for s in spans if s["attrs"]["data-mask"] == "1"} == {w}
        assert "".join(s["text"] for s in spans) == decode(tiny_tokenizer, r.steps[0].trace.input_ids)
        lps = [float(x) for s in spans if s["attrs"]["data-mask"] == "1" for x in s["attrs"]["data-logprob"].split()]
        assert lps == [-0.25] * len(r.steps[0].trace.completion_token_ids)
    # without weights the completion is white (credit unknown), the prompt grey
    plain = parse(rollouts_html(rs[0], tokenizer=tiny_tokenizer))
    spans = plain.cards[0]["spans"]
    assert {bg(s) for s in spans if s["attrs"]["data-mask"] == "1"} == {(255, 255, 255)}
    assert {bg(s) for s in spans if s["attrs"]["data-mask"] == "0"} == {masked_rgb()}
    with display_tokenizer(tiny_tokenizer):
        assert parse(rs[1]._repr_html_()).cards[0]["attrs"]["data-rollout-id"] == "roll1"


def test_rollout_view_without_trace_and_failed_rollout():
    s = Step(0, "obs", "some <b>text</b>", None, "Invalid", reward=-1.0, info={"parse_error": True}, format_reward=-1.0)
    html = Rollout(steps=(s,), error="env.step: ValueError: boom")._repr_html_()
    assert "some &lt;b&gt;text&lt;/b&gt;" in html and "no token trace" in html
    assert "failed: env.step: ValueError: boom" in html and "parse error" in html


def test_save_html_writes_a_standalone_utf8_page(tiny_tokenizer, tmp_path: Path):
    items = make_items(tiny_tokenizer)
    with display_tokenizer(tiny_tokenizer):
        path = save_html(SAWBatch(items), tmp_path / "sub" / "credit.html")
    text = Path(path).read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and "<meta charset='utf-8'>" in text
    assert len(parse(text).cards) == 4 and "🎉" in text
    with pytest.raises(TypeError, match="no HTML view"):
        save_html(object(), tmp_path / "x.html")


# -- a real browser --------------------------------------------------------------------------------
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def _wd(method: str, url: str, body: Any = None, timeout: float = 60.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())["value"]


BROWSER_JS = """
const spans = Array.from(document.querySelectorAll('span.ll-t'));
const seqs = Array.from(document.querySelectorAll('.ll-card'));
return {
  spans: spans.map(s => [getComputedStyle(s).backgroundColor, s.dataset.w || null, s.dataset.mask, s.title,
                         s.dataset.ids, s.getBoundingClientRect().width]),
  cards: seqs.map(c => Array.from(c.querySelectorAll('span.ll-t')).map(s => s.textContent).join('')),
  whiteSpace: getComputedStyle(document.querySelector('.ll-seq')).whiteSpace,
};
"""


@pytest.mark.notebook
def test_credit_view_in_headless_chromium(tiny_tokenizer, tmp_path: Path, free_port: int):
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not os.access(exe, os.X_OK):
            pytest.skip(f"{exe} is not installed (apt-get install chromium chromium-driver)")
    items = make_items(tiny_tokenizer)
    page = Path(save_html(saw_batch_html(SAWBatch(items), tokenizer=tiny_tokenizer), tmp_path / "credit.html"))
    driver = subprocess.Popen(
        [CHROMEDRIVER, f"--port={free_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{free_port}"
    session = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if _wd("GET", f"{base}/status", timeout=2).get("ready"):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            assert time.monotonic() < deadline, "chromedriver did not start"
            time.sleep(0.1)
        args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--window-size=1400,1000",
        ]
        caps = {
            "capabilities": {
                "alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}
            }
        }
        session = _wd("POST", f"{base}/session", caps, timeout=120)["sessionId"]
        s = f"{base}/session/{session}"
        _wd("POST", f"{s}/url", {"url": page.as_uri()})
        got = _wd("POST", f"{s}/execute/sync", {"script": BROWSER_JS, "args": []})
        # it rendered: every token span is laid out, each card's text is the decoded sequence
        assert len(got["spans"]) == sum(
            len(parse(saw_batch_html(it, tokenizer=tiny_tokenizer)).cards[0]["spans"]) for it in items
        )
        assert got["whiteSpace"] == "pre-wrap"
        assert got["cards"] == [decode(tiny_tokenizer, it.input_ids) for it in items]
        n_pos = n_neg = n_zero = n_masked = 0
        for colour, w, mask, title, ids, _width in got["spans"]:
            r, g, b = (int(x) for x in re.findall(r"\d+", colour)[:3])
            assert title.startswith("token") and ids, "hover data missing"
            if mask == "0":
                assert (r, g, b) == masked_rgb()
                n_masked += 1
            elif float(w) > 0:
                assert b > r, (colour, w)
                n_pos += 1
            elif float(w) < 0:
                assert r > b, (colour, w)
                n_neg += 1
            else:
                assert (r, g, b) == (255, 255, 255)
                n_zero += 1
        assert min(n_pos, n_neg, n_zero, n_masked) > 0
        # hover a positive action token with the real pointer: the title is what the browser shows
        el = _wd("POST", f"{s}/element", {"using": "css selector", "value": ".ll-card span.ll-t[data-mask='1']"})[
            ELEMENT
        ]
        actions = {
            "actions": [
                {
                    "type": "pointer",
                    "id": "mouse",
                    "parameters": {"pointerType": "mouse"},
                    "actions": [{"type": "pointerMove", "duration": 0, "origin": {ELEMENT: el}, "x": 0, "y": 0}],
                }
            ]
        }
        _wd("POST", f"{s}/actions", actions)
        hovered = _wd(
            "POST",
            f"{s}/execute/sync",
            {
                "script": "const e = arguments[0]; return [e.matches(':hover'), e.title, getComputedStyle(e).outlineStyle];",
                "args": [{ELEMENT: el}],
            },
        )
        assert hovered[0] is True and "logprob" in hovered[1] and "adv +0.500" in hovered[1]
        assert hovered[2] == "solid"  # the hover outline of the stylesheet applies
    finally:
        if session is not None:
            try:
                _wd("DELETE", f"{base}/session/{session}", timeout=30)
            except Exception:  # noqa: BLE001 - the driver is killed below anyway
                pass
        driver.terminate()
        try:
            driver.wait(10)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait(5)
