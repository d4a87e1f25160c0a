"""Half-open intervals and sets of them."""

from intervals.interval import Interval
from intervals.ops import covered_length, gaps, is_disjoint, merge, subtract

__all__ = ["Interval", "covered_length", "gaps", "is_disjoint", "merge", "subtract"]
