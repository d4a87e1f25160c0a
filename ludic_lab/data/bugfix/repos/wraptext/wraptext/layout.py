"""Laying out single lines and blocks: centring, justification, indentation."""


def center(line: str, width: int, fill: str = " ") -> str:
    """``line`` padded on both sides to ``width``; an odd leftover goes to the right."""
    if len(line) >= width:
        return line
    total = width - len(line)
    left = total // 2
    right = total - left
    return fill * left + line + fill * right


def justify(line: str, width: int) -> str:
    """``line``'s words spread to exactly ``width`` characters; the leftmost gaps get the extra
    spaces. A single word is padded on the right."""
    words = line.split()
    if len(words) < 2:
        return line.strip().ljust(width)
    gaps = len(words) - 1
    spaces = width - sum(len(w) for w in words)
    if spaces < gaps:
        raise ValueError("line does not fit")
    base, extra = divmod(spaces, gaps)
    out = ""
    for i, word in enumerate(words[:-1]):
        out += word + " " * (base + (1 if i < extra else 0))
    return out + words[-1]


def indent(text: str, prefix: str, blank_lines: bool = False) -> str:
    """``prefix`` added to each line of ``text``; blank lines only with ``blank_lines``."""
    out = []
    for line in text.split("\n"):
        if line.strip() or blank_lines:
            out.append(prefix + line)
        else:
            out.append(line)
    return "\n".join(out)
