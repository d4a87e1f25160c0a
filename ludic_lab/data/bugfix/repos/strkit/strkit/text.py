"""Text helpers: slugs, palindromes, vowels, truncation."""

VOWELS = "aeiou"


def slugify(text: str) -> str:
    """Lower-case ``text`` and join its runs of letters and digits with single dashes."""
    parts: list[str] = []
    current = ""
    for ch in text.lower():
        if ch.isalnum():
            current += ch
        elif current:
            parts.append(current)
            current = ""
    if current:
        parts.append(current)
    return "-".join(parts)


def is_palindrome(text: str) -> bool:
    """True when ``text`` reads the same backwards, ignoring case and non-alphanumerics."""
    chars = [ch.lower() for ch in text if ch.isalnum()]
    i, j = 0, len(chars) - 1
    while i < j:
        if chars[i] != chars[j]:
            return False
        i += 1
        j -= 1
    return True


def count_vowels(text: str) -> int:
    """How many of the characters of ``text`` are vowels (a, e, i, o, u, either case)."""
    count = 0
    for ch in text:
        if ch.lower() in VOWELS:
            count += 1
    return count


def truncate(text: str, width: int, suffix: str = "...") -> str:
    """``text`` cut to at most ``width`` characters, ending with ``suffix`` when cut."""
    if len(text) <= width:
        return text
    if width <= len(suffix):
        return suffix[:width]
    return text[: width - len(suffix)] + suffix


def reverse_words(text: str) -> str:
    """The words of ``text`` in reverse order, separated by single spaces."""
    words = text.split()
    out = []
    for i in range(len(words) - 1, -1, -1):
        out.append(words[i])
    return " ".join(out)


def common_prefix(words: list[str]) -> str:
    """The longest string every word of ``words`` starts with (empty for no words)."""
    if not words:
        return ""
    prefix = words[0]
    for word in words[1:]:
        n = 0
        while n < len(prefix) and n < len(word) and prefix[n] == word[n]:
            n += 1
        prefix = prefix[:n]
    return prefix
