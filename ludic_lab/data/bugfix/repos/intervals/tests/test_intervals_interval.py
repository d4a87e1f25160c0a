import pytest
from intervals import Interval


def test_interval_rejects_end_before_start() -> None:
    with pytest.raises(ValueError):
        Interval(5, 3)


def test_interval_length() -> None:
    assert Interval(2, 7).length() == 5
    assert Interval(4, 4).length() == 0


def test_interval_is_empty() -> None:
    assert Interval(4, 4).is_empty() is True
    assert Interval(4, 5).is_empty() is False


def test_interval_contains_start_not_end() -> None:
    assert Interval(1, 3).contains(1) is True
    assert Interval(1, 3).contains(3) is False


def test_interval_contains_inside_and_outside() -> None:
    assert Interval(1, 5).contains(4) is True
    assert Interval(1, 5).contains(0) is False


def test_interval_overlaps() -> None:
    assert Interval(0, 5).overlaps(Interval(4, 9)) is True
    assert Interval(4, 9).overlaps(Interval(0, 5)) is True


def test_interval_touching_intervals_do_not_overlap() -> None:
    assert Interval(0, 5).overlaps(Interval(5, 9)) is False
    assert Interval(5, 9).overlaps(Interval(0, 5)) is False


def test_interval_covers_inner_interval() -> None:
    assert Interval(0, 10).covers(Interval(2, 10)) is True
    assert Interval(0, 10).covers(Interval(0, 10)) is True


def test_interval_does_not_cover_sticking_out() -> None:
    assert Interval(0, 10).covers(Interval(5, 11)) is False
    assert Interval(3, 10).covers(Interval(2, 4)) is False


def test_interval_covers_empty_interval_anywhere() -> None:
    assert Interval(0, 1).covers(Interval(7, 7)) is True


def test_interval_intersection() -> None:
    assert Interval(0, 5).intersection(Interval(3, 10)) == Interval(3, 5)


def test_interval_intersection_of_disjoint_is_none() -> None:
    assert Interval(0, 3).intersection(Interval(3, 6)) is None


def test_interval_shift() -> None:
    assert Interval(1, 4).shift(10) == Interval(11, 14)
    assert Interval(1, 4).shift(-1) == Interval(0, 3)
