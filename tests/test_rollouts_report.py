"""The demo's ``rollouts.html`` (:func:`ludic_lab.lab.reports.write_rollouts_html`): the credit
weights the trainer used (rows and sampled tokens coloured by sign and size, with a legend),
the parsed action rather than the completion again, the training step in the header, a turn
column only for multi-step episodes, and short numbers (no 17-digit floats, no Python dicts)."""

from __future__ import annotations

import asyncio
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.data import capital_verifier, load_capitals
from ludic_lab.demos.tool_task import final_number_match, final_number_parser
from ludic_lab.envs import DatasetQAEnv
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.lab.reports import format_metrics, format_number, rollouts_html, weight_rgb, write_rollouts_html
from ludic_lab.lab.token_html import COLOUR_NAMES
from ludic_lab.rollouts import EnvSpec, GRPORequestStrategy, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.credit import GroupNormalizedReturn
from ludic_lab.rollouts.rollout_source import RolloutBatchSource
from ludic_lab.task.capitals import capital_parser
from ludic_lab.training.batching.sample_ahead import SampleAheadSource
from ludic_lab.types import Rollout, Step, TokenTrace
from tests.helpers import ScriptedChatClient, chatml_template

LONG_FLOAT = re.compile(r"\d\.\d{7,}")
"""A float printed with all its digits (``0.30000000000000004``, ``0.7071067811865476``)."""


class Table(HTMLParser):
    """The rows of the report's main table: each a dict of attrs plus its cells' text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, Any]] = []
        self.headers: list[str] = []
        self._cell: list[str] | None = None
        self._in_th = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr":
            self.rows.append({"attrs": a, "cells": [], "cell_styles": [], "cell_classes": []})
        if tag in ("td", "th") and self.rows:
            self._cell = []
            self._in_th = tag == "th"
            if tag == "td":
                self.rows[-1]["cell_styles"].append(a.get("style") or "")
                self.rows[-1]["cell_classes"].append(a.get("class") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell)
            if self._in_th:
                self.headers.append(text)
            else:
                self.rows[-1]["cells"].append(text)
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def main_rows(page: str) -> tuple[list[str], list[dict[str, Any]]]:
    body = page[page.index("<table><thead>") :]
    t = Table()
    t.feed(body)
    return t.headers, [r for r in t.rows if r["cells"]]


def visible(page: str) -> str:
    """The page's text as a browser shows it (no tags, no attributes); a tag separates, as a cell border does,
    so a number is never read on into the next cell (a group id may start with digits)."""
    return re.sub(r"<[^>]*>", " ", page)


def rgb(style: str) -> tuple[int, int, int]:
    m = re.search(r"background:rgb\((\d+), (\d+), (\d+)\)", style)
    assert m, style
    return int(m[1]), int(m[2]), int(m[3])


def check_colour(style: str, w: float) -> None:
    """The notebook views' palette (token_html.COLOUR_NAMES): blue pushed up, red down, white 0."""
    r, g, b = rgb(style)
    if w > 0:
        assert b > r and b > g, (style, w)  # blue
    elif w < 0:
        assert r > g and r > b, (style, w)  # red
    else:
        assert r == g == b == 255, (style, w)  # white


# -- numbers ---------------------------------------------------------------------------------
def test_numbers_and_dicts_are_short_and_readable():
    assert format_number(0.30000000000000004) == "0.3"
    assert format_number(0.7071067811865476) == "0.707"
    assert format_number(12.3456) == "12.3" and format_number(999.9) == "1000" and format_number(1234.5) == "1234"
    assert format_number(3) == "3" and format_number(0.0) == "0" and format_number(1e-5) == "1.00e-05"
    assert format_number(float("nan")) == "nan"
    assert format_metrics({"greedy_accuracy": 0.15384615384615385, "pass@4": 0.34615384615384615}) == (
        "greedy accuracy 0.154, pass@4 0.346"
    )
    nested = {"greedy": {"accuracy": 0.25, "tool_call_rate": 2 / 3}, "sampled": {"accuracy": 0.1}}
    assert format_metrics(nested) == "greedy: accuracy 0.25, tool call rate 0.667; sampled: accuracy 0.1"


def test_weight_colours_follow_sign_and_size():
    check_colour("background:rgb({}, {}, {})".format(*weight_rgb(0.5, 1.0)), 0.5)
    check_colour("background:rgb({}, {}, {})".format(*weight_rgb(-0.5, 1.0)), -0.5)
    check_colour("background:rgb({}, {}, {})".format(*weight_rgb(0.0, 1.0)), 0.0)
    small, large = weight_rgb(0.1, 1.0), weight_rgb(1.0, 1.0)
    assert sum(large) < sum(small) < 3 * 255  # larger |w|: deeper; the smallest still tinted


