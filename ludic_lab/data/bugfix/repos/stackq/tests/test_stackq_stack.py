import pytest
from stackq.stack import Stack, balanced


def test_stack_pops_last_pushed_first() -> None:
    s = Stack()
    s.push(1)
    s.push(2)
    assert s.pop() == 2
    assert s.pop() == 1


def test_stack_pop_empty_raises() -> None:
    with pytest.raises(IndexError):
        Stack().pop()


def test_stack_peek_leaves_item() -> None:
    s = Stack()
    s.push("a")
    s.push("b")
    assert s.peek() == "b"
    assert len(s) == 2


def test_stack_peek_empty_raises() -> None:
    with pytest.raises(IndexError):
        Stack().peek()


def test_stack_is_empty() -> None:
    s = Stack()
    assert s.is_empty() is True
    s.push(0)
    assert s.is_empty() is False


def test_balanced_accepts_nested_brackets() -> None:
    assert balanced("{[()()]}") is True
    assert balanced("f(x[1]) + {}") is True


def test_balanced_rejects_wrong_nesting() -> None:
    assert balanced("([)]") is False


def test_balanced_rejects_unclosed_and_unopened() -> None:
    assert balanced("((") is False
    assert balanced("())") is False
