"""Calendar arithmetic on (year, month, day) tuples."""

from datecalc.calendar import day_of_year, days_in_month, is_leap_year, is_valid_date
from datecalc.shift import add_days, days_between, from_ordinal, to_ordinal, weekday

__all__ = [
    "add_days",
    "day_of_year",
    "days_between",
    "days_in_month",
    "from_ordinal",
    "is_leap_year",
    "is_valid_date",
    "to_ordinal",
    "weekday",
]
