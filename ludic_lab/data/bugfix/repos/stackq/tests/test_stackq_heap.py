import pytest
from stackq.heap import MinHeap, heapsort


def test_heap_pops_smallest_first() -> None:
    h = MinHeap()
    for x in (5, 1, 4):
        h.push(x)
    assert h.pop() == 1
    assert h.pop() == 4


def test_heap_pop_empty_raises() -> None:
    with pytest.raises(IndexError):
        MinHeap().pop()


def test_heap_len_tracks_pushes_and_pops() -> None:
    h = MinHeap()
    h.push(2)
    h.push(1)
    h.pop()
    assert len(h) == 1


def test_heapsort_sorts_numbers() -> None:
    assert heapsort([9, 2, 7, 4, 5, 1, 8]) == [1, 2, 4, 5, 7, 8, 9]


def test_heapsort_keeps_duplicates() -> None:
    assert heapsort([3, 1, 3, 2, 1]) == [1, 1, 2, 3, 3]


def test_heapsort_of_empty_and_single() -> None:
    assert heapsort([]) == []
    assert heapsort(["x"]) == ["x"]
