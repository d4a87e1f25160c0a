import pytest
from wraptext import center, indent, justify


def test_center_even_padding() -> None:
    assert center("ab", 6) == "  ab  "


def test_center_odd_padding_goes_right() -> None:
    assert center("ab", 5, "*") == "*ab**"


def test_center_line_too_long() -> None:
    assert center("abcdef", 3) == "abcdef"


def test_justify_spreads_spaces() -> None:
    assert justify("a b c", 9) == "a   b   c"


def test_justify_extra_spaces_go_left() -> None:
    assert justify("aa bb cc dd", 13) == "aa  bb  cc dd"


def test_justify_single_word() -> None:
    assert justify("word", 6) == "word  "


def test_justify_rejects_too_narrow() -> None:
    with pytest.raises(ValueError):
        justify("aa bb cc", 7)


def test_indent_skips_blank_lines() -> None:
    assert indent("a\n\nb", "> ") == "> a\n\n> b"


def test_indent_blank_lines_too() -> None:
    assert indent("a\n\nb", "> ", blank_lines=True) == "> a\n> \n> b"
