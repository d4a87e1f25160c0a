"""Parsers: extraction, format rewards, feedback, composition, and garbage never raising."""

from __future__ import annotations

import functools

import pytest

from ludic_lab.parsers import (
    ParseResult,
    boxed_parser,
    compose_parsers,
    cot_prefix_parser,
    extract_last_boxed_content,
    identity_parser,
    think_prefix_parser,
    xml_parser,
    xml_tag_parser,
)

GARBAGE = [
    "",
    " ",
    "\n\t",
    "<",
    ">",
    "</",
    "<answer",
    "<answer>",
    "</answer>",
    "<answer></answer>",
    "<answer>   </answer>",
    "</answer><answer>",
    "<think>",
    "</think>",
    "<think></think>",
    "\\boxed",
    "\\boxed{",
    "\\boxed{}",
    "\\boxed{{{{",
    "}}}}\\boxed{",
    "\\boxed{\\}",
    "\x00\x01\x02\xff",
    "\u00e9\u00e8 \U0001f600 \u4e2d\u6587 \u0130\u0130\u0130",
    "<ANSWER>\u0130</answer",
    "<answer><answer><answer>",
    "\\boxed{" * 5000,
    "<answer>" * 5000 + "</answer>",
    "x" * 1_000_000,
    "<think>" + "y" * 200_000,
]

ALL_PARSERS = {
    "xml": xml_tag_parser("answer"),
    "xml_exact": xml_tag_parser("answer", exact=True),
    "think": think_prefix_parser(),
    "boxed": boxed_parser(),
    "composed": compose_parsers(think_prefix_parser(), xml_tag_parser("answer")),
    "prefix_kind": xml_parser("reason", kind="remainder_after_prefix"),
}


@pytest.mark.parametrize("name", sorted(ALL_PARSERS))
@pytest.mark.parametrize("raw", GARBAGE, ids=lambda s: repr(s[:12]) + f"/{len(s)}")
def test_garbage_never_raises_and_is_well_typed(name: str, raw: str) -> None:
    res = ALL_PARSERS[name](raw)
    assert isinstance(res, ParseResult)
    if res.action is None:
        assert res.reward < 0
        assert isinstance(res.obs, str) and 0 < len(res.obs) < 300, "failure feedback must be short and present"
    else:
        assert isinstance(res.action, str) and res.action == res.action.strip() and res.action


@pytest.mark.parametrize("raw", [None, 123, b"bytes"])
def test_non_string_input_does_not_raise(raw: object) -> None:
    for p in ALL_PARSERS.values():
        assert isinstance(p(raw), ParseResult)  # type: ignore[arg-type]


# -- xml_tag_parser ----------------------------------------------------------------------


def test_xml_extracts_inner_text_stripped() -> None:
    p = xml_tag_parser("answer", success_reward=0.25)
    assert p("The answer is <answer>  42 </answer>.") == ParseResult("42", 0.25, None)


def test_xml_takes_last_block_and_innermost_of_nested() -> None:
    p = xml_tag_parser("answer")
    assert p("<answer>1</answer> wait, no: <answer>2</answer>").action == "2"
    assert p("<answer><answer>5</answer></answer>").action == "5"
    assert p("<answer>multi\nline</answer>").action == "multi\nline"
    assert p("<answer>1</answer> then an unclosed <answer>2").action == "1"
    assert p("<answer>a <answer>b</answer>").action == "b"


def test_xml_tag_case_insensitive_and_content_kept_verbatim() -> None:
    assert xml_tag_parser("move")("<MOVE>b2</Move>").action == "b2"


def test_xml_failure_messages_name_the_expected_format() -> None:
    p = xml_tag_parser("answer", error_reward=-0.5)
    missing = p("42")
    assert missing.action is None and missing.reward == -0.5 and "<answer>...</answer>" in missing.obs
    unclosed = p("<answer>42")
    assert unclosed.action is None and "never closed" in unclosed.obs
    empty = p("<answer> </answer>")
    assert empty.action is None and "empty" in empty.obs
    stray = p("</answer>42<answer>")
    assert stray.action is None


def test_xml_other_tags_do_not_count() -> None:
    p = xml_tag_parser("answer")
    assert p("<answers>4</answers>").action is None
    assert p("<answer >4</answer>").action is None


def test_xml_exact_requires_only_the_block() -> None:
    p = xml_tag_parser("move", exact=True)
    assert p("  <move>A1</move>\n").action == "A1"
    assert p("I play <move>A1</move>").action is None
    assert p("<move>A1</move> because").action is None
    assert p("<move>A1</move><move>B2</move>").action is None
    res = p("<move>A1</move>!")
    assert res.action is None and "exactly one <move>...</move>" in res.obs


