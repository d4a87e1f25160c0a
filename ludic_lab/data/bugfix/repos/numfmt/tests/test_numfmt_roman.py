import pytest
from numfmt import from_roman, is_roman, to_roman


def test_to_roman_simple() -> None:
    assert to_roman(3) == "III"
    assert to_roman(8) == "VIII"


def test_to_roman_subtractive() -> None:
    assert to_roman(4) == "IV"
    assert to_roman(94) == "XCIV"
    assert to_roman(1994) == "MCMXCIV"


def test_to_roman_bounds() -> None:
    assert to_roman(1) == "I"
    assert to_roman(3999) == "MMMCMXCIX"


def test_to_roman_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        to_roman(0)
    with pytest.raises(ValueError):
        to_roman(4000)


def test_from_roman_values() -> None:
    assert from_roman("XIV") == 14
    assert from_roman("MCMXCIV") == 1994


def test_from_roman_lower_case() -> None:
    assert from_roman("xl") == 40


def test_from_roman_rejects_bad_letters() -> None:
    with pytest.raises(ValueError):
        from_roman("XIZ")
    with pytest.raises(ValueError):
        from_roman("")


def test_from_roman_rejects_non_canonical() -> None:
    with pytest.raises(ValueError):
        from_roman("IIII")


def test_is_roman_accepts_numerals() -> None:
    assert is_roman("MMXXIV") is True
    assert is_roman("iv") is True


def test_is_roman_rejects_other_text() -> None:
    assert is_roman("IIII") is False
    assert is_roman("hello") is False
