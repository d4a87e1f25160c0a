"""Roman numerals from 1 to 3999."""

NUMERALS = (
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
)
VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n: int) -> str:
    """``n`` (1 to 3999) in Roman numerals, subtractive forms included (``4 -> "IV"``)."""
    if not 0 < n < 4000:
        raise ValueError(f"{n} is out of range 1..3999")
    out = ""
    for value, letters in NUMERALS:
        while n >= value:
            out += letters
            n -= value
    return out


def is_roman(text: str) -> bool:
    """True when ``text`` is a canonical Roman numeral (``from_roman`` accepts it)."""
    try:
        from_roman(text)
    except ValueError:
        return False
    return True


def from_roman(text: str) -> int:
    """The value of the Roman numeral ``text`` (either case); raises ``ValueError`` on other
    letters or a non-canonical numeral such as ``"IIII"``."""
    text = text.upper()
    if not text or any(ch not in VALUES for ch in text):
        raise ValueError(f"not a Roman numeral: {text!r}")
    total = 0
    for i, ch in enumerate(text):
        value = VALUES[ch]
        if i + 1 < len(text) and VALUES[text[i + 1]] > value:
            total -= value
        else:
            total += value
    if to_roman(total) != text:
        raise ValueError(f"not a canonical Roman numeral: {text!r}")
    return total
