"""A last-in, first-out stack over a list."""

from typing import Any


class Stack:
    """A LIFO stack; ``pop`` and ``peek`` raise ``IndexError`` when it is empty."""

    def __init__(self) -> None:
        self._items: list[Any] = []

    def push(self, item: Any) -> None:
        """Put ``item`` on top."""
        self._items.append(item)

    def pop(self) -> Any:
        """Remove and return the top item."""
        if not self._items:
            raise IndexError("pop from an empty stack")
        return self._items.pop()

    def peek(self) -> Any:
        """The top item, left in place."""
        if len(self._items) == 0:
            raise IndexError("peek at an empty stack")
        return self._items[-1]

    def is_empty(self) -> bool:
        """True when the stack holds nothing."""
        return len(self._items) == 0

    def __len__(self) -> int:
        return len(self._items)


def balanced(text: str) -> bool:
    """True when the brackets ``()[]{}`` of ``text`` are balanced and properly nested."""
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = Stack()
    for ch in text:
        if ch in "([{":
            stack.push(ch)
        elif ch in pairs:
            if stack.is_empty() or stack.pop() != pairs[ch]:
                return False
    return stack.is_empty()
