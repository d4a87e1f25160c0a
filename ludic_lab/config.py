"""Config dataclasses -> command-line interfaces.

Every component is configured by a dataclass; the CLI is derived from it, so a flag always
means the field of the same name (``max_tokens`` -> ``--max-tokens``). Supported field
types: bool, int, float, str, Optional of those (``none`` on the command line gives None for
a non-string one), Literal choices, and tuples of scalars.

A config composes another with :func:`sub_config` (the demo's and the pipeline trainer's
``trainer: TrainerConfig``): the sub-config's fields are flags of the enclosing config under
their own names (``--lr`` sets ``trainer.lr``), and :func:`pass_down` hands it the values
the enclosing config owns itself.

A ``str`` field whose values come from a registry (the demo's ``algo``: the names of
``ludic_lab.training.PRESETS``) lists them with :func:`choices_field`; its flag then accepts
exactly those names, and ``--help`` shows them.

``--help`` shows each field's docstring as plain text (:func:`plain_text`); ``groups`` of
:func:`add_dataclass_args` orders the flags into titled sections (``ludic-lab demo``'s:
:mod:`ludic_lab.demos.cli_help`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import re
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar, get_args, get_origin

C = TypeVar("C")

_SUB = "ludic_lab.sub_config"
"""Metadata key of a :func:`sub_config` field; its value names the derived fields."""
_CHOICES = "ludic_lab.choices"
"""Metadata key of a :func:`choices_field`; its value returns the allowed values."""


def choices_field(default: Any, choices: Callable[[], Iterable[Any]], **kw: Any) -> Any:
    """A dataclass field whose flag accepts only ``choices()`` (called when the parser is
    built, so a registry such as ``PRESETS`` is read then, not copied into a hand-written
    list). The class's ``__post_init__`` checks the value itself for instances built in Python."""
    return dataclasses.field(default=default, metadata={_CHOICES: choices, **kw.pop("metadata", {})}, **kw)


def field_choices(cls: type, name: str) -> list[Any] | None:
    """The values a :func:`choices_field` of ``cls`` allows now (None for any other field)."""
    f = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    return list(f.metadata[_CHOICES]()) if f is not None and _CHOICES in f.metadata else None


def sub_config(cls: type, *, derived: Sequence[str] = (), **defaults: Any) -> Any:
    """A dataclass field holding a ``cls`` instance built with ``defaults`` (the enclosing
    config's own defaults for it). Each field of ``cls`` is a flag of the enclosing config,
    except those named in ``derived`` and those the enclosing config declares itself: the
    enclosing ``__post_init__`` sets both with :func:`pass_down`."""
    return dataclasses.field(default_factory=lambda: cls(**defaults), metadata={_SUB: tuple(derived)})


def pass_down(config: Any, name: str, **derived: Any) -> None:
    """Replace ``config.<name>`` (a :func:`sub_config` field) by a copy that takes every field
    ``config`` also declares (same name, e.g. ``seed``) from ``config``, and the ``derived``
    values (e.g. ``scoring_temperature=config.temperature``); the copy is validated anew."""
    sub = getattr(config, name)
    own = {f.name for f in dataclasses.fields(config)} - {name}
    shared = {f.name: getattr(config, f.name) for f in dataclasses.fields(sub) if f.name in own}
    setattr(config, name, dataclasses.replace(sub, **{**shared, **derived}))


