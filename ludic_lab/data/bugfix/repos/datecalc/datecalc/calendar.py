"""Leap years, month lengths and the day of the year."""

MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap_year(year: int) -> bool:
    """Gregorian rule: every fourth year, except centuries not divisible by 400."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year: int, month: int) -> int:
    """How many days ``month`` (1-12) of ``year`` has."""
    if not 1 <= month <= 12:
        raise ValueError(f"month {month} is not in 1..12")
    if month == 2 and is_leap_year(year):
        return 29
    return MONTH_DAYS[month - 1]


def is_valid_date(year: int, month: int, day: int) -> bool:
    """True when ``(year, month, day)`` names a real day (year 1 or later)."""
    if year < 1 or not 1 <= month <= 12:
        return False
    return 1 <= day <= days_in_month(year, month)


def day_of_year(year: int, month: int, day: int) -> int:
    """1 for January 1st, up to 365 or 366 for December 31st."""
    if not is_valid_date(year, month, day):
        raise ValueError(f"not a date: {(year, month, day)}")
    total = day
    for m in range(1, month):
        total += days_in_month(year, m)
    return total
