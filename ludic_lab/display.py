"""Which HTML view shows a data class in a notebook: a registry, filled once by the package.

The data classes (:class:`~ludic_lab.types.Rollout`, :class:`~ludic_lab.rollouts.saw.SAWItem`,
:class:`~ludic_lab.rollouts.saw.SAWBatch`) declare ``_repr_html_`` and ask :func:`html_of`;
the views live in the lab layer and are registered by ``ludic_lab/__init__.py``
(``_register_views``), which runs before any ``ludic_lab`` module. So how an object displays
does not depend on what was imported. A class with no registered view gets ``None``, and
Jupyter falls back to its ``repr``.

Example::

    from ludic_lab.display import register_html
    register_html(MyRecord, lambda rec: f"<b>{rec.name}</b>")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Render = Callable[[Any], str]

_VIEWS: dict[str, Render] = {}


def _key(cls: type | str) -> str:
    return cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"


def register_html(cls: type | str, render: Render) -> None:
    """Show instances of ``cls`` (a class, or its ``"module.QualName"``, so the registering
    code need not import it) with ``render(obj) -> str``; replaces an earlier view."""
    _VIEWS[_key(cls)] = render


def html_of(obj: Any) -> str | None:
    """The registered view of ``obj`` (the nearest class in its MRO with one), or ``None``."""
    for cls in type(obj).__mro__:
        render = _VIEWS.get(_key(cls))
        if render is not None:
            return render(obj)
    return None
