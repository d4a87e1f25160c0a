"""Greedy word wrapping."""


def wrap(text: str, width: int) -> list[str]:
    """The words of ``text`` in lines of at most ``width`` characters, greedily; a word longer
    than ``width`` gets a line of its own."""
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    line = ""
    for word in text.split():
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line = line + " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines


def fill(text: str, width: int) -> str:
    """``wrap``'s lines joined by newlines."""
    return "\n".join(wrap(text, width))


def shorten(text: str, width: int, placeholder: str = " [...]") -> str:
    """``text`` with spaces collapsed, its last words dropped and ``placeholder`` added until it
    fits in ``width``."""
    words = text.split()
    full = " ".join(words)
    if len(full) <= width:
        return full
    kept: list[str] = []
    for word in words:
        candidate = " ".join([*kept, word])
        if len(candidate) + len(placeholder) > width:
            break
        kept.append(word)
    return " ".join(kept) + placeholder if kept else placeholder.strip()
