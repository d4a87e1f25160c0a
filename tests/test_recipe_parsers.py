"""The examples' lenient reply readers: Tic-Tac-Toe moves and math answers."""

from __future__ import annotations

import pytest

from ludic_lab.recipes.math import answer_parser
from ludic_lab.recipes.tic_tac_toe import move_parser


@pytest.mark.parametrize(
    "text,action",
    [
        ("<answer>42</answer>", "42"),
        ("so 3 times 8 equals 24.\n\nThe answer is 24.", "24"),
        ("Ben had 10 coins, 10 - 4 = 6 coins left. The answer is 6", "6"),
        ("It costs 1,250 dollars.", "1250"),
        ("The temperature fell to -3.5 degrees", "-3.5"),
        ("<answer>7</answer> but maybe 9", "7"),  # the tags win
        ("So 8-3 is 5, so 8-3", "3"),  # a minus between numbers is not a sign
    ],
)
def test_lenient_answers(text: str, action: str) -> None:
    r = answer_parser("lenient")(text)
    assert (r.action, r.reward) == (action, 0.0)


def test_answers_without_a_number_and_strict_tags() -> None:
    r = answer_parser("lenient")("I do not know.")
    assert r.action is None and r.reward == -1.0 and r.obs
    assert answer_parser("tags")("The answer is 24.").action is None
    assert answer_parser("tags")("<answer>24</answer>").action == "24"
    with pytest.raises(ValueError, match="answer_format"):
        answer_parser("loose")  # type: ignore[arg-type]


def test_lenient_moves() -> None:
    assert move_parser("lenient")("I play b2 now, then A1").action == "B2"
    assert move_parser("lenient")("<move>C3</move>").action == "C3"
    assert move_parser("lenient")("Legal moves are many").action is None
    assert move_parser("tags")("B2").action is None
