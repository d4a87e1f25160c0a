"""Case conversions between identifiers and titles."""


def capitalize_words(text: str) -> str:
    """Each space-separated word of ``text`` with its first letter upper-cased."""
    words = text.split(" ")
    return " ".join(word[:1].upper() + word[1:] for word in words)


def camel_to_snake(name: str) -> str:
    """``"parseHttpHeader"`` -> ``"parse_http_header"``; runs of capitals stay together."""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper():
            prev_lower = i > 0 and not name[i - 1].isupper()
            next_lower = i + 1 < len(name) and name[i + 1].islower()
            if i > 0 and (prev_lower or next_lower):
                out.append("_")
            out.append(ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def snake_to_camel(name: str, upper_first: bool = False) -> str:
    """``"parse_http_header"`` -> ``"parseHttpHeader"`` (``"ParseHttpHeader"`` with ``upper_first``)."""
    parts = [p for p in name.split("_") if p]
    if not parts:
        return ""
    head = parts[0].capitalize() if upper_first else parts[0].lower()
    return head + "".join(p.capitalize() for p in parts[1:])
