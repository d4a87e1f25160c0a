"""The credit views say what they show: a group's header describes the whole group (size, mean
reward, colour scale) and how many of its siblings are drawn; replies cut at ``max_tokens`` are
marked, with what their reward means next to the cards; and the prose of every notebook names the
colours the views draw."""

from __future__ import annotations

import colorsys
import re
from dataclasses import replace
from pathlib import Path

import pytest

from ludic_lab.lab.saw_html import saw_batch_html
from ludic_lab.lab.token_html import COLOUR_NAMES, MASKED_BG, NEG_RGB, POS_RGB, legend_html, weight_rgb
from ludic_lab.lab.views import credit_view
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.types import Rollout, Step, TokenTrace
from tests.test_browser_views import siblings
from tests.test_lab_html import parse

ROOT = Path(__file__).resolve().parent.parent


def heads(html: str) -> list[str]:
    """The text of each group header."""
    return [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<div class='ll-ghead'[^>]*>(.*?)</div>", html)]


def test_a_subset_of_a_group_is_described_by_the_whole_group(tiny_tokenizer):
    items = siblings(tiny_tokenizer, 6)  # rewards 1, 0, 0, 0, 0, 0: mean 0.167
    batch = SAWBatch(tuple(items))
    best, worst = items[0], items[-1]
    html = credit_view(batch, show=[best, worst], tokenizer=tiny_tokenizer).html
    (head,) = heads(html)
    assert "6 siblings, 2 shown" in head and "reward mean +0.167 (all 6)" in head, head
    view = parse(html)
    assert [c["attrs"]["data-rollout-id"] for c in view.cards] == ["r0", "r5"]
    # the colours of the cards shown are those of the whole view: one scale for the whole group
    whole = parse(saw_batch_html(batch, tokenizer=tiny_tokenizer))
    by_id = {c["attrs"]["data-rollout-id"]: c for c in whole.cards}
    for card in view.cards:
        assert card["spans"] == by_id[card["attrs"]["data-rollout-id"]]["spans"]
    assert view.groups[0]["attrs"]["data-scale"] == whole.groups[0]["attrs"]["data-scale"]
    # the whole group shown: no "shown" count
    (head,) = heads(saw_batch_html(batch, tokenizer=tiny_tokenizer))
    assert "6 siblings ·" in head and "shown" not in head and "(all" not in head


def test_max_items_cuts_cards_not_the_group_header(tiny_tokenizer):
    items = siblings(tiny_tokenizer, 6)
    html = saw_batch_html(SAWBatch(tuple(items)), tokenizer=tiny_tokenizer, max_items=4)
    (head,) = heads(html)
    assert "6 siblings, 4 shown" in head and "(all 6)" in head
    assert "2 more item(s) not shown" in html


def test_show_refuses_items_of_another_batch(tiny_tokenizer):
    items = siblings(tiny_tokenizer, 3)
    stranger = replace(items[0], rollout_id="elsewhere", reward=5.0)
    with pytest.raises(ValueError, match="not items of the batch"):
        credit_view(SAWBatch(tuple(items)), show=[stranger], tokenizer=tiny_tokenizer)


def rollouts(tok, rewards, *, cut=()):
    prompt = tok.encode("<|im_start|>user\nCapital of Japan?<|im_end|>\n<|im_start|>assistant\n",
                        add_special_tokens=False)  # fmt: skip
    out = []
    for k, r in enumerate(rewards):
        comp = tok.encode(f"Tokyo, reply {k}", add_special_tokens=False)
        info = {"incomplete_completion": True, "parse_error": True} if k in cut else {}
        step = Step(0, "q", "a", None if k in cut else "a", "ok", reward=r, terminated=True, info=info,
                    trace=TokenTrace(prompt, comp, [-0.2] * len(comp), finish_reason="length" if k in cut else "stop"))  # fmt: skip
        out.append(Rollout(steps=(step,), id=f"ro{k}", group_id="G"))
    return out


def test_rollout_view_header_is_the_whole_group_and_cut_replies_are_explained(tiny_tokenizer):
    rs = rollouts(tiny_tokenizer, [1.0, 0.0, -0.1, -0.1, 0.0, 0.0], cut={2, 3})
    weights = {(r.id, 0): r.total_reward - 0.133 for r in rs}
    html = credit_view(rs, weights=weights, show=[rs[0], rs[2]], tokenizer=tiny_tokenizer).html
    (head,) = heads(html)
    assert "6 rollouts, 2 shown" in head and "reward mean +0.133 (all 6)" in head, head
    assert "1 of 2</b> replies shown were cut at <code>max_tokens</code>" in html
    assert "penalty" in html and "reject_incomplete_completions=False" in html
    assert "at max_tokens: the agent's penalty, not judged by the env" in html
    # no cut reply shown: no note
    assert "ll-cut-note" not in credit_view(rs, weights=weights, show=[rs[0]], tokenizer=tiny_tokenizer).html


def test_saw_cards_of_cut_replies_are_marked_with_the_note_above(tiny_tokenizer):
    items = siblings(tiny_tokenizer, 3)
    items[1] = replace(items[1], meta={**items[1].meta, "finish_reason": "length"})
    html = saw_batch_html(SAWBatch(tuple(items)), tokenizer=tiny_tokenizer)
    assert html.count(">cut</span>") == 1 and "1 of 3</b> replies shown were cut" in html
    assert html.index("class='ll-head ll-cut-note'") < html.index("<div class='ll-card'")


# -- colours: the legend and the notebooks' prose name what the views draw ------------------------
def colour_name(rgb: tuple[int, int, int]) -> str:
    """A plain name of an RGB colour (the few a view uses)."""
    h, light, sat = colorsys.rgb_to_hls(*(c / 255 for c in rgb))
    if sat < 0.15 or light > 0.97:
        return "white" if light > 0.95 else "grey"
    hue = h * 360
    return next(name for top, name in ((20, "red"), (70, "orange"), (170, "green"), (260, "blue"), (361, "red"))
                if hue < top)  # fmt: skip


def test_colour_names_are_the_colours_drawn():
    masked = tuple(int(x) for x in re.findall(r"\d+", MASKED_BG))
    drawn = {"positive": POS_RGB, "negative": NEG_RGB, "zero": weight_rgb(0.0, 1.0), "masked": masked}
    assert {k: colour_name(v) for k, v in drawn.items()} == COLOUR_NAMES  # type: ignore[arg-type]
    legend = legend_html(2.0)
    for name in COLOUR_NAMES.values():
        assert name in legend


COLOURS = r"(green|blue|red|grey|gray|white|orange|yellow|purple)"


def test_notebook_prose_names_the_colours_the_credit_view_draws():
    pos, neg = COLOUR_NAMES["positive"], COLOUR_NAMES["negative"]
    problems = []
    sources = sorted((ROOT / "scripts" / "notebook_src").rglob("*.md"))
    assert len(sources) >= 15
    for path in sources:
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # prose only
        text = re.sub(r"\s+", " ", text)
        for m in re.finditer(COLOURS + r"[^.;:()]{0,30}?\bpush(?:ed|es)? (up|down)", text, flags=re.I):
            want = pos if m[2].lower() == "up" else neg
            if m[1].lower() != want:
                problems.append(f"{path.name}: {m[0]!r} (the view draws {want})")
        for m in re.finditer(r"\bpush(?:ed|es)? (up|down) \(" + COLOURS + r"\)", text, flags=re.I):
            want = pos if m[1].lower() == "up" else neg
            if m[2].lower() != want:
                problems.append(f"{path.name}: {m[0]!r} (the view draws {want})")
        for m in re.finditer(r"\(" + COLOURS + r" up, " + COLOURS + " down", text, flags=re.I):
            if (m[1].lower(), m[2].lower()) != (pos, neg):
                problems.append(f"{path.name}: {m[0]!r} (the view draws {pos} up, {neg} down)")
    assert not problems, problems
