"""INI text <-> ``{section: {key: value}}``."""

TRUE_WORDS = ("1", "yes", "true", "on")
FALSE_WORDS = ("0", "no", "false", "off")


class ParseError(ValueError):
    """A line that is neither a section, a ``key = value`` pair, a comment nor blank."""

    def __init__(self, lineno: int, line: str) -> None:
        super().__init__(f"line {lineno}: cannot parse {line!r}")
        self.lineno = lineno


def parse_ini(text: str) -> dict[str, dict[str, str]]:
    """Sections of ``text`` with their keys; keys before any section go to ``""``.

    Lines starting with ``;`` or ``#`` are comments; keys are lower-cased; values are stripped;
    a key repeated in a section keeps its last value."""
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
            sections.setdefault(current, {})
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ParseError(lineno, raw)
        sections.setdefault(current, {})[key.strip().lower()] = value.strip()
    return sections


def get_bool(sections: dict[str, dict[str, str]], section: str, key: str, default: bool = False) -> bool:
    """The value at ``section``/``key`` read as a boolean; ``default`` when it is missing."""
    value = sections.get(section, {}).get(key)
    if value is None:
        return default
    word = value.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{section}.{key}: {value!r} is not a boolean")


def dump_ini(sections: dict[str, dict[str, str]]) -> str:
    """INI text for ``sections`` (the ``""`` section first, without a header), one blank line
    between sections."""
    blocks = []
    for name in sorted(sections, key=lambda s: (s != "", s)):
        lines = [] if name == "" else [f"[{name}]"]
        lines += [f"{key} = {value}" for key, value in sections[name].items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
