"""A binary min-heap stored in a list."""

from typing import Any


class MinHeap:
    """The smallest item comes out first; ``pop`` raises ``IndexError`` when empty."""

    def __init__(self) -> None:
        self._items: list[Any] = []

    def push(self, item: Any) -> None:
        """Add ``item``, moving it up until its parent is not larger."""
        self._items.append(item)
        i = len(self._items) - 1
        while i > 0:
            parent = (i - 1) // 2
            if self._items[parent] <= self._items[i]:
                break
            self._items[parent], self._items[i] = self._items[i], self._items[parent]
            i = parent

    def pop(self) -> Any:
        """Remove and return the smallest item."""
        if not self._items:
            raise IndexError("pop from an empty heap")
        last = self._items.pop()
        if not self._items:
            return last
        top = self._items[0]
        self._items[0] = last
        self._sift_down(0)
        return top

    def _sift_down(self, i: int) -> None:
        n = len(self._items)
        while True:
            smallest = i
            for child in (2 * i + 1, 2 * i + 2):
                if child < n and self._items[child] < self._items[smallest]:
                    smallest = child
            if smallest == i:
                return
            self._items[i], self._items[smallest] = self._items[smallest], self._items[i]
            i = smallest

    def __len__(self) -> int:
        return len(self._items)


def heapsort(items: list[Any]) -> list[Any]:
    """A sorted copy of ``items`` (ascending), through a ``MinHeap``."""
    heap = MinHeap()
    for item in items:
        heap.push(item)
    return [heap.pop() for _ in range(len(items))]
