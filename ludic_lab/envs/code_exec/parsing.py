"""``code_block_parser``: the program in a completion, from its last fenced code block.

Models write prose around code; the last ```` ```python ... ``` ```` (or plain ```` ``` ````)
block is the answer. ``allow_bare=True`` accepts a completion with no fence when it looks
like a program (small models often skip the fence), and one that starts with code and
closes a fence it never opened (code, then a lone ```` ``` ````: the model took the opening
fence as said). Like every parser here it never raises
on model text: a failure is a :class:`~ludic_lab.parsers.ParseResult` whose ``obs`` says
what format is expected. Nothing is compiled or run here — that happens in the sandbox.
"""

from __future__ import annotations

import re

from ludic_lab.parsers import Parser, ParseResult

_FENCE_LINE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[ \t]*$", re.MULTILINE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_LANGS = {"", "python", "py", "python3"}
_LOOKS_LIKE_CODE = re.compile(
    r"^\s*(def |class |import |from \w+ import |print\(|for |while |if |\w+\s*=)", re.MULTILINE
)
FORMAT_HINT = "Format error: put your Python program in a fenced block: ```python\\n...\\n```"


def extract_code(text: object, *, allow_bare: bool = False) -> str | None:
    """The last Python (or unlabelled) fenced block's body; an unclosed final fence counts.
    With ``allow_bare``, an unfenced completion that looks like code is returned whole."""
    if not isinstance(text, str):
        return None
    if allow_bare and _opens_with_code(text):
        text = "```python\n" + text
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in _LANGS and body.strip()]
    if blocks:
        return blocks[-1].strip("\n")
    if allow_bare and "```" not in text and _LOOKS_LIKE_CODE.search(text):
        return text.strip("\n")
    return None


def _opens_with_code(text: str) -> bool:
    """Code, then a bare fence line closing a block that was never opened (an odd number of
    fence lines, the first without a language)."""
    fences = list(_FENCE_LINE.finditer(text))
    if len(fences) % 2 == 0 or fences[0].group(1):
        return False
    head = text[: fences[0].start()]
    return "```" not in head and bool(_LOOKS_LIKE_CODE.search(head))


def code_block_parser(
    *, allow_bare: bool = True, success_reward: float = 0.0, error_reward: float = -0.1, max_chars: int = 20_000
) -> Parser:
    """A parser returning the program as the action; ``error_reward`` when there is none or
    it is longer than ``max_chars``."""

    def parse(raw: str) -> ParseResult:
        code = extract_code(raw, allow_bare=allow_bare)
        if code is None:
            return ParseResult(action=None, reward=float(error_reward), obs=FORMAT_HINT)
        if len(code) > max_chars:
            return ParseResult(
                action=None,
                reward=float(error_reward),
                obs=f"Format error: the program is longer than {max_chars} characters; write a shorter one.",
            )
        return ParseResult(action=code, reward=float(success_reward), obs=None)

    parse.__name__ = "code_block_parser"
    return parse
