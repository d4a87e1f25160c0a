"""Ordinals, digit grouping, byte sizes and numbers in words."""

ONES = (
    "zero one two three four five six seven eight nine ten "
    "eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
UNITS = ("B", "KB", "MB", "GB", "TB")


def ordinal(n: int) -> str:
    """``1 -> "1st"``, ``2 -> "2nd"``, ``11 -> "11th"``, ``23 -> "23rd"``."""
    if 10 <= n % 100 <= 20:
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def group_thousands(n: int, sep: str = ",") -> str:
    """``n`` with ``sep`` between groups of three digits (``-1234567 -> "-1,234,567"``)."""
    digits = str(abs(n))
    groups: list[str] = []
    while len(digits) > 3:
        groups.insert(0, digits[-3:])
        digits = digits[:-3]
    groups.insert(0, digits)
    sign = "-" if n < 0 else ""
    return sign + sep.join(groups)


def human_bytes(n: int) -> str:
    """A byte count in the largest unit (powers of 1024) that keeps it at least 1, one decimal
    place above bytes: ``1536 -> "1.5 KB"``, ``999 -> "999 B"``."""
    if n < 0:
        raise ValueError("negative size")
    size = float(n)
    unit = 0
    while size >= 1024 and unit < len(UNITS) - 1:
        size /= 1024
        unit += 1
    if unit == 0:
        return f"{n} B"
    return f"{size:.1f} {UNITS[unit]}"


def number_to_words(n: int) -> str:
    """``n`` (0 to 999) in English words: ``342 -> "three hundred forty-two"``."""
    if not 0 <= n <= 999:
        raise ValueError("only 0..999")
    if n < 20:
        return ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return TENS[tens] if ones == 0 else f"{TENS[tens]}-{ONES[ones]}"
    hundreds, rest = divmod(n, 100)
    head = f"{ONES[hundreds]} hundred"
    return head if rest == 0 else f"{head} {number_to_words(rest)}"
