import pytest
from numfmt import group_thousands, human_bytes, number_to_words, ordinal


def test_ordinal_first_second_third() -> None:
    assert ordinal(1) == "1st"
    assert ordinal(2) == "2nd"
    assert ordinal(3) == "3rd"
    assert ordinal(4) == "4th"


def test_ordinal_teens() -> None:
    assert ordinal(11) == "11th"
    assert ordinal(12) == "12th"
    assert ordinal(113) == "113th"


def test_ordinal_twenties() -> None:
    assert ordinal(21) == "21st"
    assert ordinal(22) == "22nd"
    assert ordinal(20) == "20th"


def test_group_thousands() -> None:
    assert group_thousands(1234567) == "1,234,567"
    assert group_thousands(100) == "100"
    assert group_thousands(1000) == "1,000"


def test_group_thousands_negative_and_separator() -> None:
    assert group_thousands(-9876543, sep=".") == "-9.876.543"


def test_human_bytes_below_a_kilobyte() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"


def test_human_bytes_units() -> None:
    assert human_bytes(1024) == "1.0 KB"
    assert human_bytes(1536) == "1.5 KB"
    assert human_bytes(5 * 1024**3) == "5.0 GB"


def test_human_bytes_rejects_negative() -> None:
    with pytest.raises(ValueError):
        human_bytes(-1)


def test_number_to_words_small() -> None:
    assert number_to_words(0) == "zero"
    assert number_to_words(13) == "thirteen"


def test_number_to_words_tens() -> None:
    assert number_to_words(40) == "forty"
    assert number_to_words(42) == "forty-two"


def test_number_to_words_hundreds() -> None:
    assert number_to_words(300) == "three hundred"
    assert number_to_words(342) == "three hundred forty-two"
    assert number_to_words(911) == "nine hundred eleven"


def test_number_to_words_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        number_to_words(1000)
