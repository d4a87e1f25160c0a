"""Local TCP ports: pick a free one, check whether one can be bound."""

from __future__ import annotations

import socket


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that was free a moment ago (the OS picks it; another process may
    still take it before the caller binds it)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (with SO_REUSEADDR, as servers bind it)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
