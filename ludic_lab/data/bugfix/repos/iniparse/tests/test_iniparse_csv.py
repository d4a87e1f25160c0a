import pytest
from iniparse import join_csv_line, split_csv_line


def test_split_plain_fields() -> None:
    assert split_csv_line("a,b,c") == ["a", "b", "c"]


def test_split_keeps_empty_fields() -> None:
    assert split_csv_line(",x,") == ["", "x", ""]


def test_split_quoted_field_with_separator() -> None:
    assert split_csv_line('1,"Smith, John",3') == ["1", "Smith, John", "3"]


def test_split_doubled_quote_inside_quotes() -> None:
    assert split_csv_line('"say ""hi""",x') == ['say "hi"', "x"]


def test_split_other_separator() -> None:
    assert split_csv_line("a;b,c", sep=";") == ["a", "b,c"]


def test_split_unterminated_quote_raises() -> None:
    with pytest.raises(ValueError):
        split_csv_line('a,"b')


def test_join_plain_fields() -> None:
    assert join_csv_line(["a", "b"]) == "a,b"


def test_join_quotes_when_needed() -> None:
    assert join_csv_line(["a,b", 'q"', " pad"]) == '"a,b","q"""," pad"'


def test_join_then_split_round_trips() -> None:
    fields = ["x", "y, z", 'he said "no"', ""]
    assert split_csv_line(join_csv_line(fields)) == fields
