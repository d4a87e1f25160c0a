import pytest
from datecalc import day_of_year, days_in_month, is_leap_year, is_valid_date


def test_leap_years_every_fourth_year() -> None:
    assert is_leap_year(2024) is True
    assert is_leap_year(2023) is False


def test_leap_years_centuries() -> None:
    assert is_leap_year(1900) is False
    assert is_leap_year(2000) is True


def test_days_in_month_common() -> None:
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 12) == 31


def test_days_in_february() -> None:
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29


def test_days_in_month_rejects_bad_month() -> None:
    with pytest.raises(ValueError):
        days_in_month(2023, 13)
    with pytest.raises(ValueError):
        days_in_month(2023, 0)


def test_is_valid_date_accepts_real_days() -> None:
    assert is_valid_date(2024, 2, 29) is True
    assert is_valid_date(2023, 12, 31) is True


def test_is_valid_date_rejects_impossible_days() -> None:
    assert is_valid_date(2023, 2, 29) is False
    assert is_valid_date(2023, 4, 31) is False
    assert is_valid_date(2023, 1, 0) is False
    assert is_valid_date(0, 1, 1) is False


def test_day_of_year_start_and_end() -> None:
    assert day_of_year(2023, 1, 1) == 1
    assert day_of_year(2023, 12, 31) == 365
    assert day_of_year(2024, 12, 31) == 366


def test_day_of_year_after_february() -> None:
    assert day_of_year(2023, 3, 1) == 60
    assert day_of_year(2024, 3, 1) == 61


def test_day_of_year_rejects_invalid_date() -> None:
    with pytest.raises(ValueError):
        day_of_year(2023, 2, 30)
