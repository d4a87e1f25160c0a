"""Day counts: ordinals, adding days, the distance between dates, weekdays."""

from datecalc.calendar import day_of_year, days_in_month, is_leap_year

Date = tuple[int, int, int]


def _days_before_year(year: int) -> int:
    y = year - 1
    return y * 365 + y // 4 - y // 100 + y // 400


def to_ordinal(date: Date) -> int:
    """Days since 0001-01-01, which is ordinal 1."""
    year, month, day = date
    return _days_before_year(year) + day_of_year(year, month, day)


def from_ordinal(n: int) -> Date:
    """The date whose ordinal is ``n`` (the inverse of ``to_ordinal``)."""
    if n < 1:
        raise ValueError("ordinals start at 1")
    year = 1
    while True:
        length = 366 if is_leap_year(year) else 365
        if n <= length:
            break
        n -= length
        year += 1
    month = 1
    while n > days_in_month(year, month):
        n -= days_in_month(year, month)
        month += 1
    return (year, month, n)


def add_days(date: Date, days: int) -> Date:
    """The date ``days`` after ``date`` (before it when negative)."""
    return from_ordinal(to_ordinal(date) + days)


def days_between(start: Date, end: Date) -> int:
    """How many days from ``start`` to ``end`` (negative when ``end`` is earlier)."""
    return to_ordinal(end) - to_ordinal(start)


def weekday(date: Date) -> int:
    """0 for Monday up to 6 for Sunday."""
    return (to_ordinal(date) + 6) % 7