def _flags(cls: type) -> list[tuple[str, dataclasses.Field[Any], Any, Any, str]]:
    """``(dest, field, type hint, default, owner)`` of every flag of ``cls``: ``owner`` is ""
    for a field of ``cls``, else the name of the sub-config field holding it."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
    own = {f.name for f in fields}
    out: list[tuple[str, dataclasses.Field[Any], Any, Any, str]] = []
    for f in fields:
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        )
        if _SUB not in f.metadata or not dataclasses.is_dataclass(default) or isinstance(default, type):
            out.append((f.name, f, hints[f.name], default, ""))
            continue
        skip = own | set(f.metadata[_SUB])
        sub_hints = typing.get_type_hints(type(default))
        for g in dataclasses.fields(default):
            tp, _ = _unwrap_optional(sub_hints[g.name])
            if g.init and g.name not in skip and not g.name.startswith("_") and get_origin(tp) is not dict:
                out.append((g.name, g, sub_hints[g.name], getattr(default, g.name), f.name))
    return out


def _none_or(tp: type) -> Any:
    def parse(s: str) -> Any:
        return None if s.strip().lower() == "none" else tp(s)

    parse.__name__ = tp.__name__  # argparse names the type in its errors
    return parse


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


def _bool_or_choices(tp: Any) -> tuple[str, ...] | None:
    """The choices of a ``bool | Literal["a", "b"]`` field (``None`` for any other type)."""
    if get_origin(tp) not in (typing.Union, types.UnionType):
        return None
    args = get_args(tp)
    lits = [a for a in args if get_origin(a) is Literal]
    if bool not in args or len(lits) != 1 or len(args) != 2:
        return None
    return tuple(str(c) for c in get_args(lits[0]))


def _parse_bool_or(choices: tuple[str, ...]) -> Callable[[str], bool | str]:
    """A flag's parser: one of ``choices`` as given, else a boolean (true/false)."""

    def parse(s: str) -> bool | str:
        if s in choices:
            return s
        try:
            return _parse_bool(s)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected true, false or one of {list(choices)}, got {s!r}") from None

    return parse


def add_dataclass_args(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    prefix: str = "",
    groups: Sequence[tuple[str, str, Sequence[str]]] = (),
) -> None:
    """Add one ``--flag`` per field of dataclass ``cls`` (defaults and help from the class, the
    help as plain text: :func:`plain_text`). A field without a default becomes a required flag.

    ``groups``: ``(title, description, field names)`` of argparse argument groups, shown in
    this order, each listing its flags in the order named; a flag no group names goes into the
    last group (a new field is never hidden). A name that is no flag of ``cls`` is a ``ValueError``.
    """
    docs: dict[str, str] = {}
    for f in dataclasses.fields(cls):  # the help of a sub-config's fields comes from its class
        if _SUB in f.metadata and f.default_factory is not dataclasses.MISSING:
            docs.update(_class_docs(type(f.default_factory())))
    docs.update(_class_docs(cls))
    flags = {flag[0]: flag for flag in _flags(cls)}
    placed: list[tuple[Any, list[str]]] = [(parser, list(flags))]
    if groups:
        unknown = [name for *_, names in groups for name in names if name not in flags]
        if unknown:
            raise ValueError(f"groups of {cls.__name__} name fields that are no flags: {', '.join(unknown)}")
        placed = [
            (parser.add_argument_group(title, description or None), list(names)) for title, description, names in groups
        ]
        named = {name for _, names in placed for name in names}
        placed[-1][1].extend(dest for dest in flags if dest not in named)
    for target, dests in placed:
        for dest in dests:
            _add_flag(target, flags[dest], docs, prefix)


def _add_flag(
    target: Any, flag: tuple[str, dataclasses.Field[Any], Any, Any, str], docs: dict[str, str], prefix: str
) -> None:
    """Add the ``--flag`` of one :func:`_flags` entry to ``target`` (a parser or an argument group)."""
    dest, f, hint, default, _ = flag
    tp, optional = _unwrap_optional(hint)
    kw: dict[str, Any] = {"dest": prefix.replace("-", "_") + dest}
    help_text = plain_text(docs.get(f.name, "")).replace("%", "%%")  # argparse formats help with %
    if default is dataclasses.MISSING:
        kw["required"] = True  # a field without a default is a required flag, never a silent None
        kw["help"] = f"{help_text} (required)".strip()
    else:
        kw["default"] = default
        kw["help"] = f"{help_text} (default: {default!r})".strip()
    if _CHOICES in f.metadata:
        kw["choices"] = list(f.metadata[_CHOICES]())
        kw["type"] = tp if tp in (int, float, str) else str
    elif get_origin(tp) is Literal:
        kw["choices"] = list(get_args(tp))
        kw["type"] = type(get_args(tp)[0])
    elif tp is bool:
        kw["type"] = _parse_bool
        kw["metavar"] = "BOOL"
    elif (choices := _bool_or_choices(tp)) is not None:  # bool | Literal[...]
        kw["type"] = _parse_bool_or(choices)
        kw["metavar"] = "{" + ",".join(("true", "false", *choices)) + "}"
    elif get_origin(tp) in (tuple, list):
        inner = get_args(tp)[0] if get_args(tp) else str
        kw["type"] = inner
        kw["nargs"] = "*"
    elif tp in (int, float):
        kw["type"] = _none_or(tp) if optional else tp
    else:
        kw["type"] = str
    target.add_argument("--" + prefix + dest.replace("_", "-"), **kw)


