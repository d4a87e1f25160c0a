from strkit import camel_to_snake, capitalize_words, snake_to_camel


def test_capitalize_words_upper_cases_first_letters() -> None:
    assert capitalize_words("the quick fox") == "The Quick Fox"


def test_capitalize_words_keeps_the_rest_and_spacing() -> None:
    assert capitalize_words("mcDonald  farm") == "McDonald  Farm"


def test_camel_to_snake_simple() -> None:
    assert camel_to_snake("parseHeader") == "parse_header"


def test_camel_to_snake_keeps_acronyms_together() -> None:
    assert camel_to_snake("parseHTTPHeader") == "parse_http_header"


def test_camel_to_snake_leading_capital() -> None:
    assert camel_to_snake("Name") == "name"


def test_snake_to_camel_lower_first() -> None:
    assert snake_to_camel("parse_http_header") == "parseHttpHeader"


def test_snake_to_camel_upper_first() -> None:
    assert snake_to_camel("parse_http_header", upper_first=True) == "ParseHttpHeader"


def test_snake_to_camel_skips_empty_parts() -> None:
    assert snake_to_camel("__private__name") == "privateName"
    assert snake_to_camel("___") == ""