def test_the_report_and_the_notebook_view_draw_one_palette():
    from ludic_lab.lab import token_html

    for w, scale in ((1.0, 1.0), (-2.0, 2.0), (0.3, 1.5), (-0.01, 1.0), (0.0, 1.0), (0.0, 0.0)):
        assert weight_rgb(w, scale) == token_html.weight_rgb(w, scale), (w, scale)
    assert weight_rgb(1.0, 1.0) == token_html.POS_RGB and weight_rgb(-1.0, 1.0) == token_html.NEG_RGB
    row = weight_rgb(1.0, 1.0, 0.3)  # a row: the same hue, lighter
    assert all(c > p for c, p in zip(row, token_html.POS_RGB, strict=True)) and row[2] > row[0]


# -- the demos' parsers give the env the answer, with the rewards of the whole reply --------
def test_capital_parser_extracts_the_capital_and_keeps_the_verdict():
    parse, verify = capital_parser(), capital_verifier()
    assert parse("The capital of France is Paris.").action == "Paris"
    assert parse("  I am not sure.  ").action == "I am not sure."  # none named: the reply as it is
    assert parse("Paris or London").action == "Paris or London"  # several: the reply, which is wrong
    rows = load_capitals("all")
    for i, row in enumerate(rows):
        cap, other = row["answer"], rows[(i + 7) % len(rows)]["answer"]
        replies = [cap, f"The capital is {cap}!", f"{cap}, not {other}", f"It is {other}.", "no idea", ""]
        for alias in row.get("aliases") or ():  # other spellings, where the data lists them
            replies += [alias, f"{cap} ({alias})", f"{alias}, not {other}"]
        for reply in replies:
            action = parse(reply).action
            assert action is not None
            assert verify(action, cap) == verify(reply, cap), (reply, action, cap)


def test_final_number_parser_extracts_the_last_number_and_keeps_the_verdict():
    assert final_number_parser("347 * 29 = 10,063.").action == "10,063"
    assert final_number_parser(" no number ").action == "no number"
    for reply in ("10063", "The answer is 10063", "10063 or 5", '{"expression": "347 * 29"}', "none", ""):
        action = final_number_parser(reply).action
        assert action is not None and final_number_match(action, "10063") == final_number_match(reply, "10063")


# -- a real batch, scripted replies ----------------------------------------------------------
REPLIES = ["The capital is Paris.", "Lyon, I think.", "Paris", "Berlin or Paris"]


def capitals_source() -> RolloutBatchSource:
    """GRPO batches of the capitals task (2 questions x 4 scripted replies): mixed rewards."""
    rows = [r for r in load_capitals("all") if r["country"] in ("France", "Germany")]
    template = chatml_template()
    asked: dict[str, int] = {}

    def reply(req: Any) -> str:  # the 4 samples of a question get the 4 replies, in some order
        q = str(req.messages[-1]["content"])
        asked[q] = asked.get(q, 0) + 1
        return REPLIES[(asked[q] - 1) % 4]

    client = ScriptedChatClient(reply, chat_template=template)
    parser = capital_parser()
    engine = RolloutEngine(
        {"capitals": lambda: DatasetQAEnv(rows, verifier=capital_verifier(), system_prompt="Answer.")},
        {"agent": lambda: SingleAgentSyncProtocol(Agent(client, FullDialog(), parser))},
    )
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=16), ReturnSpec.for_training())

    def requests() -> list[RolloutRequest]:
        return [
            RolloutRequest(env=EnvSpec("capitals"), protocol=ProtocolSpec("agent"), env_seed=i, inference=spec)
            for i in range(2)
        ]

    return RolloutBatchSource(engine, requests, GroupNormalizedReturn(), request_strategy=GRPORequestStrategy(4))


async def capitals_batch() -> RolloutBatchSource:
    source = capitals_source()
    await source.next_batch()
    return source


