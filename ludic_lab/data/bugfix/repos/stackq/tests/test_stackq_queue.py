import pytest
from stackq.queue import RingQueue


def test_queue_is_first_in_first_out() -> None:
    q = RingQueue(3)
    q.put("a")
    q.put("b")
    assert q.get() == "a"
    assert q.get() == "b"


def test_queue_wraps_around_the_buffer() -> None:
    q = RingQueue(2)
    q.put(1)
    q.put(2)
    q.get()
    q.put(3)
    assert q.to_list() == [2, 3]


def test_queue_full_raises_overflow() -> None:
    q = RingQueue(1)
    q.put(1)
    assert q.is_full() is True
    with pytest.raises(OverflowError):
        q.put(2)


def test_queue_not_full_until_capacity() -> None:
    q = RingQueue(3)
    q.put(1)
    q.put(2)
    assert q.is_full() is False


def test_queue_get_empty_raises() -> None:
    with pytest.raises(IndexError):
        RingQueue(2).get()


def test_queue_len_and_capacity() -> None:
    q = RingQueue(4)
    q.put(1)
    q.put(2)
    assert len(q) == 2
    assert q.capacity == 4


def test_queue_to_list_front_first() -> None:
    q = RingQueue(3)
    for x in (5, 6, 7):
        q.put(x)
    assert q.to_list() == [5, 6, 7]


def test_queue_rejects_zero_capacity() -> None:
    with pytest.raises(ValueError):
        RingQueue(0)