def test_xml_parser_alias_and_bad_factory_args() -> None:
    assert xml_parser("answer")("<answer>x</answer>").action == "x"
    with pytest.raises(ValueError, match="tag"):
        xml_tag_parser("")
    with pytest.raises(ValueError, match="tag"):
        xml_tag_parser("a b")
    with pytest.raises(ValueError, match="kind"):
        xml_parser("answer", kind="outer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exact"):
        xml_parser("think", kind="remainder_after_prefix", exact=True)


# -- think_prefix_parser ------------------------------------------------------------------


def test_think_prefix_returns_remainder() -> None:
    p = think_prefix_parser(success_reward=0.1)
    res = p("  <think>2+2 is 4</think>\n <answer>4</answer> ")
    assert res == ParseResult("<answer>4</answer>", 0.1, None)


@pytest.mark.parametrize(
    "raw,fragment",
    [
        ("no think here", "start your reply with <think>"),
        ("answer first <think>x</think> 4", "start your reply with <think>"),
        ("<think>never closed 4", "never closed"),
        ("<think>all thought</think>   ", "nothing after </think>"),
    ],
)
def test_think_prefix_failures(raw: str, fragment: str) -> None:
    res = think_prefix_parser(raw)
    assert res.action is None and res.reward == -1.0 and fragment in res.obs


def test_think_prefix_is_dual_use_like_ludic() -> None:
    text = "<think>t</think>B2"
    assert think_prefix_parser(text) == think_prefix_parser()(text)
    partial = functools.partial(think_prefix_parser, success_reward=0.5, error_reward=-2.0)
    assert partial(text) == ParseResult("B2", 0.5, None)
    assert partial("B2").reward == -2.0
    assert cot_prefix_parser is think_prefix_parser


# -- boxed_parser --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("so \\boxed{42}", "42"),
        ("\\boxed{1} then \\boxed{ 2 }", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed {7}", "7"),
        ("\\boxed{a \\{ b}", "a \\{ b"),
        ("\\boxed{3} and a broken \\boxed{4", "3"),
        ("\\boxed{{nested}{twice}}", "{nested}{twice}"),
    ],
)
def test_boxed_extraction(raw: str, expected: str) -> None:
    assert boxed_parser(raw).action == expected
    assert boxed_parser()(raw).action == expected


def test_boxed_failures_and_helper() -> None:
    assert boxed_parser("42").obs is not None and "\\boxed{" in boxed_parser("42").obs
    assert "empty" in boxed_parser("\\boxed{  }").obs
    assert boxed_parser("\\boxed{4", error_reward=-3.0).reward == -3.0
    assert extract_last_boxed_content("nothing") is None
    assert extract_last_boxed_content("\\boxed{x}") == "x"


# -- compose_parsers -------------------------------------------------------------------------


def test_compose_pipeline_sums_rewards() -> None:
    p = compose_parsers(
        think_prefix_parser(success_reward=0.1),
        xml_tag_parser("answer", success_reward=0.2),
        boxed_parser(success_reward=0.3),
    )
    res = p("<think>hmm</think><answer>\\boxed{7}</answer>")
    assert res.action == "7" and res.reward == pytest.approx(0.6) and res.obs is None


def test_compose_stops_at_first_failure_with_accumulated_reward() -> None:
    calls: list[str] = []

    def spy(text: str) -> ParseResult:
        calls.append(text)
        return ParseResult(text, 5.0)

    p = compose_parsers(think_prefix_parser(success_reward=0.1), xml_tag_parser("answer", error_reward=-1.0), spy)
    res = p("<think>x</think> 42 without tags")
    assert res.action is None
    assert res.reward == pytest.approx(-0.9)
    assert "<answer>...</answer>" in res.obs
    assert calls == [], "parsers after a failure must not run"
    first = p("no think")
    assert first.reward == -1.0 and "<think>" in first.obs


def test_compose_empty_is_identity_and_rejects_non_callables() -> None:
    assert compose_parsers()("  hi ") == ParseResult("  hi ", 0.0, None)
    with pytest.raises(TypeError, match="parsers"):
        compose_parsers("answer")  # type: ignore[arg-type]


def test_identity_parser_unchanged() -> None:
    assert identity_parser("  B2 \n") == ParseResult("B2", 0.0, None)