async def test_source_keeps_the_weights_of_its_last_batch():
    source = await capitals_batch()
    assert len(source.last_rollouts) == 8
    expected = GroupNormalizedReturn().compute(source.last_rollouts)
    assert source.last_weights == expected and len(expected) == 8
    assert {w > 0 for w in expected.values()} == {True, False}  # the scripted replies differ in reward
    ahead = SampleAheadSource(capitals_source())  # async_level=1: read through as of the batch returned
    batch = await ahead.next_batch()
    while ahead.in_flight():  # the next batch is pulled: the source's own attributes are now of that one
        await asyncio.sleep(0.01)
    assert ahead.source.last_rollouts != ahead.last_rollouts
    assert ahead.last_weights == GroupNormalizedReturn().compute(ahead.last_rollouts) != {}
    assert {it.rollout_id for it in batch.items} == {r.id for r in ahead.last_rollouts}
    ahead.stop()


async def test_report_of_a_batch_shows_weights_colours_parsed_answers_and_short_numbers(tmp_path: Path):
    source = await capitals_batch()
    summary = {"held-out before": {"greedy_accuracy": 0.15384615384615385, "pass@4": 1 / 3}, "seconds": 12.345678}
    path = write_rollouts_html(
        tmp_path / "rollouts.html", source.last_rollouts, weights=source.last_weights, training_step=7,
        title="grpo: the last training batch", summary=summary, tokenizer=chatml_template(),
    )  # fmt: skip
    page = Path(path).read_text(encoding="utf-8")
    headers, rows = main_rows(page)
    assert headers[:5] == ["group", "observation", "completion", "parsed action", "target"]  # no turn column
    assert headers[-1] == "weight" and "step" not in headers
    assert len(rows) == 8
    by_id = {r.id: r for r in source.last_rollouts}
    seen_signs = set()
    for row in rows:
        w = float(row["attrs"]["data-weight"])
        seen_signs.add((w > 0) - (w < 0))
        assert row["cells"][-1].strip() not in ("", "-")  # the weight column is filled
        assert float(row["cells"][-1]) == pytest.approx(w, abs=5e-3)
        check_colour(row["attrs"]["style"], w)  # the row ...
        check_colour(row["cell_styles"][-1], w)  # ... and its weight cell
        assert f"w-{'pos' if w > 0 else 'neg' if w < 0 else 'zero'}" in row["attrs"]["class"]
        completion, parsed = row["cells"][2], row["cells"][3]
        assert parsed.strip() and parsed.strip() != completion.strip()
        assert completion.startswith(tuple(REPLIES))
    assert seen_signs == {1, -1, 0}  # France: 2 right, 2 wrong; Germany: all wrong
    # the parsed action is the capital the env judged; a reply naming several shows it was sent whole
    parsed = {row["cells"][2].split("<|im_end|>")[0]: row["cells"][3] for row in rows}
    assert parsed["The capital is Paris."] == "Paris" and parsed["Lyon, I think."] == "(the whole reply)"
    assert parsed["Berlin or Paris"] == "(the whole reply)"
    # each step's sampled tokens carry the step's weight colour
    spans = re.findall(r"<span class='act' style='([^']*)'>", page)
    assert len(spans) == 8
    # header: the training step and a legend; summary dicts as key value lists, numbers short
    assert "<b>training step 7</b>" in page and "class='legend'" in page
    legend = page[page.index("class='legend'") :].split("</div>", 1)[0]
    assert (
        f"{COLOUR_NAMES['positive']}</b>: pushed up" in legend
        and f"{COLOUR_NAMES['negative']}</b>: pushed down" in legend
    )
    assert "green" not in page.lower()  # one palette with the notebook's view, which has no green
    assert "greedy accuracy <b>0.154</b>" in page and "pass@4 <b>0.333</b>" in page and "12.3" in page
    assert not LONG_FLOAT.search(visible(page))
    assert "{" not in page[page.index("<table class='summary'>") :]  # no Python dict printed
    assert len(by_id) == 8


def _step(index: int, action: str, parsed: str | None, trace: TokenTrace | None = None, **kw: Any) -> Step:
    return Step(index=index, prev_obs=f"obs {index}", action=action, parsed_action=parsed, next_obs="again",
                reward=kw.pop("reward", 0.0), trace=trace, **kw)  # fmt: skip


