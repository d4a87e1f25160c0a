"""Config dataclasses -> command-line interfaces.

Every component is configured by a dataclass; the CLI is derived from it, so a flag always
means the field of the same name (``max_tokens`` -> ``--max-tokens``). Supported field
types: bool, int, float, str, Optional of those, Literal choices, and tuples of scalars.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal, TypeVar, get_args, get_origin

C = TypeVar("C")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType):  # Optional[X] and X | None
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _parse_bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "y", "on"):
        return True
    if v in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {s!r}")


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, *, prefix: str = "") -> None:
    """Add one ``--flag`` per field of dataclass ``cls`` (defaults and help from the class).

    A field without a default becomes a required flag.
    """
    hints = typing.get_type_hints(cls)
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):  # a subclass that changes defaults keeps its bases' help
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        tp, _ = _unwrap_optional(hints[f.name])
        flag = "--" + prefix + f.name.replace("_", "-")
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        kw: dict[str, Any] = {"dest": prefix.replace("-", "_") + f.name, "default": default}
        help_text = docs.get(f.name, "")
        kw["help"] = f"{help_text} (default: {default!r})".strip()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kw["required"] = True  # a field without a default is a required flag, never a silent None
            kw["help"] = f"{help_text} (required)".strip()
        if get_origin(tp) is Literal:
            kw["choices"] = list(get_args(tp))
            kw["type"] = type(get_args(tp)[0])
        elif tp is bool:
            kw["type"] = _parse_bool
            kw["metavar"] = "BOOL"
        elif get_origin(tp) in (tuple, list):
            inner = get_args(tp)[0] if get_args(tp) else str
            kw["type"] = inner
            kw["nargs"] = "*"
        elif tp in (int, float, str):
            kw["type"] = tp
        else:
            kw["type"] = str
        parser.add_argument(flag, **kw)


def dataclass_from_args(cls: type[C], ns: argparse.Namespace, *, prefix: str = "") -> C:
    """Build ``cls`` from the parsed flags added by :func:`add_dataclass_args`."""
    kw = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # C is unbounded; callers pass dataclasses
        if not f.init or f.name.startswith("_"):
            continue
        v = getattr(ns, prefix.replace("-", "_") + f.name)
        tp, _ = _unwrap_optional(hints[f.name])
        if get_origin(tp) is tuple and isinstance(v, list):
            v = tuple(v)
        kw[f.name] = v
    return cls(**kw)


def parse_config(cls: type[C], argv: Sequence[str] | None = None, *, description: str = "") -> C:
    """Parse ``argv`` into an instance of dataclass ``cls``."""
    p = argparse.ArgumentParser(description=description or (cls.__doc__ or "").strip().split("\n")[0])
    add_dataclass_args(p, cls)
    return config_or_usage_error(p, cls, p.parse_args(argv))


def config_or_usage_error(parser: argparse.ArgumentParser, cls: type[C], ns: argparse.Namespace) -> C:
    """:func:`dataclass_from_args`, with a value the config refuses (its ``__post_init__``
    raising ``ValueError``) reported as a usage error of ``parser`` (one line, exit status 2)."""
    try:
        return dataclass_from_args(cls, ns)
    except ValueError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under dataclass fields (``x: int = 1`` then ``\"\"\"doc\"\"\"``)."""
    import ast
    import inspect
    import textwrap

    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(src)
    out: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for a, b in itertools.pairwise(body):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)
        ):
            out[a.target.id] = " ".join(b.value.value.split())
    return out
