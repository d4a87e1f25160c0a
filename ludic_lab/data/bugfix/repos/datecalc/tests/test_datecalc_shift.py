import pytest
from datecalc import add_days, days_between, from_ordinal, to_ordinal, weekday


def test_to_ordinal_of_known_dates() -> None:
    assert to_ordinal((1, 1, 1)) == 1
    assert to_ordinal((2000, 1, 1)) == 730120


def test_from_ordinal_inverts_to_ordinal() -> None:
    for date in [(1, 1, 1), (1999, 12, 31), (2000, 2, 29), (2024, 3, 1)]:
        assert from_ordinal(to_ordinal(date)) == date


def test_from_ordinal_rejects_zero() -> None:
    with pytest.raises(ValueError):
        from_ordinal(0)


def test_add_days_across_month_and_year() -> None:
    assert add_days((2023, 1, 31), 1) == (2023, 2, 1)
    assert add_days((2023, 12, 31), 1) == (2024, 1, 1)


def test_add_days_over_leap_day() -> None:
    assert add_days((2024, 2, 28), 1) == (2024, 2, 29)
    assert add_days((2024, 2, 28), 2) == (2024, 3, 1)


def test_add_days_backwards() -> None:
    assert add_days((2024, 3, 1), -1) == (2024, 2, 29)


def test_days_between() -> None:
    assert days_between((2023, 1, 1), (2024, 1, 1)) == 365
    assert days_between((2024, 1, 1), (2025, 1, 1)) == 366


def test_days_between_is_signed() -> None:
    assert days_between((2023, 3, 10), (2023, 3, 1)) == -9


def test_weekday_of_known_dates() -> None:
    assert weekday((2024, 1, 1)) == 0  # a Monday
    assert weekday((2000, 1, 1)) == 5  # a Saturday


def test_weekday_of_a_sunday() -> None:
    assert weekday((2023, 12, 31)) == 6