def test_multi_turn_episodes_get_a_turn_column_and_parse_errors_say_why():
    r = Rollout(steps=(_step(0, "<move>A1</move>", "A1"), _step(1, "oops", None, info={"parse_error": True})))
    page = rollouts_html([r], weights={(r.id, 0): 0.5, (r.id, 1): -0.25}, training_step=3)
    headers, rows = main_rows(page)
    assert headers[1] == "turn" and [row["cells"][1] for row in rows] == ["0", "1"]
    assert rows[0]["cells"][4] == "A1" and rows[1]["cells"][4] == "parse error: again"
    check_colour(rows[0]["attrs"]["style"], 0.5)
    check_colour(rows[1]["attrs"]["style"], -0.25)
    plain = rollouts_html([r])  # no weights: no colours, no legend, the column says so
    _, rows = main_rows(plain)
    assert "class='legend'" not in plain and all(row["cells"][-1] == "-" for row in rows)
    assert all("style" not in row["attrs"] for row in rows)


def test_tool_results_in_a_completion_are_shown_as_context(tiny_tokenizer):
    tok = tiny_tokenizer
    call = tok.encode('<tool_call>{"name": "calculator"}</tool_call>', add_special_tokens=False)
    result = tok.encode(
        "<|im_end|>\n<|im_start|>tool\n10063<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    final = tok.encode("10063", add_special_tokens=False)
    ids = call + result + final
    mask = [1] * len(call) + [0] * len(result) + [1] * len(final)
    trace = TokenTrace(prompt_token_ids=(1, 2), completion_token_ids=tuple(ids), completion_logprobs=(0.0,) * len(ids),
                       completion_mask=tuple(mask))  # fmt: skip
    agent = {"tools": {"calls": 1, "ok": 1}}
    r = Rollout(steps=(_step(0, "10063", "10063", trace, reward=1.0, info={"agent": agent, "target": "10063"}),))
    page = rollouts_html([r], weights={(r.id, 0): 1.0}, tokenizer=tok)
    sampled = re.findall(r"<span class='act' style='[^']*'>(.*?)</span>", page, re.S)
    context = re.findall(r"<span class='ctx' title='[^']*'>(.*?)</span>", page, re.S)
    assert len(sampled) == 2 and "tool_call" in sampled[0] and sampled[1] == "10063"
    assert len(context) == 1 and "10063" in context[0] and "tool" in context[0]
    assert "1 tool call(s)" in page


# -- the capitals demo on the tiny model writes it so -----------------------------------------
@pytest.mark.timeout(180)
def test_capitals_demo_writes_weights_parsed_actions_and_short_numbers(tmp_path: Path, tiny_model_dir: str):
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import DemoConfig, run_demo

    out = tmp_path / "demo"
    cfg = DemoConfig(model="tiny", steps=1, questions_per_step=2, group_size=2, max_tokens=8, eval_k=2, out=str(out))
    run_sync(run_demo(cfg))
    page = (out / "rollouts.html").read_text(encoding="utf-8")
    headers, rows = main_rows(page)
    assert "turn" not in headers and len(rows) == 4
    for row in rows:
        float(row["attrs"]["data-weight"])  # every row has the weight the trainer used ...
        assert row["cells"][-1].strip() not in ("", "-")
        assert re.search(r"background:rgb", row["attrs"]["style"])  # ... and is coloured by it
        assert row["cells"][3].strip() != row["cells"][2].strip()
    assert "<b>training step 1</b>" in page and "class='legend'" in page
    numbers = [*re.findall(r"<td class='num'[^>]*>(.*?)</td>", page), page[: page.index("<table><thead>")]]
    assert not any(LONG_FLOAT.search(visible(n)) for n in numbers)  # the tiny model's replies may hold any digits
    assert "greedy accuracy" in page and "sampled accuracy" in page
    assert json.loads((out / "summary.json").read_text())["config"]["steps"] == 1


def test_docs_name_the_weight_colours_the_views_draw():
    """Prose that keys a weight's sign to a colour (``blue > 0, red < 0, white 0``) names the
    palette both views draw (COLOUR_NAMES); tests/test_views_credit_groups.py checks the notebooks'
    "pushed up / down" wording."""
    root = Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "scripts").rglob("*.md"))]
    want = {">": COLOUR_NAMES["positive"], "<": COLOUR_NAMES["negative"], "": COLOUR_NAMES["zero"]}
    found, problems = 0, []
    for page in pages:
        text = re.sub(r"\s+", " ", page.read_text(encoding="utf-8"))
        for m in re.finditer(r"\b(green|blue|red|grey|gray|white|orange) ?([<>]?) ?0\b(?![.,]\d)", text, flags=re.I):
            found += 1
            if m[1].lower() != want[m[2]]:
                problems.append(f"{page.relative_to(root)}: {m[0]!r} (the views draw {want[m[2]]})")
    assert found >= 3 and not problems, (found, problems)  # docs/demo.md keys all three
