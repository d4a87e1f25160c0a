from intervals import Interval, covered_length, gaps, is_disjoint, merge, subtract


def test_merge_joins_overlapping_and_touching() -> None:
    assert merge([Interval(5, 8), Interval(0, 3), Interval(3, 4), Interval(7, 10)]) == [
        Interval(0, 4),
        Interval(5, 10),
    ]


def test_merge_keeps_disjoint_and_drops_empty() -> None:
    assert merge([Interval(6, 7), Interval(2, 2), Interval(0, 1)]) == [Interval(0, 1), Interval(6, 7)]


def test_merge_nested_interval() -> None:
    assert merge([Interval(0, 10), Interval(2, 3)]) == [Interval(0, 10)]


def test_is_disjoint_with_touching_intervals() -> None:
    assert is_disjoint([Interval(5, 7), Interval(0, 3), Interval(3, 5)]) is True


def test_is_disjoint_finds_an_overlap() -> None:
    assert is_disjoint([Interval(8, 9), Interval(0, 4), Interval(3, 6)]) is False


def test_is_disjoint_of_one_or_none() -> None:
    assert is_disjoint([Interval(0, 4)]) is True
    assert is_disjoint([]) is True


def test_covered_length_counts_overlap_once() -> None:
    assert covered_length([Interval(0, 4), Interval(2, 6), Interval(10, 11)]) == 7


def test_covered_length_of_nothing() -> None:
    assert covered_length([]) == 0


def test_gaps_between_intervals() -> None:
    assert gaps([Interval(0, 2), Interval(5, 6), Interval(8, 9)]) == [Interval(2, 5), Interval(6, 8)]


def test_gaps_of_one_interval() -> None:
    assert gaps([Interval(0, 2)]) == []


def test_subtract_punches_holes() -> None:
    assert subtract(Interval(0, 10), [Interval(2, 4), Interval(6, 7)]) == [
        Interval(0, 2),
        Interval(4, 6),
        Interval(7, 10),
    ]


def test_subtract_hole_over_the_edges() -> None:
    assert subtract(Interval(5, 10), [Interval(0, 6), Interval(9, 20)]) == [Interval(6, 9)]


def test_subtract_ignores_holes_outside() -> None:
    assert subtract(Interval(5, 10), [Interval(0, 5), Interval(10, 12)]) == [Interval(5, 10)]


def test_subtract_everything() -> None:
    assert subtract(Interval(1, 3), [Interval(0, 5)]) == []
