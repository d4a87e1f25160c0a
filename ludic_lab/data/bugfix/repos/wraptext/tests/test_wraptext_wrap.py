import pytest
from wraptext import fill, shorten, wrap


def test_wrap_greedy_lines() -> None:
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_fit() -> None:
    assert wrap("ab cd", 5) == ["ab cd"]
    assert wrap("ab cd", 4) == ["ab", "cd"]


def test_wrap_long_word_gets_own_line() -> None:
    assert wrap("a extraordinary b", 5) == ["a", "extraordinary", "b"]


def test_wrap_empty_and_bad_width() -> None:
    assert wrap("   ", 5) == []
    with pytest.raises(ValueError):
        wrap("a", 0)


def test_fill_joins_lines() -> None:
    assert fill("one two three", 7) == "one two\nthree"


def test_fill_single_line() -> None:
    assert fill("short", 20) == "short"


def test_shorten_keeps_text_that_fits() -> None:
    assert shorten("Hello   world", 11) == "Hello world"


def test_shorten_drops_last_words() -> None:
    assert shorten("Hello world, how are you", 18) == "Hello world, [...]"


def test_shorten_placeholder_only() -> None:
    assert shorten("Supercalifragilistic word", 8) == "[...]"
