"""Probes the sandbox tests share: a listener on the host's 127.0.0.1 that records the
connections it accepts, and the live processes left with a marker argument."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import psutil


def host_listener() -> tuple[socket.socket, list[Any]]:
    """A TCP listener on the host's 127.0.0.1 -> (its socket, the connections it accepted so far)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    accepted: list[Any] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(sock.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return sock, accepted


def marked_processes(marker: str, alive: bool, wait_s: float = 10.0) -> list[int]:
    """The live (not zombie) processes whose last argument is ``marker``, once some are there
    (``alive``) or none is, or ``wait_s`` passed: a shell's child may not have started yet, and a
    killed pid namespace's processes take a moment to go."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if (p.info["cmdline"] or [])[-1:] == [marker] and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p.pid)
            except psutil.Error:
                pass
        if bool(found) == alive or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
