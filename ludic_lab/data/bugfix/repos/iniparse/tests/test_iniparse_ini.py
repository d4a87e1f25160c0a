import pytest
from iniparse import ParseError, dump_ini, get_bool, parse_ini

TEXT = """
; settings
name = demo

[server]
Host = example.org
port=8080
# a comment
debug = yes

[empty]
"""


def test_parse_ini_sections_and_keys() -> None:
    assert parse_ini(TEXT) == {
        "": {"name": "demo"},
        "server": {"host": "example.org", "port": "8080", "debug": "yes"},
        "empty": {},
    }


def test_parse_ini_last_value_wins() -> None:
    assert parse_ini("[a]\nx = 1\nx = 2\n") == {"a": {"x": "2"}}


def test_parse_ini_value_may_hold_equals() -> None:
    assert parse_ini("url = a=b") == {"": {"url": "a=b"}}


def test_parse_ini_rejects_line_without_equals() -> None:
    with pytest.raises(ParseError) as err:
        parse_ini("[a]\nx = 1\njunk\n")
    assert err.value.lineno == 3


def test_parse_ini_rejects_empty_key() -> None:
    with pytest.raises(ParseError):
        parse_ini(" = 3")


def test_get_bool_reads_words() -> None:
    sections = {"s": {"a": "Yes", "b": "off"}}
    assert get_bool(sections, "s", "a") is True
    assert get_bool(sections, "s", "b") is False


def test_get_bool_default_when_missing() -> None:
    assert get_bool({}, "s", "a") is False
    assert get_bool({"s": {}}, "s", "a", default=True) is True


def test_get_bool_rejects_other_words() -> None:
    with pytest.raises(ValueError):
        get_bool({"s": {"a": "maybe"}}, "s", "a")


def test_dump_ini_puts_global_section_first() -> None:
    assert dump_ini({"b": {"k": "v"}, "": {"x": "1"}, "a": {}}) == "x = 1\n\n[a]\n\n[b]\nk = v\n"


def test_dump_ini_round_trips() -> None:
    sections = {"db": {"user": "me", "port": "5432"}}
    assert parse_ini(dump_ini(sections)) == sections
