"""A first-in, first-out queue in a fixed-size ring buffer."""

from typing import Any


class RingQueue:
    """A FIFO queue of at most ``capacity`` items; ``put`` raises ``OverflowError`` when full,
    ``get`` raises ``IndexError`` when empty."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._buf: list[Any] = [None] * capacity
        self._head = 0
        self._size = 0

    @property
    def capacity(self) -> int:
        """How many items the queue can hold."""
        return len(self._buf)

    def put(self, item: Any) -> None:
        """Append ``item`` at the back."""
        if self.is_full():
            raise OverflowError("queue is full")
        tail = (self._head + self._size) % self.capacity
        self._buf[tail] = item
        self._size += 1

    def get(self) -> Any:
        """Remove and return the front item."""
        if self._size == 0:
            raise IndexError("get from an empty queue")
        item = self._buf[self._head]
        self._buf[self._head] = None
        self._head = (self._head + 1) % self.capacity
        self._size -= 1
        return item

    def is_full(self) -> bool:
        """True when no more items fit."""
        return self._size >= self.capacity

    def to_list(self) -> list[Any]:
        """The items, front first."""
        return [self._buf[(self._head + i) % self.capacity] for i in range(self._size)]

    def __len__(self) -> int:
        return self._size