def plain_text(text: str) -> str:
    """``text`` (a docstring) without its reStructuredText markup, for ``--help``: a literal in
    double backquotes loses them, and a Sphinx role (class, mod, meth, ...) becomes its target
    as a reader would write it ("~a.b.C" -> C, ".x" -> x, "words <target>" -> words)."""

    def role(m: re.Match[str]) -> str:
        t = m.group(1)
        if t.endswith(">") and "<" in t:
            return t[: t.index("<")].strip()
        return t[1:].rsplit(".", 1)[-1] if t.startswith("~") else t.lstrip(".")

    text = re.sub(r":[a-z]+(?::[a-z]+)?:`([^`]+)`", role, text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def _class_docs(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):  # a subclass that changes defaults keeps its bases' help
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    return docs


def dataclass_from_args(cls: type[C], ns: argparse.Namespace, *, prefix: str = "") -> C:
    """Build ``cls`` from the parsed flags added by :func:`add_dataclass_args`."""
    kw: dict[str, Any] = {}
    subs: dict[str, dict[str, Any]] = {}
    for dest, _, hint, _, owner in _flags(cls):
        v = getattr(ns, prefix.replace("-", "_") + dest)
        if get_origin(_unwrap_optional(hint)[0]) is tuple and isinstance(v, list):
            v = tuple(v)
        (subs.setdefault(owner, {}) if owner else kw)[dest] = v
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # C is unbounded; callers pass dataclasses
        if _SUB in f.metadata:  # the sub-config's defaults, overridden by its flags
            sub = f.default_factory()  # type: ignore[operator]  # sub_config always sets a default_factory
            kw[f.name] = dataclasses.replace(sub, **subs.get(f.name, {}))
    return cls(**kw)


def parse_config(cls: type[C], argv: Sequence[str] | None = None, *, description: str = "") -> C:
    """Parse ``argv`` into an instance of dataclass ``cls``."""
    p = argparse.ArgumentParser(description=description or (cls.__doc__ or "").strip().split("\n")[0])
    add_dataclass_args(p, cls)
    return config_or_usage_error(p, cls, p.parse_args(argv))


def config_or_usage_error(
    parser: argparse.ArgumentParser,
    cls: type[C],
    ns: argparse.Namespace,
    *,
    check: Callable[[C], object] | None = None,
    reraise: bool = False,
) -> C:
    """:func:`dataclass_from_args`, then ``check(config)`` (checks that need more than the
    values, e.g. that a model folder exists); a ``ValueError`` of either is reported as a usage
    error of ``parser`` (exit status 2) whose fields are named by their flags
    (:func:`flag_message`). ``reraise``: raise it instead (the caller asked for tracebacks)."""
    try:
        config = dataclass_from_args(cls, ns)
        if check is not None:
            check(config)
        return config
    except ValueError as e:
        if reraise:
            raise
        parser.error(flag_message(cls, str(e)))
        raise  # unreachable: parser.error exits


def flag_message(cls: type, message: str) -> str:
    """``message`` with the fields of ``cls`` (and of its sub-configs) written as the flags that
    set them: ``TrainerConfig.lr must be > 0`` -> ``--lr must be > 0``, and a bare
    ``max_seq_len`` -> ``--max-seq-len``. Words in quotes (values) are left alone."""
    flags = {dest: "--" + dest.replace("_", "-") for dest, *_ in _flags(cls)}
    owners = {cls.__name__} | {
        type(f.default_factory()).__name__  # type: ignore[operator]  # sub_config always sets a default_factory
        for f in dataclasses.fields(cls)
        if _SUB in f.metadata
    }

    def qualified(m: re.Match[str]) -> str:
        return flags[m.group(2)] if m.group(1) in owners and m.group(2) in flags else m.group(0)

    def bare(m: re.Match[str]) -> str:
        return flags.get(m.group(1), m.group(0))

    message = re.sub(r"\b([A-Z]\w*)\.([a-z_]\w*)\b", qualified, message)
    return re.sub(r"(?<![\w.'\"-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b(?!['\"])", bare, message)


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
