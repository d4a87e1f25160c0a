"""Local TCP ports: pick a free one, check whether one can be bound.

``$LUDIC_LAB_PORT_RANGE`` (``"20000-25999"``) keeps :func:`free_port` inside that range.
Several test workers on one machine each get a range of their own (tests/conftest.py), so a
port one of them picked but has not bound yet is never another's pick; the default range is
the operating system's (a port bound to ``0``), as for any single process.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time

PORT_RANGE_ENV = "LUDIC_LAB_PORT_RANGE"
"""Environment variable: ``"LOW-HIGH"``, the ports :func:`free_port` picks from (inclusive)."""

_HELD_S = 300.0
"""A port this process handed out is not handed out again for this long: its server may take
a while to bind it (a vLLM server binds ~20 s after it starts)."""
_handed_out: dict[int, float] = {}
_lock = threading.Lock()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_range() -> tuple[int, int] | None:
    """``$LUDIC_LAB_PORT_RANGE`` as ``(low, high)``, or None when unset."""
    spec = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not spec:
        return None
    try:
        low, high = (int(part) for part in spec.split("-"))
    except ValueError:
        raise ValueError(f"{PORT_RANGE_ENV} must look like 20000-25999, got {spec!r}") from None
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: need 1 <= low <= high <= 65535")
    return low, high


def _can_bind(host: str, port: int) -> bool:
    """Bind without SO_REUSEADDR: fails while anything (a listener, a TIME_WAIT) holds the port."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that was free a moment ago (the OS picks it; another process may
    still take it before the caller binds it). Under ``$LUDIC_LAB_PORT_RANGE`` it comes from
    that range, never one this process handed out in the last few minutes."""
    bounds = port_range()
    if bounds is None:
        with socket.socket(_family(host), socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    low, high = bounds
    count = high - low + 1
    start = secrets.randbelow(count)  # not `random`: a test may seed it, a fork copies it
    with _lock:
        now = time.monotonic()
        for i in range(count):
            port = low + (start + i) % count
            if now - _handed_out.get(port, -_HELD_S) < _HELD_S or not _can_bind(host, port):
                continue
            _handed_out[port] = now
            return port
    raise OSError(f"no free port on {host} in {PORT_RANGE_ENV}={low}-{high}")


def port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (with SO_REUSEADDR, as servers bind it)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
